"""A ``torch.save`` file's layout: its pickle and where each storage's bytes lie, both eras.

**Zip era** (torch >= 1.6, ``torch/serialization.py`` ``_save``): a zip (members
stored, not compressed) under one top-level folder, ``NAME/``:

* ``NAME/data.pkl`` — the object, pickled (protocol 2 by default); each storage is a
  persistent id ``("storage", <storage type>, key, location, numel)`` where the type
  is ``torch.FloatStorage`` & co. (``numel`` elements) or ``torch.UntypedStorage``
  (``numel`` bytes, the tensor's dtype given to ``_rebuild_tensor_v3``);
* ``NAME/data/<key>`` — that storage's bytes, little-endian unless ``NAME/byteorder``
  says ``big``; ``NAME/version`` and friends are not read.

**Legacy era** (``_use_new_zipfile_serialization=False``, torch's ``_legacy_load``):
five pickles back to back — the magic number ``0x1950a86a20f9469cfc6c``, the protocol
version ``1001``, a ``sys_info`` dict (``little_endian``), the object (persistent ids
``("storage", type, key, location, numel, None)``), and the list of storage keys —
then, for each key in that order, an int64 element count and the storage's bytes.

Everything goes through :mod:`tensorbridge.io.pickle_machine`; every storage a
persistent id names must be in the file with exactly ``numel`` elements' bytes, and a
member's declared sizes are checked against the file before anything is read. The
file is opened once: the :class:`Archive` keeps its descriptor and maps, so a file
replaced under the same name later changes nothing it gives.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import zipfile
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .._filemap import read_at
from .._files import open_fd
from ..errors import FormatError
from ._detect import ZIP_ERRORS, is_legacy_pt
from .pickle_machine import Opaque, StorageRef, StorageType, itemsize, unpickle_at

__all__ = [
    "DEFLATE_MAX_RATIO",
    "INFLATE_MARGIN",
    "MAX_PICKLE",
    "TORCHSCRIPT_MESSAGE",
    "Archive",
    "open_archive",
    "read_value",
]

DEFLATE_MAX_RATIO = 1032  # deflate cannot expand data more than this
MAX_PICKLE = 256 << 20  # a data.pkl larger than this is no checkpoint's
INFLATE_MARGIN = 16 << 20  # a deflated data.pkl may exceed the file by at most this
_LOCAL = struct.Struct("<4s22xHH")  # a zip local header: signature ... name and extra lengths
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch/serialization.py MAGIC_NUMBER
_LEGACY_PROTOCOL = 1001  # PROTOCOL_VERSION

TORCHSCRIPT_MESSAGE = (
    "{where} is a TorchScript archive (torch.jit.save): it holds a program, not a state "
    "dict; if you trust it, torch.jit.load(path).state_dict() gives its weights"
)


@dataclass
class Archive:
    """An opened ``torch.save`` file: its object and its storages' bytes."""

    obj: Any  # what the pickle machine built: plain values, TensorRef, Opaque
    legacy: bool
    size: int  # the file's size when opened
    fd: int = -1  # the opened file (zip era), kept for the copy-on-write map
    view: Any = None  # zip era: the whole file mapped read-only
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> (offset, nbytes)
    owned: dict[str, np.ndarray] = field(default_factory=dict)  # key -> bytes (legacy, unaligned)
    _cow: Any = None

    def storage(self, ref: StorageRef, *, writable: bool) -> np.ndarray:
        """The storage's bytes as a uint8 array: read-only, or copy-on-write when ``writable``."""
        owned = self.owned.get(ref.key)
        if owned is not None:
            return owned
        offset, nbytes = self.spans[ref.key]
        if writable:
            if self._cow is None:
                self._cow = mmap.mmap(self.fd, 0, access=mmap.ACCESS_COPY)
            return np.frombuffer(self._cow, np.uint8, nbytes, offset)
        return np.frombuffer(self.view, np.uint8, nbytes, offset)

    def close(self) -> None:
        for m in (self.view, self._cow):
            if isinstance(m, mmap.mmap):
                with contextlib.suppress(BufferError):  # arrays handed out keep it open
                    m.close()
        self.view = self._cow = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def open_archive(path: str | os.PathLike[str], where: str) -> Archive:
    """Open a ``torch.save`` file of either era (told from its first bytes).

    Raises:
        FormatError: not a ``torch.save`` file, a corrupt one, or one whose pickle the
            machine refuses.
    """
    fd = open_fd(path)  # a regular file only: a FIFO or device is refused, never waited on
    kept = False
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 68, 0)
        if head.startswith(b"PK\x03\x04"):
            view = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            archive = Archive(None, legacy=False, size=size, fd=fd, view=view)
            try:
                _read_zip(archive, where)
            except BaseException:
                archive.fd = -1  # closed below
                archive.close()
                raise
            kept = True
            return archive
        if is_legacy_pt(head):
            with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as m:
                return _read_legacy(m, size, where, fd)
        raise FormatError(not_an_archive(where, head))
    finally:
        if not kept:
            os.close(fd)


