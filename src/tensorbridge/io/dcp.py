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

**Nothing is unpickled freely.** ``.metadata`` goes through an unpickler that knows
exactly the classes DCP writes (the metadata dataclasses of torch 2.0 to 2.13,
``torch.Size``, dtypes, ``pathlib`` paths) and refuses any other global with a
:class:`~tensorbridge.errors.FormatError` before anything is called; the result is then
checked field by field. A chunk's ``data.pkl`` goes through a second unpickler that
only records what ``torch._utils._rebuild_tensor_v2`` / ``_v3`` would be given. Values
stored as bytes go through ``torch.load(weights_only=True)``.

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
not keys; any other value (an object ``weights_only`` refuses, a tensor pickled as
bytes) is a key that :meth:`~DcpFile.unsupported` names with the reason.

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
import pickle
import struct
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from ..dtypes import DTypeRow, resolve_dtype
from ..errors import FormatError, TensorBridgeError, UnsupportedDtypeError
from ._common import TensorFile, check_same_version, identity, read_small

__all__ = ["METADATA_FILE", "Chunk", "DcpFile", "load", "open", "read_metadata"]

METADATA_FILE = ".metadata"
MAX_METADATA = 1 << 30  # a .metadata larger than this is no checkpoint's
MAX_VALUE = 64 << 20  # a non-tensor value's bytes read for metadata, at most

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


class _Unpickler(pickle._Unpickler):
    """The pure-Python unpickler, as torch's weights_only one, reading only what is there.

    The C unpickler allocates what a hostile stream claims before checking it (a memo
    index of 2**27 resizes its memo table to 2 GB; a byte string's length is allocated
    before it is read). The pure-Python one reads byte strings from the in-memory
    stream, which yields what it holds, except ``BYTEARRAY8``: it allocates the claimed
    length first (a 1 KB file claimed 4 GB), so that opcode reads before it allocates.
    """

    def _load_bytearray8(self) -> None:
        me: Any = self  # load() binds read and append on the instance
        (n,) = struct.unpack("<Q", me.read(8))
        data = me.read(n)
        if len(data) != n:
            raise pickle.UnpicklingError(
                f"a bytearray claims {n:,} bytes where {len(data):,} remain"
            )
        me.append(bytearray(data))

    dispatch: ClassVar[dict[int, Callable[[Any], None]]] = {
        **pickle._Unpickler.dispatch,
        pickle.BYTEARRAY8[0]: _load_bytearray8,
    }


