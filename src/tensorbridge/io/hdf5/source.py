"""The bytes h5py reads: an opened file, or the member of a ``.keras`` archive, checked on the way.

h5py reads through a Python file object (its file-object driver), so that the HDF5
library reads the very descriptor tensorbridge opened and maps, and reads a stored zip
member in place. Every read passes :func:`check_collection`: HDF5 2.0.0 loops forever
on a global heap collection (where variable-length strings, such as Keras' ``dtype``
attribute, live) holding a free-space object of size 0 (``H5HGcache.c``,
``H5HG__cache_heap_deserialize``: the object's size is the step to the next one), and
may read past the collection where an object's size runs beyond it, so a collection
that would do either is refused before HDF5 parses it.
"""

from __future__ import annotations

import io
import os
import struct
import zipfile
from dataclasses import dataclass
from typing import Any

from ..._filemap import FileReader
from ...errors import FormatError
from .._detect import ZIP_ERRORS
from .headers import Layout

__all__ = [
    "DEFLATE_RATIO",
    "Source",
    "Stream",
    "Window",
    "check_collection",
    "open_source",
    "superblock",
]

DEFLATE_RATIO = 1032  # deflate expands at most 1032:1
SIGNATURE = b"\x89HDF\r\n\x1a\n"
_LOCAL_HEADER = 30  # a zip local file header's fixed part
_ZIP_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)


def check_collection(data: bytes | memoryview, lengths: int, where: str) -> None:
    """Refuse a global heap collection (``GCOL``) that HDF5 would loop on or overrun.

    ``data`` is what a read returned; a read shorter than the collection it starts
    (HDF5's first read takes 4 KiB, then the whole) is checked when read whole. The
    walk is HDF5's: objects of ``2 + 2 + 4 + lengths`` bytes of header, then their
    data padded to 8 bytes; object 0 (free space) is ``size`` bytes in all.

    Raises:
        FormatError: an object of size 0 or one running past the collection.
    """
    head = 8 + lengths  # "GCOL", version, 3 reserved bytes, the collection's size
    if len(data) < head or bytes(data[:4]) != b"GCOL":
        return
    size = int.from_bytes(bytes(data[8:head]), "little")
    if size > len(data):
        return  # the first, partial read: HDF5 takes the size from it, then reads it whole
    p = head
    objhead = 8 + lengths
    while p < size:
        if p + objhead > size:
            return  # too short for an object: free space, as HDF5 takes it
        index = int.from_bytes(bytes(data[p : p + 2]), "little")
        length = int.from_bytes(bytes(data[p + 8 : p + objhead]), "little")
        step = objhead + (length + 7) // 8 * 8 if index else length
        if step <= 0 or step > size - p:
            raise FormatError(
                f"{where}: the global heap collection holds object {index} of {length} bytes "
                f"at {p} of its {size}, which HDF5 cannot step over; the file is corrupt"
            )
        p += step


class Window(FileReader):
    """Bytes ``[start, start + size)`` of an opened file, as a file of their own (h5py's
    file-object driver reads through it; a stored zip member is such a window)."""

    def __init__(self, fd: int, start: int, size: int, layout: Layout, where: str) -> None:
        super().__init__(fd, size)
        self.start, self.layout, self.where = start, layout, where

    def raw(self, pos: int, n: int) -> bytes:
        """``n`` bytes at ``pos`` of the window (fewer at its end), unchecked."""
        n = max(0, min(n, self.size - pos))
        return os.pread(self.fd, n, self.start + pos) if n and pos >= 0 else b""

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")  # h5py's buffer, read into straight (one copy)
        want = max(0, min(len(view), self.size - self.pos))
        n = os.preadv(self.fd, [view[:want]], self.start + self.pos) if want else 0
        check_collection(view[:n], self.layout.lengths, self.where)
        self.pos += n
        return n


class Stream(io.RawIOBase):
    """A seekable stream (a deflated zip member) read with :func:`check_collection`."""

    def __init__(self, inner: Any, size: int, layout: Layout, where: str) -> None:
        super().__init__()
        self.inner, self.size, self.layout, self.where = inner, size, layout, where

    def raw(self, pos: int, n: int) -> bytes:
        """``n`` bytes at ``pos`` (fewer at the end), unchecked; h5py seeks before it reads."""
        if pos < 0 or pos >= self.size:
            return b""
        self.inner.seek(pos)
        return bytes(self.inner.read(max(0, min(n, self.size - pos))))

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        return int(self.inner.seek(pos, whence))

    def tell(self) -> int:
        return int(self.inner.tell())

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        data = self.inner.read(len(view))
        check_collection(data, self.layout.lengths, self.where)
        view[: len(data)] = data
        return len(data)


