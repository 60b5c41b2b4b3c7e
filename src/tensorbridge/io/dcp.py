"""``torch.distributed.checkpoint`` directories, read without a process group or a free unpickle.

A DCP checkpoint (``dcp.save`` with the default ``FileSystemWriter``) is a directory:

* ``.metadata`` — a pickle of ``torch.distributed.checkpoint.metadata.Metadata``: for
  each state-dict key (nested containers flattened with ``.``) either a
  ``TensorStorageMetadata`` (dtype, global shape, and the chunks the ranks stored, each
  an ``offsets`` / ``sizes`` box of the global tensor) or a ``BytesStorageMetadata``
  (any other value); and ``storage_data``, which maps each chunk (key, offsets) to a
  ``_StorageInfo``: a ``.distcp`` file name, a byte offset and a length.
* ``__R_I.distcp`` — the items, back to back. A tensor chunk is one ``torch.save``
  archive (a zip whose ``data.pkl`` rebuilds the tensor from the stored member
  ``data/<key>``); a non-tensor value is one ``torch.save`` of the value.

**Nothing is unpickled freely.** ``.metadata`` goes through tensorbridge's pickle
machine (:mod:`tensorbridge.io.pickle_machine`) with exactly the classes DCP writes
(the metadata dataclasses of torch 2.0 to 2.13, ``pathlib`` paths) admitted as inert
records, ``torch.Size`` and dtypes from its table, and any other global refused with
a :class:`~tensorbridge.errors.FormatError` before anything is called; the records
are then read field by field into a :class:`CheckpointMetadata` of plain values
(names are plain ``str``). A chunk's ``data.pkl`` and a value stored as bytes go
through the same machine: a tensor only from the storage its item holds.

**Tensor bytes are mapped, never loaded whole.** torch stores the storage member
uncompressed; its place is found from the zip's central directory and local header,
every offset and size checked against the item and the file, and the chunk is a
read-only view of the memory-mapped ``.distcp``. An item laid out otherwise (a
compressed member, a stream transform, big-endian bytes, a pickle this module does
not recognise) is read by DCP's own public ``FileSystemReader.read_data``, which
loads that chunk whole.

**Entries.** ``keys()`` lists the tensors and the non-tensor values in the
checkpoint's order. A tensor stored in one chunk is a zero-copy view; one stored in
several is assembled into new memory by ``[name]`` (``tb.save`` and ``tensorbridge
convert`` instead assemble it window by window into the output: see
:mod:`tensorbridge.io.assemble`). Plain values (``step``, learning rates, tuples of
numbers) become ``metadata`` (strings; typed in :meth:`DcpFile.plain_values`) and are
not keys; any other value (an object of a class, a tensor pickled as bytes) is a key
that :meth:`~DcpFile.unsupported` names with the reason.

>>> import os, tempfile, torch, tensorbridge as tb
>>> import torch.distributed.checkpoint as dcp
>>> d = os.path.join(tempfile.mkdtemp(), "ckpt")
>>> sd = {"w": torch.ones(2, 3), "step": 7}
>>> _ = dcp.save(sd, checkpoint_id=d, no_dist=True)
>>> with tb.open(d) as f:
...     f.keys(), f["w"].shape, f.metadata
(['w'], (2, 3), {'step': '7'})
"""

from __future__ import annotations

import contextlib
import copy
import io
import mmap
import os
import struct
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._boxes import TooIrregular, first_overlap
from .._filemap import check_same_version, identity, read_small
from .._files import Links
from .._keys import broken, no_nul, not_empty, one_file_name, valid_unicode
from .._tensorfile import TensorFile
from ..dtypes import DTypeRow, resolve_dtype
from ..errors import FormatError, TensorBridgeError, UnsupportedDtypeError
from ._detect import ZIP_ERRORS
from .pickle_machine import DICTS, Opaque, StorageRef, StorageType, TensorRef, unpickle
from .torch_archive import read_value

__all__ = ["METADATA_FILE", "Chunk", "DcpFile", "load", "open", "read_metadata"]

