"""Reading a DCP checkpoint directory: :class:`DcpFile`, lazily, without a process group.

The checkpoint's ``.metadata`` is read by :mod:`.metadata`, each chunk's item located
by :mod:`.items`; this module maps the ``.distcp`` files (a few at a time, each checked
to be the version opened), hands out chunks as read-only views, assembles tensors
stored in several chunks, and reads plain values into ``metadata``. What the reader
promises is in :mod:`tensorbridge.io.dcp`.
"""

from __future__ import annotations

import contextlib
import copy
import mmap
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..._boxes import TooIrregular, first_overlap
from ..._filemap import check_same_version, identity
from ..._files import Links
from ..._tensorfile import TensorFile
from ...dtypes import DTypeRow, resolve_dtype
from ...errors import FormatError, TensorBridgeError, UnsupportedDtypeError
from ..pickle_machine import DICTS, Opaque, TensorRef
from ..torch_archive import read_value
from .items import MAX_VALUE, Rebuild, Unrecognised, inflates_within, locate
from .metadata import METADATA_FILE, CheckpointMetadata, StoredItem, read_metadata

__all__ = ["OPEN_FILES", "Chunk", "DcpFile", "load", "open"]

OPEN_FILES = 64  # .distcp files mapped at once (each map holds a descriptor)


@dataclass(frozen=True)
class Chunk:
    """One stored box of a global tensor: where it sits, and how to read its values.

    ``offsets`` / ``shape`` place it in the global tensor; :meth:`DcpFile.chunk_array`
    gives its values (a read-only view of the mapped ``.distcp`` where the layout is
    recognised).
    """

    offsets: tuple[int, ...]
    shape: tuple[int, ...]
    file: str  # the .distcp file's name
    item_offset: int
    item_length: int


class _Mapped:
    """A ``.distcp`` file, mapped read-only once and shared by every chunk in it."""

    def __init__(self, path: Path, links: Links) -> None:
        self.path = path
        with links.open(path) as f:  # a regular file in the checkpoint
            st = os.fstat(f.fileno())
            self.size, self.version = st.st_size, identity(st)
            self.map: Any = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if self.size else b""

    def check_unchanged(self) -> None:
        """Refuse a view of a file truncated since it was mapped (SIGBUS: see _common)."""
        now = self.map.size() if isinstance(self.map, mmap.mmap) else 0  # the mapped file's
        if now != self.size:
            raise FormatError(
                f"{self.path} changed size since it was opened ({self.size} -> {now} bytes): "
                "another process is writing it; open it again once that write is complete"
            )

    def close(self) -> None:
        if isinstance(self.map, mmap.mmap):
            with contextlib.suppress(BufferError):  # arrays handed out keep it open
                self.map.close()


