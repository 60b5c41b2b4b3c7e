"""One stored item of a ``.distcp`` file: the ``torch.save`` zip a chunk or a value is.

A tensor chunk's item is a zip whose ``data.pkl`` (read by the pickle machine, a
tensor only from the storage it names) rebuilds one tensor from an uncompressed
storage member: :func:`locate` finds that member's bytes from the zip's directory and
local header, every offset checked against the item, so the reader can map them. An
item laid out otherwise raises :class:`Unrecognised` (the reader then asks DCP's own
reader). :func:`inflates_within` bounds a non-tensor value's decompressed size before
it is read.
"""

from __future__ import annotations

import io
import struct
import zipfile
from dataclasses import dataclass
from typing import Any

import torch

from ...errors import FormatError
from .._detect import ZIP_ERRORS
from ..pickle_machine import StorageRef, StorageType, TensorRef, unpickle

__all__ = ["MAX_VALUE", "Rebuild", "Unrecognised", "inflates_within", "locate"]

MAX_VALUE = 64 << 20  # a non-tensor value's bytes (stored, and each item decompressed), at most


@dataclass(frozen=True)
class Rebuild:
    """What ``torch._utils._rebuild_tensor_v2`` / ``_v3`` would be given."""

    key: str  # the storage member: data/<key>
    dtype: torch.dtype
    storage_numel: int
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


def _chunk_tensor(data: bytes) -> Rebuild:
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
    return Rebuild(t.storage.key, t.dtype, t.storage_numel, t.offset, t.shape, t.stride)


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


class Unrecognised(Exception):
    """An item laid out in a way this module does not map: DCP's reader reads it."""


def locate(buf: Any, start: int, length: int, where: str) -> tuple[Rebuild, int, int]:
    """The tensor a ``torch.save`` zip at ``[start, start + length)`` rebuilds, and where
    (absolute offset, byte count) its uncompressed storage member lies."""
    try:
        with zipfile.ZipFile(_Slice(buf, start, length)) as zf:
            infos = {i.filename: i for i in zf.infolist()}
            pkl = [n for n in infos if n.endswith("/data.pkl")]
            if len(pkl) != 1:
                raise Unrecognised("no single data.pkl")
            prefix = pkl[0][: -len("data.pkl")]
            order = infos.get(prefix + "byteorder")
            if order is not None and _member(zf, order, 16) != b"little":
                raise Unrecognised("big-endian storage")
            data_pkl = _member(zf, infos[pkl[0]], MAX_VALUE)
            if data_pkl is None:
                raise Unrecognised("a data.pkl too large for one tensor")
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
        raise Unrecognised("a compressed storage member")
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


def inflates_within(raw: bytes, limit: int) -> bool:
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