METADATA_FILE = ".metadata"
MAX_METADATA = 1 << 30  # a .metadata larger than this is no checkpoint's
MAX_VALUE = 64 << 20  # a non-tensor value's bytes (stored, and each item decompressed), at most
OPEN_FILES = 64  # .distcp files mapped at once (each map holds a descriptor)

# a .distcp file an item names: one file of the checkpoint's directory (tensorbridge._keys)
_FILE_NAME = (not_empty, no_nul, valid_unicode, one_file_name)

_DCP = "torch.distributed.checkpoint.metadata"
_OLD = "torch.distributed._shard.sharded_tensor.metadata"  # torch 2.0 - 2.2 pickled these
_ALLOWED = {
    (_DCP, "Metadata"),
    (_DCP, "TensorStorageMetadata"),
    (_DCP, "BytesStorageMetadata"),
    (_DCP, "ChunkStorageMetadata"),
    (_DCP, "TensorProperties"),
    (_DCP, "_MEM_FORMAT_ENCODING"),
    (_DCP, "MetadataIndex"),
    (_DCP, "StorageMeta"),
    (_OLD, "TensorProperties"),
    (_OLD, "MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "PureWindowsPath"),
}


_PLACEHOLDERS = frozenset(
    f"{module}.{name}"
    for module, name in _ALLOWED
    if module not in ("torch", "torch.serialization", "collections")
)  # DCP's classes: inert records of the pickle machine, read below field by field


@dataclass(frozen=True)
class TensorEntry:
    """A ``TensorStorageMetadata``, as plain data: dtype, global shape, stored boxes."""

    dtype: torch.dtype
    size: tuple[int, ...]
    chunks: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]  # (offsets, sizes) each


@dataclass(frozen=True)
class StoredItem:
    """A ``_StorageInfo``, as plain data: where an item's bytes lie."""

    relative_path: str
    offset: int
    length: int
    transforms: tuple[str, ...]  # stream transforms (compression): only DCP's reader undoes them

    @property
    def transformed(self) -> bool:
        return bool(self.transforms)


@dataclass(frozen=True)
class CheckpointMetadata:
    """A DCP ``Metadata``, as plain data, checked: what :class:`DcpFile` reads from.

    ``entries`` maps each state-dict key to its :class:`TensorEntry`, or ``None`` for a
    value stored as bytes; ``storage`` maps ``(key, chunk offsets or None)`` to its
    :class:`StoredItem`.
    """

    entries: dict[str, TensorEntry | None]
    storage: dict[tuple[str, tuple[int, ...] | None], StoredItem]


def read_metadata(path: str | os.PathLike[str], links: Links | None = None) -> CheckpointMetadata:
    """A DCP ``.metadata`` file, through the pickle machine, checked field by field.

    ``path`` is the checkpoint directory or its ``.metadata`` file; ``links`` confines
    it to the checkpoint's directory (default: no confinement, the caller named it).
    DCP's classes become inert records of the machine (nothing of torch's is built or
    called), read into a :class:`CheckpointMetadata` of plain values.

    Raises:
        FormatError: a global that is not DCP metadata (nothing of it is called), a
            malformed pickle, or fields of the wrong types or out of range.
    """
    p = Path(path)
    if p.is_dir():
        p = p / METADATA_FILE
    raw = read_small(p, MAX_METADATA, "DCP .metadata file", links)
    try:
        meta = unpickle(raw, placeholders=_PLACEHOLDERS)
    except FormatError as err:
        raise FormatError(
            f"{p}: refused to unpickle: {err}; tensorbridge reads only the classes "
            "torch.distributed.checkpoint writes (if you trust the file, load it with "
            "torch.distributed.checkpoint itself)"
        ) from None
    return _check_metadata(p, meta)


def _fields(obj: Any) -> dict[str, Any]:
    """A record's fields: its ``BUILD`` state (a dict, or ``(dict, slots)``)."""
    state = obj.state if isinstance(obj, Opaque) else None
    if type(state) is tuple and len(state) == 2:
        out = dict(state[0]) if type(state[0]) in DICTS else {}
        if type(state[1]) in DICTS:
            out.update(state[1])
        return out
    return dict(state) if isinstance(state, dict) else {}  # a dict or an OrderedDict