# kinds recognised from a file's first bytes, for the message of a file that is no archive
_KINDS = (
    (0, b"\x89HDF", "an HDF5 file (Keras .h5?)"),
    (0, b"GGUF", "a GGUF file"),
    (0, b"\x93NUMPY", "a NumPy .npy file"),
    (4, b"TFL3", "a TensorFlow Lite flatbuffer"),
    (64, b"\xef\xbe\xad\xde", "a Core ML weight blob (weight.bin)"),
    (0, b"\x08", "a protobuf message (an ONNX model?)"),
    (0, b"PK\x03\x04", "a zip archive"),
    (0, b"\x1f\x8b", "a gzip stream"),
    (0, b"\x80", "a pickle that is not a torch.save file"),
)


def not_an_archive(where: str, head: bytes) -> str:
    """The message for a file that is no ``torch.save`` archive: what its first bytes look like.

    >>> not_an_archive("'m.pt'", b"hello world").split(": ")[1].split(";")[0]
    'it starts with 68 65 6c 6c 6f 20 77 6f, which looks like text'

    """
    kind = next((k for at, magic, k in _KINDS if head[at : at + len(magic)] == magic), None)
    if kind is None and head and all(32 <= b < 127 or b in (9, 10, 13) for b in head[:16]):
        kind = "text"
    seen = head[:8].hex(" ") if head else "nothing (an empty file)"
    like = f", which looks like {kind}" if kind else ""
    return (
        f"{where} is not a torch.save archive: it starts with {seen}{like}; tensorbridge "
        "reads torch.save files (a zip holding a data.pkl, or the legacy pickle format)"
    )


def _read_zip(archive: Archive, where: str) -> None:
    buf = archive.view
    try:
        with zipfile.ZipFile(_Reader(buf)) as zf:
            infos = zf.infolist()
    except ZIP_ERRORS as err:
        raise FormatError(f"{where} is not a readable zip archive ({err})") from None
    members: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        stored = info.compress_type == zipfile.ZIP_STORED
        limit = info.compress_size if stored else info.compress_size * DEFLATE_MAX_RATIO + 1024
        outside = info.header_offset < 0 or info.header_offset + info.compress_size > archive.size
        if outside or info.file_size > limit:
            raise FormatError(
                f"{where}: member {info.filename!r} claims {info.file_size:,} bytes from "
                f"{info.compress_size:,} stored at offset {info.header_offset:,} of a "
                f"{archive.size:,}-byte file; the archive is corrupt"
            )
        members[info.filename] = info
    names = list(members)
    if any(n.endswith("/constants.pkl") or "/code/" in n for n in names):
        raise FormatError(TORCHSCRIPT_MESSAGE.format(where=where))
    pickles = [n for n in names if n.endswith("data.pkl") and n.count("/") <= 1]
    if len(pickles) != 1:
        raise FormatError(
            f"{where} is a zip archive without one data.pkl (it has {len(pickles)}): not a "
            "torch.save archive"
        )
    prefix = pickles[0][: -len("data.pkl")]
    order = members.get(prefix + "byteorder")
    if order is not None and _member(buf, order, where, archive.size) not in (b"little", b""):
        raise FormatError(
            f"{where} was written on a big-endian machine; tensorbridge reads little-endian "
            "torch.save archives (re-save it on a little-endian machine)"
        )
    pkl = members[pickles[0]]
    if pkl.file_size > MAX_PICKLE:
        raise FormatError(f"{where}: its data.pkl of {pkl.file_size:,} bytes is no checkpoint's")
    if pkl.compress_type != zipfile.ZIP_STORED and pkl.file_size > archive.size + INFLATE_MARGIN:
        raise FormatError(
            f"{where}: its deflated data.pkl claims {pkl.file_size:,} bytes, more than "
            f"{INFLATE_MARGIN:,} beyond the {archive.size:,}-byte file, which no checkpoint "
            "does (torch.save stores data.pkl as it is; re-save the file with torch.save)"
        )
    data = _member(buf, pkl, where, archive.size)
    refs: dict[str, StorageRef] = {}

    def persistent_load(pid: Any) -> StorageRef:
        kind, dtype, key, numel = _storage_pid(pid, 5, where)
        info = members.get(f"{prefix}data/{key}")
        if info is None:
            raise FormatError(f"{where}: the storage data/{key} a tensor names is not in the file")
        nbytes = numel if dtype is None else numel * itemsize(dtype)
        if info.file_size != nbytes:
            raise FormatError(
                f"{where}: the storage data/{key} holds {info.file_size:,} bytes, not the "
                f"{numel:,} {kind.name} elements ({nbytes:,} bytes) its tensors claim"
            )
        ref = refs.get(key)
        if ref is None:
            ref = refs[key] = StorageRef(key, dtype, numel)
            archive.spans[key] = (_data_offset(buf, info, where, archive.size), nbytes)
            offset = archive.spans[key][0]
            if dtype is not None and offset % itemsize(dtype):  # aligned views only
                archive.owned[key] = _frozen(np.frombuffer(buf, np.uint8, nbytes, offset).copy())
        elif (ref.dtype, ref.numel) != (dtype, numel):
            raise FormatError(f"{where}: the storage data/{key} is named with two types")
        return ref

    archive.obj, _ = _unpickle(data, persistent_load, where)