class DcpFile(TensorFile):
    """A ``torch.distributed.checkpoint`` directory, read lazily without a process group.

    ``[name]`` is the global tensor as a read-only NumPy array (a view of the mapped
    file when one chunk holds it, else assembled into new memory); :meth:`chunks`
    lists its stored boxes, which :mod:`tensorbridge.io.assemble` writes window by
    window into a converted file.
    """

    chunked = True

    def __init__(self, path: str | os.PathLike[str], *, follow_links: bool = False) -> None:
        """``follow_links``: read ``.distcp`` files that are links out of the directory."""
        super().__init__()
        p = Path(path)
        self.path = p if p.is_dir() else p.parent
        self.follow_links = follow_links
        self._links = Links.of(self.path, follow=follow_links)
        # the directory's .metadata (confined), or a metadata file the caller named, by any name
        named = not p.is_dir()
        self._meta = read_metadata(
            p if named else self.path / METADATA_FILE, None if named else self._links
        )
        self._files: OrderedDict[str, _Mapped] = OrderedDict()  # least recently used first
        self._versions = _versions(self.path, self._meta)  # each data file as opened
        self._tensors: dict[str, Any] = {}
        self._values: dict[str, Any] = {}
        self._skipped: dict[str, str] = {}
        self._layout: dict[tuple[str, tuple[int, ...]], tuple[Rebuild, int] | None] = {}
        self._order: list[str] = []
        self._owner = True
        try:
            for key, item in self._meta.entries.items():
                if item is not None:
                    self._tensors[key] = item
                    self._order.append(key)
                else:
                    self._read_value(key)
        except BaseException:
            self.close()
            raise
        self.metadata = {k: str(v) for k, v in self._values.items()}
        if self._skipped:
            self.notes.append(
                f"{len(self._skipped)} non-tensor value(s) are neither tensors nor plain "
                f"values ({', '.join(list(self._skipped)[:3])}); they are listed as "
                "unsupported and never unpickled freely"
            )

    # -- the TensorFile interface --

    def keys(self) -> list[str]:
        return list(self._order)

    def __contains__(self, name: object) -> bool:
        return name in self._tensors or name in self._skipped

    def info(self, name: str) -> tuple[DTypeRow, tuple[int, ...]]:
        if name in self._skipped:
            raise UnsupportedDtypeError(self._skipped[name])
        item = self._item(name)
        try:
            row = resolve_dtype(item.dtype)
        except TensorBridgeError as err:
            raise UnsupportedDtypeError(f"{name!r}: {err}") from None
        return row, item.size

    def plain_values(self) -> dict[str, Any]:
        return dict(self._values)

    def select(self, names: list[str]) -> DcpFile:
        """A view of this checkpoint with only ``names`` (in that order); shares its files.

        >>> import os, tempfile, torch, torch.distributed.checkpoint as dcp
        >>> d = os.path.join(tempfile.mkdtemp(), "ckpt")
        >>> _ = dcp.save({"a": torch.ones(1), "b": torch.ones(1)}, checkpoint_id=d, no_dist=True)
        >>> DcpFile(d).select(["b"]).keys()
        ['b']
        """
        missing = [n for n in names if n not in self]
        if missing:
            raise KeyError(f"{missing[0]!r} is not in {self.path}; its keys are {self.keys()[:10]}")
        view = copy.copy(self)
        view._order = list(names)
        view._tensors = {n: self._tensors[n] for n in names if n in self._tensors}
        view._skipped = {n: self._skipped[n] for n in names if n in self._skipped}
        view._owner = False
        return view

    def chunks(self, name: str) -> list[Chunk]:
        """The stored boxes of tensor ``name``, in the checkpoint's order.

        Raises:
            FormatError: the chunks do not tile the tensor exactly (a gap or an overlap),
                or one has no stored item.
        """
        item = self._item(name)
        shape = item.size
        out = []
        for offsets, sizes in item.chunks:
            info = self._storage(name, offsets)
            out.append(Chunk(offsets, sizes, info.relative_path, info.offset, info.length))
        covered = sum(int(np.prod(c.shape, dtype=np.int64)) for c in out)
        total = int(np.prod(shape, dtype=np.int64))
        if covered != total or not _disjoint(out):
            raise FormatError(
                f"{self.path}: the {len(out)} stored chunks of {name!r} do not tile its shape "
                f"{list(shape)} exactly (they cover {covered} of {total} elements); the "
                "checkpoint is incomplete or corrupt"
            )
        return out

    def chunk_array(self, name: str, chunk: Chunk) -> np.ndarray:
        """The values of one stored chunk: a read-only view of the mapped file where the
        layout is recognised, else read whole by DCP's ``FileSystemReader``."""
        row, _ = self.info(name)
        if 0 in chunk.shape:
            return np.empty(chunk.shape, row.numpy)
        mapped = self._file(chunk.file)
        where = f"{mapped.path}: tensor {name!r} at offset {chunk.item_offset}"
        mapped.check_unchanged()
        if chunk.item_offset + chunk.item_length > mapped.size:
            raise FormatError(
                f"{where}: the item's bytes run past the file's {mapped.size} bytes; the file is "
                "truncated or corrupt"
            )
        key = (name, chunk.offsets)
        if key not in self._layout:
            try:
                rebuilt, start, _ = locate(mapped.map, chunk.item_offset, chunk.item_length, where)
                self._layout[key] = (rebuilt, start)
            except Unrecognised:
                self._layout[key] = None
        found = self._layout[key]
        if found is None:
            return self._fallback(name, chunk, row)
        rebuilt, start = found
        if rebuilt.dtype != row.torch or rebuilt.shape != chunk.shape:
            raise FormatError(
                f"{where}: the stored tensor is {rebuilt.dtype} {list(rebuilt.shape)}, the "
                f"metadata says {row.torch} {list(chunk.shape)}"
            )
        flat = np.frombuffer(
            mapped.map, row.carrier_numpy, count=rebuilt.storage_numel, offset=start
        )
        it = row.itemsize
        view = np.lib.stride_tricks.as_strided(  # on the carrier: ml_dtypes have no typestr
            flat[rebuilt.offset :],
            shape=rebuilt.shape,
            strides=tuple(s * it for s in rebuilt.stride),
            writeable=False,
        )
        return view.view(row.numpy)

    def _fallback(self, name: str, chunk: Chunk, row: DTypeRow) -> np.ndarray:
        from torch.distributed.checkpoint.filesystem import FileSystemReader
        from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex
        from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

        target = torch.empty(chunk.shape, dtype=row.torch)
        zeros = torch.Size([0] * len(chunk.shape))
        index = MetadataIndex(name, torch.Size(chunk.offsets))
        plan = LoadPlan(
            [ReadItem(LoadItemType.TENSOR, index, zeros, index, zeros, torch.Size(chunk.shape))]
        )

        class _Into:  # the planner calls read_data makes for one tensor item
            def resolve_tensor(self, req: Any) -> torch.Tensor:
                return target

            def commit_tensor(self, req: Any, tensor: torch.Tensor) -> None:
                pass

        # DCP's own record, built here from the checked plain values (nothing unpickled):
        # its reader takes no other type, and torch offers no public constructor of it
        import torch.distributed.checkpoint.filesystem as dcp_files

        stored = self._storage(name, chunk.offsets)
        info = dcp_files._StorageInfo(stored.relative_path, stored.offset, stored.length)
        if stored.transforms:  # a field of torch >= 2.6 only, where transforms exist
            info.transform_descriptors = list(stored.transforms)
        reader = FileSystemReader(self.path)
        reader.set_up_storage_reader(Metadata({}, storage_data={index: info}), True)
        try:
            reader.read_data(plan, _Into()).wait()  # type: ignore[arg-type]
        except Exception as err:
            self._check_version(chunk.file)  # a file replaced while read is no corrupt one
            raise FormatError(
                f"{self.path}: tensor {name!r}: DCP's reader failed on a chunk ({err})"
            ) from None
        self._check_version(chunk.file)  # DCP's reader opened the file by its path
        from ...convert import to_numpy

        out: np.ndarray = to_numpy(target)
        out.flags.writeable = False
        return out

    def _array(self, name: str, *, copy_on_write: bool) -> np.ndarray:
        row, shape = self.info(name)
        chunks = self.chunks(name)
        if len(chunks) == 1 and chunks[0].shape == shape:
            a = self.chunk_array(name, chunks[0])
            return np.array(a) if copy_on_write else a
        out = np.empty(shape, row.numpy)
        for c in chunks:
            box = tuple(slice(o, o + n) for o, n in zip(c.offsets, c.shape, strict=True))
            np.copyto(out[box], self.chunk_array(name, c))
        if not copy_on_write:
            out.flags.writeable = False
        return out

    def _owned(self, name: str) -> np.ndarray:
        return np.array(self._array(name, copy_on_write=False), copy=True)

    def close(self) -> None:
        if self._owner:  # a select() view leaves the files to the checkpoint it came from
            for f in self._files.values():
                f.close()
            self._files.clear()

    def __repr__(self) -> str:
        return f"<DcpFile {str(self.path)!r}: {len(self._tensors)} tensors>"

    # -- internals --

    def _item(self, name: str) -> Any:
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError(
                f"{name!r} is not a tensor of {self.path}; its keys are {self.keys()[:10]}"
            ) from None

    def _storage(self, name: str, offsets: tuple[int, ...] | None) -> StoredItem:
        info = self._meta.storage.get((name, offsets))
        if info is None:
            raise FormatError(f"{self.path}: no stored item for {name!r} at {offsets}; corrupt")
        if info.transformed:
            # stream transforms (compression): only DCP's reader can undo them
            self._layout[(name, offsets or ())] = None
        return info

    def _file(self, name: str) -> _Mapped:
        """The mapped ``.distcp`` file ``name``; at most :data:`OPEN_FILES` stay mapped (a
        map holds a descriptor), and one mapped again must be the file first mapped."""
        f = self._files.get(name)
        if f is not None:
            self._files.move_to_end(name)
            return f
        p = self.path / name
        if not os.path.lexists(p):
            raise FormatError(
                f"{self.path}: the metadata names {name}, which is missing; the checkpoint "
                "is incomplete"
            )
        while len(self._files) >= OPEN_FILES:  # arrays handed out keep their own map
            self._files.popitem(last=False)[1].close()
        f = _Mapped(p, self._links)
        if self._versions.get(name, f.version) != f.version:
            f.close()
            self._check_version(name)  # raises
        self._files[name] = f
        return f

    def file_versions(self) -> dict[str, tuple[int, ...]]:
        """Each data file's device, inode, size and modification time when this checkpoint
        was opened: a process reopening it by path checks it reads the same version."""
        return dict(self._versions)

    def _check_version(self, name: str) -> None:
        """Refuse a data file that is not the one there when the checkpoint was opened.

        Data files are mapped when first read, not at open (a checkpoint may have
        thousands); one that another save replaced since (a new file, or the same one
        rewritten) belongs to another version, which this handle never mixes in.
        """
        if name in self._versions:
            check_same_version(self.path / name, self._versions[name], self.path / name)

    def _read_value(self, key: str) -> None:
        """A non-tensor entry: a plain value into metadata, anything else reported."""
        info = self._storage(key, None)
        mapped = self._file(info.relative_path)
        if info.offset + info.length > mapped.size:
            raise FormatError(
                f"{mapped.path}: the value {key!r} at bytes {info.offset}.."
                f"{info.offset + info.length} runs past the file's {mapped.size} bytes;"
                " the file is truncated or corrupt"
            )
        if info.transformed or info.length > MAX_VALUE:
            self._skip(key, "stored transformed or too large to read as a plain value")
            return
        raw = bytes(mapped.map[info.offset : info.offset + info.length])
        if not inflates_within(raw, MAX_VALUE):  # a deflated data.pkl of 1 GiB fits in 1 MB
            self._skip(
                key, f"over {MAX_VALUE >> 20} MiB once decompressed, past the limit of a value"
            )
            return
        try:
            value = read_value(raw, f"the value {key!r}")
        except FormatError as err:
            self._skip(key, f"refused by the pickle machine ({str(err)[:160]})")
            return
        if _plain(value):
            self._values[key] = value
        else:
            kind = value.name if isinstance(value, Opaque) else type(value).__qualname__
            kind = "tensor pickled as bytes" if isinstance(value, TensorRef) else kind
            self._skip(key, f"a {kind}, neither a tensor nor a plain value")

    def _skip(self, key: str, why: str) -> None:
        self._skipped[key] = (
            f"the checkpoint's value {key!r} is {why} (never unpickled freely; "
            "torch.distributed.checkpoint reads it where its code is available)"
        )
        self._order.append(key)