def _is(obj: Any, name: str) -> bool:
    return isinstance(obj, Opaque) and obj.args is not None and obj.name.rsplit(".", 1)[1] == name


def _check_metadata(p: Path, meta: Any) -> CheckpointMetadata:
    def bad(what: str) -> FormatError:
        return FormatError(f"{p}: {what}; the checkpoint's metadata is corrupt")

    if not _is(meta, "Metadata"):
        held = meta.name if isinstance(meta, Opaque) else type(meta).__qualname__
        raise bad(f"it holds a {held}, not a DCP Metadata")
    fields = _fields(meta)
    sdm = fields.get("state_dict_metadata")
    if not isinstance(sdm, dict):  # a dict or an OrderedDict
        raise bad("state_dict_metadata is not a dict")
    entries: dict[str, TensorEntry | None] = {}
    for key, item in sdm.items():
        if type(key) is not str:
            raise bad(f"the state-dict key {key!r:.80} is not a string")
        if _is(item, "BytesStorageMetadata"):
            entries[key] = None
            continue
        if not _is(item, "TensorStorageMetadata"):
            held = item.name if isinstance(item, Opaque) else type(item).__qualname__
            raise bad(f"{key!r} is described by a {held}")
        tsm = _fields(item)
        props = tsm.get("properties")
        state = (
            props.state if isinstance(props, Opaque) and _is(props, "TensorProperties") else None
        )
        # torch >= 2.3 pickles (dtype, layout, requires_grad, memory_format, pin_memory)
        dtype = state[0] if type(state) is tuple and state else _fields(props).get("dtype")
        if not isinstance(dtype, torch.dtype):
            raise bad(f"{key!r} has no dtype")
        shape = _ints(tsm.get("size"))
        chunks = tsm.get("chunks")
        if shape is None or type(chunks) is not list:
            raise bad(f"{key!r} has no shape or chunk list")
        boxes = []
        for c in chunks:
            box = _fields(c)
            off, size = _ints(box.get("offsets")), _ints(box.get("sizes"))
            if (
                not _is(c, "ChunkStorageMetadata")
                or off is None
                or size is None
                or len(off) != len(shape)
                or len(size) != len(shape)
                or any(o + s > n for o, s, n in zip(off, size, shape, strict=True))
            ):
                raise bad(f"a chunk of {key!r} lies outside its shape {list(shape)}")
            boxes.append((off, size))
        entries[key] = TensorEntry(dtype, shape, tuple(boxes))
    storage_data = fields.get("storage_data")
    if not isinstance(storage_data, dict):  # a dict or an OrderedDict
        raise bad("storage_data is not a dict (not written by FileSystemWriter)")
    storage: dict[tuple[str, tuple[int, ...] | None], StoredItem] = {}
    for index, info in storage_data.items():
        where, stored = _fields(index), _fields(info)
        fqn, offset = where.get("fqn"), where.get("offset")
        offsets = None if offset is None else _ints(offset)
        if (
            not _is(index, "MetadataIndex")
            or type(fqn) is not str
            or (offset is not None and offsets is None)
            or not _is(info, "_StorageInfo")
        ):
            raise bad("storage_data maps something other than MetadataIndex -> _StorageInfo")
        rel = stored.get("relative_path")
        if not _file_name(rel):
            shown = repr(rel[:80]) if type(rel) is str else f"a {type(rel).__qualname__}"
            raise bad(f"the item of {fqn!r} names the file {shown}, not one in the directory")
        start, length = stored.get("offset"), stored.get("length")
        if type(start) is not int or type(length) is not int or start < 0 or length < 0:
            raise bad(f"the item of {fqn!r} has no valid offset and length")
        transforms = stored.get("transform_descriptors") or []
        if type(transforms) not in (list, tuple) or not all(type(t) is str for t in transforms):
            raise bad(f"the item of {fqn!r} has transforms that are not names")
        storage[(fqn, offsets)] = StoredItem(str(rel), start, length, tuple(transforms))
    return CheckpointMetadata(entries, storage)