def _read_at(buf: Any, fd: int | None, offset: int, nbytes: int) -> np.ndarray:
    """``nbytes`` of the file from ``offset`` in fresh memory: read from the descriptor
    straight into the array where the system allows (one copy, no page faults on a map),
    else copied out of the mapped ``buf``. The caller checked that the bytes are there."""
    out = np.empty(nbytes, np.uint8)
    if fd is None or not hasattr(os, "preadv"):
        out[:] = np.frombuffer(buf, np.uint8, nbytes, offset)
        return out
    read_at(fd, out, offset, "the file")
    return out


def _read_legacy(buf: Any, size: int, where: str, fd: int | None = None) -> Archive:
    archive = Archive(None, legacy=True, size=size)
    pos = 0
    magic, pos = _unpickle(buf, None, where, pos, placeholders=False)
    protocol, pos = _unpickle(buf, None, where, pos, placeholders=False)
    info, pos = _unpickle(buf, None, where, pos, placeholders=False)
    if magic != _LEGACY_MAGIC or protocol != _LEGACY_PROTOCOL or type(info) is not dict:
        raise FormatError(f"{where} is not a legacy torch.save file (its header is corrupt)")
    if info.get("little_endian", True) is not True:
        raise FormatError(
            f"{where} was written on a big-endian machine; tensorbridge reads little-endian "
            "torch.save files (re-save it on a little-endian machine)"
        )
    refs: dict[str, StorageRef] = {}

    def persistent_load(pid: Any) -> Any:
        # ("module", class, source file, source): a pickled module's class, with its code
        # kept for torch's source check; the class stays a placeholder, the code unread
        if type(pid) is tuple and len(pid) == 4 and pid[0] == "module":
            if not isinstance(pid[1], Opaque) or pid[1].args is not None:
                raise FormatError(f"{where}: a module's persistent id names no class")
            return pid[1]
        _, dtype, key, numel = _storage_pid(pid, 6, where)
        if pid[5] is not None:
            raise FormatError(
                f"{where}: a storage view (written by torch before 0.4) is not read; re-save "
                "the file with a current torch"
            )
        if dtype is None:
            raise FormatError(f"{where}: an untyped storage in a legacy file")
        ref = refs.get(key)
        if ref is None:
            ref = refs[key] = StorageRef(key, dtype, numel)
        elif (ref.dtype, ref.numel) != (dtype, numel):
            raise FormatError(f"{where}: the storage {key!r} is named with two types")
        return ref

    archive.obj, pos = _unpickle(buf, persistent_load, where, pos)
    keys, pos = _unpickle(buf, None, where, pos, placeholders=False)
    if type(keys) is not list or not all(type(k) is str for k in keys):
        raise FormatError(f"{where}: the legacy storage list is corrupt")
    if set(keys) != set(refs) or len(keys) != len(refs):
        raise FormatError(
            f"{where}: the file's storage list does not match the storages its tensors name "
            "(a storage is missing or repeated); the file is corrupt"
        )
    for key in keys:
        ref = refs[key]
        if size - pos < 8:
            raise FormatError(f"{where}: the storage {key!r} is cut short; the file is truncated")
        (numel,) = struct.unpack_from("<q", buf, pos)
        nbytes = ref.numel * itemsize(ref.dtype or torch.uint8)
        if numel != ref.numel or nbytes > size - pos - 8:
            raise FormatError(
                f"{where}: the storage {key!r} records {numel:,} elements where its tensors "
                f"claim {ref.numel:,} and {size - pos - 8:,} bytes remain; the file is corrupt"
            )
        archive.owned[key] = _frozen(_read_at(buf, fd, pos + 8, nbytes))
        pos += 8 + nbytes
    return archive