def _versions(path: Path, meta: CheckpointMetadata) -> dict[str, tuple[int, ...]]:
    """Each data file's :func:`identity` when the checkpoint is opened (see ``_file``)."""
    out: dict[str, tuple[int, ...]] = {}
    for info in meta.storage.values():
        rel = info.relative_path  # a plain str, checked to name one file of the directory
        if rel not in out:
            with contextlib.suppress(OSError, ValueError):
                out[rel] = identity(os.stat(path / rel))
    return out


def _plain(v: Any) -> bool:
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    if type(v) in (list, tuple):
        return all(_plain(x) for x in v)
    if type(v) in DICTS:
        return all(isinstance(k, str) and _plain(x) for k, x in v.items())
    return False


def _disjoint(chunks: list[Chunk]) -> bool:
    """No two non-empty boxes overlap (with the element count, they then tile the shape).

    O(N log N) in the chunk count (:func:`tensorbridge._boxes.first_overlap`).

    Raises:
        FormatError: chunks split along three or more dimensions in no grid, too many to
            check (see :data:`tensorbridge._boxes.MAX_WORK`).
    """
    boxes = [(c.offsets, c.shape) for c in chunks if 0 not in c.shape]
    try:
        return first_overlap(boxes) is None
    except TooIrregular as err:
        raise FormatError(
            f"{err}: too many chunks to check that they tile the tensor; the checkpoint is "
            "corrupt or was saved from an unusual placement (read it with "
            "torch.distributed.checkpoint)"
        ) from None


def open(path: str | os.PathLike[str], *, follow_links: bool = False) -> DcpFile:
    """Open a DCP checkpoint directory (or its ``.metadata``) lazily.

    A ``.metadata`` or ``.distcp`` file that is a link leading out of the directory
    raises :class:`~tensorbridge.errors.LinkError` unless ``follow_links=True``.
    """
    return DcpFile(path, follow_links=follow_links)


def load(path: str | os.PathLike[str], **options: Any) -> Any:
    """Every tensor of a DCP checkpoint, as :meth:`TensorFile.read` gives them."""
    with open(path) as f:
        skipped = f.unsupported()
        return f.read([k for k in f if k not in skipped], **options)