def _file_name(rel: Any) -> bool:
    """Whether ``rel`` (a plain ``str``) names a file in the checkpoint directory itself."""
    return (
        type(rel) is str
        and broken(rel, _FILE_NAME) is None
        and len(rel.encode("utf-8")) <= 255  # no longer than a file name can be
    )


def _ints(x: Any) -> tuple[int, ...] | None:
    if type(x) not in (tuple, list, torch.Size) or not all(type(v) is int and v >= 0 for v in x):
        return None
    return tuple(x)


# --- one stored chunk: a torch.save zip inside a .distcp -------------------------------------


@dataclass(frozen=True)
class _Rebuild:
    """What ``torch._utils._rebuild_tensor_v2`` / ``_v3`` would be given."""

    key: str  # the storage member: data/<key>
    dtype: torch.dtype
    storage_numel: int
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


def _chunk_tensor(data: bytes) -> _Rebuild:
    """What a chunk's ``data.pkl`` rebuilds: one plain tensor, through the pickle machine."""

    def persistent_load(pid: Any) -> StorageRef:
        if (
            type(pid) is tuple
            and len(pid) == 5
            and pid[0] == "storage"
            and isinstance(pid[1], StorageType)
            and type(pid[2]) is str
            and type(pid[4]) is int
            and 0 <= pid[4] < 1 << 62
        ):
            return StorageRef(pid[2], pid[1].dtype, pid[4])
        raise FormatError("a persistent id that names no storage")

    t = unpickle(data, persistent_load=persistent_load, placeholders=False)
    if not isinstance(t, TensorRef):
        raise FormatError(f"the item's data.pkl holds a {type(t).__name__}, not one tensor")
    return _Rebuild(t.storage.key, t.dtype, t.storage_numel, t.offset, t.shape, t.stride)


class _Slice(io.RawIOBase):
    """``[start, start + length)`` of a mapped file as a seekable read-only stream."""

    def __init__(self, buf: Any, start: int, length: int) -> None:
        super().__init__()
        self.buf, self.start, self.length, self.pos = buf, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        base = (0, self.pos, self.length)[whence]
        self.pos = max(0, base + pos)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, size: int | None = -1) -> bytes:
        # RawIOBase.read(n) allocates n bytes first: a zip member's size from the file
        # (1 GiB in a 4 KB item) would be allocated whole, whatever is there to read
        left = max(0, self.length - self.pos)
        n = left if size is None or size < 0 else min(size, left)
        lo = self.start + self.pos
        self.pos += n
        return bytes(self.buf[lo : lo + n])

    def readinto(self, b: Any) -> int:
        n = max(0, min(len(b), self.length - self.pos))
        lo = self.start + self.pos
        b[:n] = self.buf[lo : lo + n]
        self.pos += n
        return n


_LOCAL = struct.Struct("<4s5H3L2H")  # a zip local file header (30 bytes)


class _Unrecognised(Exception):
    """An item laid out in a way this module does not map: DCP's reader reads it."""