@dataclass
class Source:
    """Where an HDF5 file's bytes are: a window of the opened file, or a deflated member."""

    file: Any  # what h5py reads: a Window or a Stream
    start: int | None  # the HDF5 file's first byte in the opened file; None: not mappable
    size: int  # the HDF5 file's size
    where: str  # the file (and member) for messages
    archive: zipfile.ZipFile | None = None  # the open archive of a member read through it


def open_source(fd: int, file_size: int, where: str, members: tuple[str, ...]) -> Source:
    """The HDF5 file in the opened file ``fd``: itself, or the first of ``members`` a
    zip archive holds (stored: read in place; deflated: through ``zipfile``).

    Raises:
        FormatError: a corrupt archive, none of ``members``, an encrypted member.
    """
    head = os.pread(fd, 4, 0)
    if head not in (b"PK\x03\x04", b"PK\x05\x06"):
        window = Window(fd, 0, file_size, _layout(fd, 0, file_size), where)
        return Source(window, 0, file_size, where)
    try:
        archive = zipfile.ZipFile(io.BufferedReader(FileReader(fd, file_size)))
        infos = {i.filename: i for i in archive.infolist()}
    except ZIP_ERRORS as err:
        raise FormatError(f"{where}: a corrupt zip archive ({err})") from None
    info = next((infos[m] for m in members if m in infos), None)
    if info is None:
        archive.close()
        raise FormatError(
            f"{where} is a zip archive without {' or '.join(members)}; a Keras .keras "
            "archive holds its weights there (save it with Keras 3)"
        )
    where = f"{where}, member {info.filename!r}"
    if info.flag_bits & 0x1 or info.compress_type not in _ZIP_METHODS:
        archive.close()
        raise FormatError(f"{where} is encrypted or compressed by a method zip readers lack")
    if info.compress_type == zipfile.ZIP_STORED:
        archive.close()
        start = _stored_start(fd, file_size, info, where)
        window = Window(fd, start, info.file_size, _layout(fd, start, info.file_size), where)
        return Source(window, start, info.file_size, where)
    if info.file_size > info.compress_size * DEFLATE_RATIO + 1024:
        archive.close()
        raise FormatError(f"{where} declares more bytes than deflate can make; it is corrupt")
    try:
        member = archive.open(info)
        first = member.read(1 << 16)
        member.seek(0)
    except ZIP_ERRORS as err:
        archive.close()
        raise FormatError(f"{where}: corrupt member data ({err})") from None
    stream = Stream(member, info.file_size, superblock(first), where)
    return Source(stream, None, info.file_size, where, archive)


def _layout(fd: int, start: int, size: int) -> Layout:
    """The file's :func:`superblock` layout, from its first 64 KiB."""
    return superblock(os.pread(fd, min(size, 1 << 16), start))


def superblock(head: bytes) -> Layout:
    """Where the superblock is (at 0 or after a user block: 512, 1024, ...; addresses count
    from it) and the sizes of offsets and lengths it states; 0 and 8-byte sizes (h5py's,
    HDF5's defaults) where ``head`` holds none (HDF5 then refuses the file)."""
    at = 0
    while at + 16 <= len(head):
        if head[at : at + 8] == SIGNATURE:
            sizes = head[at + 13 : at + 15] if head[at + 8] < 2 else head[at + 9 : at + 11]
            valid = all(n in (2, 4, 8, 16, 32) for n in sizes)
            return Layout(at, sizes[0], sizes[1]) if valid else Layout(at, 8, 8)
        at = 512 if at == 0 else at * 2
    return Layout(0, 8, 8)


def _stored_start(fd: int, size: int, info: zipfile.ZipInfo, where: str) -> int:
    """Where a stored zip member's bytes begin, from its local header, checked in bounds."""
    off = info.header_offset
    head = os.pread(fd, _LOCAL_HEADER, off) if 0 <= off < size else b""
    if len(head) < _LOCAL_HEADER or head[:4] != b"PK\x03\x04":
        raise FormatError(f"{where}: no local file header at offset {off}; the archive is corrupt")
    name_len, extra_len = struct.unpack("<HH", head[26:30])
    start: int = off + _LOCAL_HEADER + name_len + extra_len
    if info.compress_size != info.file_size or start + info.file_size > size:
        raise FormatError(
            f"{where}: its {info.file_size} stored bytes at {start} do not fit the archive's "
            f"{size} bytes; it is truncated"
        )
    return start
