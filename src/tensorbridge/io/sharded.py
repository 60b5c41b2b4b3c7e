"""Sharded checkpoints: a JSON index naming, for each tensor, the shard file that holds it.

The Hugging Face layout, in either serialization: ``model.safetensors.index.json`` with
``model-00001-of-00002.safetensors`` shards, or ``pytorch_model.bin.index.json`` with
``pytorch_model-00001-of-00002.bin`` shards (``torch.save`` archives). The index is
``{"metadata": {...}, "weight_map": {name: shard file}}``; every shard file must lie in
the index's directory, exist, and hold each tensor the index assigns to it.

Each shard is opened by whatever reader its bytes call for (so a ``.bin`` index of
safetensors shards reads too), and ``[name]`` / ``get`` go to the shard that holds the
name: nothing is read until asked, and a shard's tensors keep their reader's rules
(memory-mapped, read-only NumPy views, copy-on-write torch tensors).

Every shard is opened when the index is, and the index is checked to be the same
file afterwards (else opened again): a save that commits a new version later (a new
index first, then new files under the shards' names) changes nothing this handle
reads.

>>> import os, tempfile, torch, tensorbridge as tb
>>> d = tempfile.mkdtemp()
>>> tb.save({"a": torch.zeros(4), "b": torch.ones(4)}, d, max_shard_size=16)
>>> with tb.open(d) as f:
...     type(f).__name__, f.keys(), f.shard_of("b")
('ShardedFile', ['a', 'b'], 'model-00002-of-00002.safetensors')
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .._filemap import check_same_version, identity
from .._files import Links
from .._tensorfile import StoredBits, TensorFile
from ..dtypes import DTypeRow
from ..errors import FormatError
from .safetensors_header import read_index, short

__all__ = ["ShardedFile"]

_ATTEMPTS = 3  # opens of an index that saves keep replacing, before giving up


# Shards held open at once. A shard holds a descriptor (and one per map it has made), so
# a checkpoint of thousands of shards would run out of them (``ulimit -n`` is often
# 1024); the least recently used shard is closed, and opened again when next asked.
OPEN_SHARDS = 64


class ShardedFile(TensorFile):
    """A shard index and its shards, read as one file; ``metadata`` is the first shard's.

    At most :data:`OPEN_SHARDS` shards are open at a time (least recently used first
    closed). A shard opened again must be the file first opened (device, inode, size
    and modification time): one that was replaced meanwhile raises
    :class:`~tensorbridge.errors.FormatError` rather than mixing two versions.
    Arrays already handed out keep their own mapping.
    """

    def __init__(
        self,
        index: str | os.PathLike[str],
        opener: Callable[[Path], TensorFile],
        links: Links | None = None,
    ) -> None:
        """``links``: where the shards may lie (default: the index's directory, links
        leading out of it refused)."""
        super().__init__()
        self.path = Path(index)
        links = links or Links.of(self.path)
        self.follow_links = links.follow
        self._links = links
        self._opener = opener
        for attempt in range(_ATTEMPTS):
            opened = identity(os.stat(self.path))
            self._scan()
            try:  # the shards are the index's: no save committed while they were opened
                check_same_version(self.path, opened, self.path)
                break
            except FormatError:
                self.close()
                if attempt == _ATTEMPTS - 1:
                    raise
        self._restore_ties(self._where)  # ties whose kept name is in another shard
        for name, kept in self.aliases.items():
            if name not in self._info and kept in self._info:
                self._info[name] = self._info[kept]

    def _scan(self) -> None:
        """Read the index and every shard's entries; each shard is opened once here, and
        the identity of its file kept (a shard opened again later must be that file)."""
        links = self._links
        weight_map = read_index(self.path)
        self._open: OrderedDict[str, TensorFile] = OrderedDict()  # file -> shard, LRU first
        self._identity: dict[str, tuple[int, ...]] = {}
        self._files: list[str] = []
        self._where: dict[str, str] = {}  # tensor name -> the file of its shard
        self._info: dict[str, tuple[DTypeRow, tuple[int, ...]]] = {}
        self._unsupported: dict[str, str] = {}
        self.metadata = {}
        try:
            for file in sorted(set(weight_map.values())):
                shard_path = self.path.parent / file
                if not shard_path.exists():
                    raise FormatError(
                        f"{self.path}: the index names the shard {file}, which is not in "
                        f"{self.path.parent}; the download is incomplete"
                    )
                links.check(shard_path)  # its reader refuses anything but a regular file
                shard = self._shard_file(file)
                if not self._files:
                    self.metadata = dict(shard.metadata)
                self._files.append(file)
                self.notes.extend(n for n in shard.notes if n not in self.notes)
                skipped = shard.unsupported()
                for name in shard:
                    if weight_map.get(name) == file:
                        self._where[name] = file
                    elif name in shard.aliases and name not in weight_map:  # a tie, kept here
                        self._where[name] = file
                        self.aliases[name] = shard.aliases[name]
                    else:
                        continue
                    if name in skipped:
                        self._unsupported[name] = skipped[name]
                    else:
                        self._info[name] = shard.info(name)
            missing = [name for name in weight_map if name not in self._where]
            if missing:
                raise FormatError(
                    f"{self.path}: tensor {short(missing[0])} is not in "
                    f"{weight_map[missing[0]]}, the shard the index names ({len(missing)} such "
                    "tensors)"
                )
        except BaseException:
            self.close()
            raise

    def _shard_file(self, file: str) -> TensorFile:
        """The open shard ``file``: opened (again) when it is not, the oldest closed."""
        shard = self._open.get(file)
        if shard is not None:
            self._open.move_to_end(file)
            return shard
        while len(self._open) >= OPEN_SHARDS:
            self._open.popitem(last=False)[1].close()
        path = self.path.parent / file
        self._links.check(path)
        before = _identity(path)
        if self._identity.setdefault(file, before) != before:
            raise FormatError(
                f"{path} was replaced or changed since {self.path} was opened; open the "
                "checkpoint again"
            )
        shard = self._opener(path)
        self._open[file] = shard
        return shard

    def keys(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def _shard(self, name: str) -> TensorFile:
        try:
            file = self._where[name]
        except KeyError:
            keys = self.keys()[:10]
            raise KeyError(f"{name!r} is not in {self.path}; its keys are {keys}") from None
        return self._shard_file(file)

    def shard_of(self, name: str) -> str:
        """The file name of the shard holding ``name``."""
        self._shard(name)  # the KeyError of an unknown name
        return self._where[name]

    def info(self, name: str) -> tuple[DTypeRow, tuple[int, ...]]:
        found = self._info.get(name)
        return found if found is not None else self._shard(name).info(name)

    def unsupported(self) -> dict[str, str]:
        return dict(self._unsupported)

    def nbytes(self, name: str) -> int:
        return self._shard(name).nbytes(name)

    def _array(self, name: str, *, copy_on_write: bool) -> np.ndarray:
        return self._shard(name)._array(name, copy_on_write=copy_on_write)

    def stored_bits(self, name: str) -> StoredBits | None:
        return self._shard(name).stored_bits(name)

    def get(self, name: str, **options: Any) -> Any:
        """``name`` read by its shard's reader, with the options of :meth:`TensorFile.get`."""
        return self._shard(name).get(name, **options)

    def close(self) -> None:
        while self._open:
            self._open.popitem(last=False)[1].close()

    def __repr__(self) -> str:
        return f"<ShardedFile {str(self.path)!r}: {len(self._files)} shards>"


def _identity(path: Path) -> tuple[int, ...]:
    """What tells a file from another put under its name: device, inode, size, mtime."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