def read_value(raw: bytes, where: str) -> Any:
    """The object a ``torch.save`` zip held in memory describes, storages not read.

    For values stored whole (a DCP item): tensors come back as
    :class:`~tensorbridge.io.pickle_machine.TensorRef`, not read.
    """
    archive = Archive(None, legacy=False, size=len(raw), view=raw)
    _read_zip(archive, where)
    return archive.obj


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _storage_pid(
    pid: Any, length: int, where: str
) -> tuple[StorageType, torch.dtype | None, str, int]:
    if (
        type(pid) is not tuple
        or len(pid) != length
        or pid[0] != "storage"
        or not isinstance(pid[1], StorageType)
        or type(pid[2]) is not str
        or type(pid[3]) is not str
        or type(pid[4]) is not int
        or not 0 <= pid[4] < 1 << 62
    ):
        raise FormatError(f"{where}: a persistent id that names no storage")
    return pid[1], pid[1].dtype, pid[2], pid[4]


def _unpickle(
    buf: Any, persistent_load: Any, where: str, start: int = 0, *, placeholders: bool = True
) -> tuple[Any, int]:
    try:
        return unpickle_at(
            buf, persistent_load=persistent_load, placeholders=placeholders, start=start
        )
    except FormatError as err:
        text = str(err)
        if text.startswith(where):
            raise
        raise FormatError(f"{where}: {text}") from None


def _data_offset(buf: Any, info: zipfile.ZipInfo, where: str, size: int) -> int:
    """Where a stored member's bytes start, from its local header, checked against the file."""
    if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
        raise FormatError(
            f"{where}: the storage member {info.filename!r} is compressed or encrypted; "
            "torch.save stores them as they are (the archive was rewritten)"
        )
    return _local_start(buf, info, where, size, info.file_size)


def _local_start(buf: Any, info: zipfile.ZipInfo, where: str, size: int, length: int) -> int:
    """Where a member's ``length`` stored bytes start, from its local header, checked to lie
    inside the file's ``size`` bytes."""
    at = info.header_offset
    if at < 0 or at + _LOCAL.size > size:
        raise FormatError(f"{where}: the member {info.filename!r} lies outside the file")
    sig, name_len, extra_len = _LOCAL.unpack_from(buf, at)
    start = int(at + _LOCAL.size + name_len + extra_len)
    if sig != b"PK\x03\x04" or start + length > size:
        raise FormatError(
            f"{where}: the member {info.filename!r} runs past the file's {size:,} bytes or its "
            "header is corrupt; the file is truncated"
        )
    return start


def _member(buf: Any, info: zipfile.ZipInfo, where: str, size: int) -> bytes:
    """A small member's bytes (stored or deflated), never more than its declared size:
    a deflated one is inflated in steps and refused as soon as it runs past that size."""
    if info.compress_type == zipfile.ZIP_STORED:
        start = _data_offset(buf, info, where, size)
        return bytes(buf[start : start + info.file_size])
    if info.compress_type != zipfile.ZIP_DEFLATED or info.flag_bits & 0x1:
        raise FormatError(
            f"{where}: the member {info.filename!r} is encrypted or compressed other than "
            "by deflate; torch.save stores or deflates its members (the archive was rewritten)"
        )
    start = _local_start(buf, info, where, size, info.compress_size)
    inflate = zlib.decompressobj(-zlib.MAX_WBITS)
    out = bytearray()
    pending = buf[start : start + info.compress_size]
    try:
        while len(out) <= info.file_size:
            step = inflate.decompress(pending, min(1 << 20, info.file_size + 1 - len(out)))
            pending = inflate.unconsumed_tail
            out += step
            if not step and (inflate.eof or not pending):
                break
    except zlib.error as err:
        raise FormatError(f"{where}: the member {info.filename!r} is corrupt ({err})") from None
    if len(out) != info.file_size or zlib.crc32(out) != info.CRC:
        raise FormatError(
            f"{where}: the member {info.filename!r} inflates to other than the "
            f"{info.file_size:,} bytes its header claims (or fails its CRC); the archive is "
            "corrupt"
        )
    return bytes(out)


class _Reader:
    """A seekable read-only file over a buffer (a map), for ``zipfile``'s directory parser."""

    def __init__(self, buf: Any) -> None:
        self.buf, self.pos = buf, 0

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = max(0, (0, self.pos, len(self.buf))[whence] + pos)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        stop = len(self.buf) if n is None or n < 0 else min(len(self.buf), self.pos + n)
        out = bytes(self.buf[self.pos : stop])
        self.pos = max(self.pos, stop)
        return out