class _MetadataUnpickler(_Unpickler):
    """Builds the DCP metadata classes and refuses every other global, uncalled."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"the global {module}.{name} is not DCP metadata")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("a persistent id is not DCP metadata")


def read_metadata(path: str | os.PathLike[str]) -> Any:
    """A DCP ``.metadata`` file's ``Metadata``, through the restricted unpickler, checked.

    ``path`` is the checkpoint directory or its ``.metadata`` file.

    Raises:
        FormatError: a global that is not DCP metadata (nothing of it is called), a
            malformed pickle, or fields of the wrong types or out of range.
    """
    p = Path(path)
    if p.is_dir():
        p = p / METADATA_FILE
    raw = read_small(p, MAX_METADATA, "DCP .metadata file")
    try:
        meta = _MetadataUnpickler(io.BytesIO(raw)).load()
    except pickle.UnpicklingError as err:
        raise FormatError(
            f"{p}: refused to unpickle: {err}; tensorbridge reads only the classes "
            "torch.distributed.checkpoint writes (if you trust the file, load it with "
            "torch.distributed.checkpoint itself)"
        ) from None
    except Exception as err:  # a malformed stream raises anything from EOFError to TypeError
        raise FormatError(
            f"{p}: not a valid DCP .metadata pickle ({type(err).__name__}: {err})"
        ) from None
    _check_metadata(p, meta)
    return meta


def _check_metadata(p: Path, meta: Any) -> None:
    from torch.distributed.checkpoint import metadata as md

    def bad(what: str) -> FormatError:
        return FormatError(f"{p}: {what}; the checkpoint's metadata is corrupt")

    if not isinstance(meta, md.Metadata):
        raise bad(f"it holds a {type(meta).__qualname__}, not a DCP Metadata")
    sdm = getattr(meta, "state_dict_metadata", None)
    if not isinstance(sdm, dict):
        raise bad("state_dict_metadata is not a dict")
    for key, item in sdm.items():
        if not isinstance(key, str):
            raise bad(f"the state-dict key {key!r} is not a string")
        if isinstance(item, md.BytesStorageMetadata):
            continue
        if not isinstance(item, md.TensorStorageMetadata):
            raise bad(f"{key!r} is described by a {type(item).__qualname__}")
        props = getattr(item, "properties", None)
        if not isinstance(getattr(props, "dtype", None), torch.dtype):
            raise bad(f"{key!r} has no dtype")
        shape = _ints(getattr(item, "size", None))
        chunks = getattr(item, "chunks", None)
        if shape is None or not isinstance(chunks, list):
            raise bad(f"{key!r} has no shape or chunk list")
        for c in chunks:
            off, size = _ints(getattr(c, "offsets", None)), _ints(getattr(c, "sizes", None))
            if (
                not isinstance(c, md.ChunkStorageMetadata)
                or off is None
                or size is None
                or len(off) != len(shape)
                or len(size) != len(shape)
                or any(o + s > n for o, s, n in zip(off, size, shape, strict=True))
            ):
                raise bad(f"a chunk of {key!r} lies outside its shape {list(shape)}")
    storage = getattr(meta, "storage_data", None)
    if not isinstance(storage, dict):
        raise bad("storage_data is not a dict (not written by FileSystemWriter)")
    for index, info in storage.items():
        # the unpickler built only allow-listed classes: the storage record is known by name
        if (
            not isinstance(index, md.MetadataIndex)
            or not isinstance(getattr(index, "fqn", None), str)
            or type(info).__name__ != "_StorageInfo"
        ):
            raise bad("storage_data maps something other than MetadataIndex -> _StorageInfo")
        rel = getattr(info, "relative_path", None)
        if (
            not isinstance(rel, str)
            or Path(rel).name != rel
            or rel in ("", ".", "..")
            or "\x00" in rel
            or len(os.fsencode(rel)) > 255  # longer than any file name can be
        ):
            shown = repr(rel[:80]) if isinstance(rel, str) else f"a {type(rel).__qualname__}"
            raise bad(f"the item of {index.fqn!r} names the file {shown}, not one in the directory")
        if not all(type(getattr(info, a, None)) is int for a in ("offset", "length")) or (
            info.offset < 0 or info.length < 0
        ):
            raise bad(f"the item of {index.fqn!r} has no valid offset and length")


def _ints(x: Any) -> tuple[int, ...] | None:
    if not isinstance(x, (tuple, list)) or not all(type(v) is int and v >= 0 for v in x):
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


class _Storage:
    def __init__(self, key: str, dtype: torch.dtype | None, numel: int) -> None:
        self.key, self.dtype, self.numel = key, dtype, numel


def _rebuild_v2(storage: Any, offset: Any, size: Any, stride: Any, *rest: Any) -> _Rebuild:
    if not isinstance(storage, _Storage) or storage.dtype is None:
        raise pickle.UnpicklingError("_rebuild_tensor_v2 without a typed storage")
    return _record(storage, storage.dtype, offset, size, stride)


def _rebuild_v3(
    storage: Any, offset: Any, size: Any, stride: Any, grad: Any, hooks: Any, dtype: Any, *r: Any
) -> _Rebuild:
    if not isinstance(storage, _Storage) or not isinstance(dtype, torch.dtype):
        raise pickle.UnpicklingError("_rebuild_tensor_v3 without a storage and dtype")
    return _record(storage, dtype, offset, size, stride)


def _record(storage: _Storage, dtype: torch.dtype, offset: Any, size: Any, stride: Any) -> _Rebuild:
    shape, strides = _ints(size), _ints(stride)
    if type(offset) is not int or offset < 0 or shape is None or strides is None:
        raise pickle.UnpicklingError("a tensor rebuilt with invalid offset, size or stride")
    if len(shape) != len(strides):
        raise pickle.UnpicklingError("a tensor's size and stride differ in length")
    numel = storage.numel
    if storage.dtype is None:  # an UntypedStorage counts bytes
        itemsize = torch.empty((), dtype=dtype).element_size()
        if numel % itemsize:
            raise pickle.UnpicklingError("an untyped storage of a partial element")
        numel //= itemsize
    return _Rebuild(storage.key, dtype, numel, offset, shape, strides)


class _StorageType:
    """Stands for ``torch.<X>Storage`` / ``UntypedStorage`` in a persistent id."""

    def __init__(self, dtype: torch.dtype | None) -> None:
        self.dtype = dtype


def _storage_types() -> dict[str, torch.dtype]:
    out = {}
    for name in dir(torch):
        cls = getattr(torch, name, None)
        if name.endswith("Storage") and isinstance(cls, type) and hasattr(cls, "_dtype"):
            with contextlib.suppress(Exception), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dtype = cls._dtype
                if isinstance(dtype, torch.dtype):
                    out[name] = dtype
    return out


_TYPED_STORAGES: dict[str, torch.dtype] = {}


class _ItemUnpickler(_Unpickler):
    """Reads a chunk's ``data.pkl`` into a :class:`_Rebuild`; any other global is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_v2
        if module == "torch._utils" and name == "_rebuild_tensor_v3":
            return _rebuild_v3
        if (module, name) == ("collections", "OrderedDict"):
            return dict
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) in (("torch", "UntypedStorage"), ("torch.storage", "UntypedStorage")):
            return _StorageType(None)
        if module == "torch":
            if not _TYPED_STORAGES:
                _TYPED_STORAGES.update(_storage_types())
            if name in _TYPED_STORAGES:
                return _StorageType(_TYPED_STORAGES[name])
        raise pickle.UnpicklingError(f"{module}.{name} does not rebuild a plain tensor")

    def persistent_load(self, pid: Any) -> Any:
        if (
            isinstance(pid, tuple)
            and len(pid) == 5
            and pid[0] == "storage"
            and isinstance(pid[1], _StorageType)
            and isinstance(pid[2], str)
            and type(pid[4]) is int
            and pid[4] >= 0
        ):
            return _Storage(pid[2], pid[1].dtype, pid[4])
        raise pickle.UnpicklingError("an unrecognised persistent id")


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
            if order is not None and zf.read(order) != b"little":
                raise _Unrecognised("big-endian storage")
            if infos[pkl[0]].file_size > MAX_VALUE:
                raise _Unrecognised("a data.pkl too large for one tensor")
            rebuilt = _ItemUnpickler(io.BytesIO(zf.read(pkl[0]))).load()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as err:
        raise FormatError(
            f"{where}: the stored tensor is not a valid torch.save zip ({err})"
        ) from None
    except pickle.UnpicklingError as err:
        raise _Unrecognised(str(err)) from None
    if not isinstance(rebuilt, _Rebuild):
        raise _Unrecognised("data.pkl holds no plain tensor")
    info = infos.get(f"{prefix}data/{rebuilt.key}")
    if info is None:
        raise FormatError(f"{where}: the storage member data/{rebuilt.key} is missing")
    if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
        raise _Unrecognised("a compressed storage member")
    if info.header_offset + _LOCAL.size > length:
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

    def __init__(self, path: Path) -> None:
        self.path = path
        with path.open("rb") as f:
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

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        p = Path(path)
        self.path = p if p.is_dir() else p.parent
        self._meta = read_metadata(self.path)
        self._versions = _versions(self.path, self._meta)
        self._files: dict[str, _Mapped] = {}
        self._tensors: dict[str, Any] = {}
        self._values: dict[str, Any] = {}
        self._skipped: dict[str, str] = {}
        self._layout: dict[tuple[str, tuple[int, ...]], tuple[_Rebuild, int] | None] = {}
        self._order: list[str] = []
        self._owner = True
        from torch.distributed.checkpoint import metadata as md

        try:
            for key, item in self._meta.state_dict_metadata.items():
                if isinstance(item, md.TensorStorageMetadata):
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
            row = resolve_dtype(item.properties.dtype)
        except TensorBridgeError as err:
            raise UnsupportedDtypeError(f"{name!r}: {err}") from None
        return row, tuple(item.size)

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
        shape = tuple(item.size)
        out = []
        for c in item.chunks:
            info = self._storage(name, tuple(c.offsets))
            out.append(
                Chunk(
                    tuple(c.offsets), tuple(c.sizes), info.relative_path, info.offset, info.length
                )
            )
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
        from torch.distributed.checkpoint.metadata import MetadataIndex
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

        reader = FileSystemReader(self.path)
        reader.set_up_storage_reader(self._meta, True)
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

    def _storage(self, name: str, offsets: tuple[int, ...] | None) -> Any:
        from torch.distributed.checkpoint.metadata import MetadataIndex

        index = MetadataIndex(name, None if offsets is None else torch.Size(offsets))
        info = self._meta.storage_data.get(index)
        if info is None:
            raise FormatError(f"{self.path}: no stored item for {name!r} at {offsets}; corrupt")
        if getattr(info, "transform_descriptors", None):
            # stream transforms (compression): only DCP's reader can undo them
            self._layout[(name, offsets or ())] = None
        return info

    def _file(self, name: str) -> _Mapped:
        f = self._files.get(name)
        if f is None:
            p = self.path / name
            if not p.is_file():
                raise FormatError(
                    f"{self.path}: the metadata names {name}, which is missing; the checkpoint "
                    "is incomplete"
                )
            f = _Mapped(p)
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
        if getattr(info, "transform_descriptors", None) or info.length > MAX_VALUE:
            self._skip(key, "stored transformed or too large to read as a plain value")
            return
        raw = bytes(mapped.map[info.offset : info.offset + info.length])
        try:
            value = torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")
        except Exception as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            self._skip(key, f"torch.load(weights_only=True) refuses it ({first[:160]})")
            return
        if _plain(value):
            self._values[key] = value
        else:
            self._skip(key, f"a {type(value).__qualname__}, neither a tensor nor a plain value")

    def _skip(self, key: str, why: str) -> None:
        self._skipped[key] = (
            f"the checkpoint's value {key!r} is {why} (never unpickled freely; load it "
            "with torch.distributed.checkpoint if you trust it)"
        )
        self._order.append(key)