def _locate(buf: Any, start: int, length: int, where: str) -> tuple[_Rebuild, int, int]:
    """The tensor a ``torch.save`` zip at ``[start, start + length)`` rebuilds, and where
    (absolute offset, byte count) its uncompressed storage member lies."""
    try:
        with zipfile.ZipFile(_Slice(buf, start, length)) as zf:
            infos = {i.filename: i for i in zf.infolist()}
            pkl = [n for n in infos if n.endswith("/data.pkl")]
            if len(pkl) != 1:
                raise _Unrecognised("no single data.pkl")
            prefix = pkl[0][: -len("data.pkl")]
            order = infos.get(prefix + "byteorder")
            if order is not None and _member(zf, order, 16) != b"little":
                raise _Unrecognised("big-endian storage")
            data_pkl = _member(zf, infos[pkl[0]], MAX_VALUE)
            if data_pkl is None:
                raise _Unrecognised("a data.pkl too large for one tensor")
            rebuilt = _chunk_tensor(data_pkl)
    except (*ZIP_ERRORS, zipfile.LargeZipFile, RuntimeError, KeyError) as err:
        # a bad CRC, a truncated directory, a method zipfile lacks (NotImplementedError),
        # an encrypted member (RuntimeError), a name that is no UTF-8 (UnicodeDecodeError)
        raise FormatError(
            f"{where}: the stored tensor is not a valid torch.save zip "
            f"({type(err).__name__}: {err})"
        ) from None
    except FormatError as err:
        raise FormatError(f"{where}: the stored tensor's pickle is refused: {err}") from None
    info = infos.get(f"{prefix}data/{rebuilt.key}")
    if info is None:
        raise FormatError(f"{where}: the storage member data/{rebuilt.key} is missing")
    if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
        raise _Unrecognised("a compressed storage member")
    if info.header_offset < 0 or info.header_offset + _LOCAL.size > length:
        raise FormatError(f"{where}: a zip local header lies past the item's {length} bytes")
    head = _LOCAL.unpack(bytes(buf[start + info.header_offset : start + info.header_offset + 30]))
    name_len, extra_len = head[9], head[10]
    data = info.header_offset + _LOCAL.size + name_len + extra_len
    name_at = start + info.header_offset + _LOCAL.size
    if (
        head[0] != b"PK\x03\x04"
        or bytes(buf[name_at : name_at + name_len]) != info.filename.encode()
    ):
        raise FormatError(f"{where}: the zip local header of {info.filename} is corrupt")
    if data + info.file_size > length:
        raise FormatError(
            f"{where}: the storage member's bytes {data}..{data + info.file_size} run past the "
            f"item's {length} bytes; the file is truncated or corrupt"
        )
    itemsize = torch.empty((), dtype=rebuilt.dtype).element_size()
    if rebuilt.storage_numel * itemsize != info.file_size:
        raise FormatError(
            f"{where}: the storage holds {info.file_size} bytes, not {rebuilt.storage_numel} "
            f"{rebuilt.dtype} values"
        )
    last = rebuilt.offset + sum(
        (n - 1) * s for n, s in zip(rebuilt.shape, rebuilt.stride, strict=True)
    )
    if 0 not in rebuilt.shape and last >= rebuilt.storage_numel:
        raise FormatError(f"{where}: the tensor's view runs past its storage")
    return rebuilt, start + data, info.file_size


def _member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int) -> bytes | None:
    """A zip member's bytes, read in pieces up to ``limit``; None past it.

    Neither the member's declared size nor its compression ratio is trusted: a deflated
    member of 1 MB may claim, or hold, 1 GiB.
    """
    if info.file_size > limit:
        return None
    out = bytearray()
    with zf.open(info) as f:
        while piece := f.read(min(1 << 20, limit + 1 - len(out))):
            out += piece
            if len(out) > limit:
                return None
    return bytes(out)


def _inflates_within(raw: bytes, limit: int) -> bool:
    """Whether the members of the zip ``raw`` decompress to at most ``limit`` bytes in all
    (read, in pieces, not taken from their headers). Not a zip: its bytes are its size."""
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as zf:
            left = limit
            for info in zf.infolist():
                data = _member(zf, info, left)
                if data is None:
                    return False
                left -= len(data)
    except (*ZIP_ERRORS, OSError):
        return True  # no zip (a legacy torch.save: stored as is), or one torch.load refuses
    return True


# --- the reader --------------------------------------------------------------------------------


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
        """Refuse a view of a file truncated since it was mapped (SIGBUS: see _filemap)."""
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
        self._layout: dict[tuple[str, tuple[int, ...]], tuple[_Rebuild, int] | None] = {}
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
                rebuilt, start, _ = _locate(mapped.map, chunk.item_offset, chunk.item_length, where)
                self._layout[key] = (rebuilt, start)
            except _Unrecognised:
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
        from ..convert import to_numpy

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
        if not _inflates_within(raw, MAX_VALUE):  # a deflated data.pkl of 1 GiB fits in 1 MB
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
