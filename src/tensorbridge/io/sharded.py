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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..dtypes import DTypeRow
from ..errors import FormatError
from ._common import TensorFile, check_same_version, identity
from ._safetensors_header import read_index, short

__all__ = ["ShardedFile"]

_ATTEMPTS = 3  # opens of an index that saves keep replacing, before giving up


class ShardedFile(TensorFile):
    """A shard index and its shards, read as one file; ``metadata`` is the first shard's."""

    def __init__(self, index: str | os.PathLike[str], opener: Callable[[Path], TensorFile]) -> None:
        super().__init__()
        self.path = Path(index)
        for attempt in range(_ATTEMPTS):
            opened = identity(os.stat(self.path))
            self._open(opener)
            try:  # the shards are the index's: no save committed while they were opened
                check_same_version(self.path, opened, self.path)
                break
            except FormatError:
                self.close()
                if attempt == _ATTEMPTS - 1:
                    raise
        self.metadata = dict(self._shards[0].metadata) if self._shards else {}
        self._restore_ties(self._where)  # ties whose kept name is in another shard

    def _open(self, opener: Callable[[Path], TensorFile]) -> None:
        """Open every shard the index names (each reader keeps its file open)."""
        weight_map = read_index(self.path)
        self._shards: list[TensorFile] = []
        self._where: dict[str, TensorFile] = {}
        self._file: dict[int, str] = {}
        try:
            for file in sorted(set(weight_map.values())):
                shard_path = self.path.parent / file
                if not shard_path.is_file():
                    raise FormatError(
                        f"{self.path}: the index names the shard {file}, which is not in "
                        f"{self.path.parent}; the download is incomplete"
                    )
                shard = opener(shard_path)
                self._shards.append(shard)
                self._file[id(shard)] = file
                self.notes.extend(n for n in shard.notes if n not in self.notes)
                for name in shard:
                    if weight_map.get(name) == file:
                        self._where[name] = shard
                    elif name in shard.aliases and name not in weight_map:  # a tie, kept here
                        self._where[name] = shard
                        self.aliases[name] = shard.aliases[name]
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

    def keys(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def _shard(self, name: str) -> TensorFile:
        try:
            return self._where[name]
        except KeyError:
            keys = self.keys()[:10]
            raise KeyError(f"{name!r} is not in {self.path}; its keys are {keys}") from None

    def shard_of(self, name: str) -> str:
        """The file name of the shard holding ``name``."""
        return self._file[id(self._shard(name))]

    def info(self, name: str) -> tuple[DTypeRow, tuple[int, ...]]:
        return self._shard(name).info(name)

    def unsupported(self) -> dict[str, str]:
        return {k: v for s in self._shards for k, v in s.unsupported().items() if k in self}

    def nbytes(self, name: str) -> int:
        return self._shard(name).nbytes(name)

    def _array(self, name: str, *, copy_on_write: bool) -> np.ndarray:
        return self._shard(name)._array(name, copy_on_write=copy_on_write)

    def get(self, name: str, **options: Any) -> Any:
        """``name`` read by its shard's reader, with the options of :meth:`TensorFile.get`."""
        return self._shard(name).get(name, **options)

    def close(self) -> None:
        for shard in self._shards:
            shard.close()

    def __repr__(self) -> str:
        return f"<ShardedFile {str(self.path)!r}: {len(self._shards)} shards>"