def _versions(path: Path, meta: Any) -> dict[str, tuple[int, ...]]:
    """Each data file's :func:`identity` when the checkpoint is opened (see ``_file``)."""
    out: dict[str, tuple[int, ...]] = {}
    for info in meta.storage_data.values():
        rel = getattr(info, "relative_path", None)
        if type(rel) is str and rel not in out:
            with contextlib.suppress(OSError, ValueError):
                out[rel] = identity(os.stat(path / rel))
    return out


def _plain(v: Any) -> bool:
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    if type(v) in (list, tuple):
        return all(_plain(x) for x in v)
    if type(v) is dict:
        return all(isinstance(k, str) and _plain(x) for k, x in v.items())
    return False


def _disjoint(chunks: list[Chunk]) -> bool:
    """No two non-empty boxes overlap (with the element count, they then tile the shape).

    A sweep along the first dimension: each box is compared only with the boxes whose
    first-dimension range it meets (one, for row shards), not with every other box.
    """
    boxes = sorted((c for c in chunks if 0 not in c.shape), key=lambda c: c.offsets)
    if not boxes or not boxes[0].offsets:
        return len(boxes) <= 1
    active: list[Chunk] = []
    for b in boxes:
        active = [a for a in active if a.offsets[0] + a.shape[0] > b.offsets[0]]
        for a in active:
            if all(
                ao < bo + bn and bo < ao + an
                for ao, an, bo, bn in zip(a.offsets, a.shape, b.offsets, b.shape, strict=True)
            ):
                return False
        active.append(b)
    return True


def open(path: str | os.PathLike[str]) -> DcpFile:  # the verb every format has
    """Open a DCP checkpoint directory (or its ``.metadata``) lazily."""
    return DcpFile(path)


def load(path: str | os.PathLike[str], **options: Any) -> Any:
    """Every tensor of a DCP checkpoint, as :meth:`TensorFile.read` gives them."""
    with open(path) as f:
        skipped = f.unsupported()
        return f.read([k for k in f if k not in skipped], **options)
