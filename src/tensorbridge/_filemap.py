"""Reading files: zero-copy maps, descriptor-based readers, and checks that a file is unchanged.

* :func:`map_file` / :func:`array_at` — zero-copy views of a file's bytes:
  read-only (a write raises) or copy-on-write (writes stay in private pages);
  :func:`bits_at` the same bytes as a carried dtype's carrier integers.
* :class:`FileReader` / :func:`open_reader` — reads through the descriptor a reader
  opened, so a file replaced by another save is never mixed with the one opened.
* :func:`identity`, :func:`check_same_version`, :func:`check_unchanged` — refuse to
  go on reading a file that was replaced or truncated since it was opened.
* :func:`read_small` — a small side file (an index, a metadata pickle), bounded.
* :func:`read_at` — bytes at an offset read straight into fresh memory (``mmap=False``).
"""

from __future__ import annotations

import io
import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np

from ._files import Links, open_fd, open_regular, read_limited
from .dtypes import DTypeRow
from .errors import FormatError


def read_small(path: Path, limit: int, what: str, links: Links | None = None) -> bytes:
    """A small regular file's bytes (an index, a metadata pickle), refused past ``limit``.

    The buffer grows with the bytes actually read, never with the limit or a claimed
    size (:func:`~tensorbridge._files.read_limited`); ``links``: ``path`` is a file a
    checkpoint names, confined to it.

    Raises:
        FormatError: the file is over ``limit`` bytes, or no regular file.
        LinkError: a link out of the checkpoint ``links`` confines.
    """
    if links is not None:
        return links.read(path, limit, what)
    return read_limited(path, limit, what)


def map_file(path: str | os.PathLike[str], *, copy_on_write: bool = False) -> mmap.mmap | bytes:
    """Map a whole file read-only (or copy-on-write); empty files give ``b""``."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return b""
        access = mmap.ACCESS_COPY if copy_on_write else mmap.ACCESS_READ
        return mmap.mmap(f.fileno(), 0, access=access)


class FileReader(io.RawIOBase):
    """A read-only, seekable file over an open descriptor, with a position of its own.

    Readers keep the descriptor of the file they opened and read through it (``pread``)
    instead of opening the path again: a path that another save has since replaced
    atomically names a new file, the descriptor still the one opened (one handle, one
    version). Several readers may share one descriptor. Closing this object leaves the
    descriptor open.
    """

    def __init__(self, fd: int, size: int) -> None:
        super().__init__()
        self.fd, self.size, self.pos = fd, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        self.pos = max(0, base + pos)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        if hasattr(os, "preadv"):
            n = os.preadv(self.fd, [view], self.pos)
        else:  # pragma: no cover - Windows
            data = os.pread(self.fd, len(view), self.pos)
            n = len(data)
            view[:n] = data
        self.pos += n
        return n


def read_at(fd: int, out: Any, offset: int, where: object) -> None:
    """Fill the writable buffer ``out`` (a contiguous array) with the file's bytes from ``offset``.

    Reads through the descriptor (``preadv``: no shared file position moved) straight
    into ``out``: one copy, no page of a map touched, which is how ``mmap=False`` reads
    match a plain ``read`` of the file. ``where`` names the file in the error.

    Raises:
        FormatError: the file ends first: it shrank since its sizes were checked.
    """
    if isinstance(out, np.ndarray):  # NumPy 2.5 exports no buffer of an ml_dtypes array
        out = out.reshape(-1).view(np.uint8)
    view = memoryview(out).cast("B")
    done = 0
    while done < len(view):
        if hasattr(os, "preadv"):
            n = os.preadv(fd, [view[done:]], offset + done)
        else:  # pragma: no cover - Windows
            data = os.pread(fd, len(view) - done, offset + done)
            view[done : done + len(data)] = data
            n = len(data)
        if n <= 0:
            raise FormatError(
                f"{where} ended {len(view) - done:,} bytes early: it was truncated since "
                "it was opened; open it again"
            )
        done += n


def open_reader(path: str | os.PathLike[str]) -> tuple[int, int]:
    """A read-only descriptor of ``path`` (closed on exec), a regular file (see
    :func:`~tensorbridge._files.open_fd`: a FIFO or device is refused unopened), and
    the file's size."""
    fd = open_fd(path)
    try:
        return fd, os.fstat(fd).st_size
    except BaseException:
        os.close(fd)
        raise


def identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """What tells one version of a file from another: device, inode, size, modification time."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def check_same_version(
    path: str | os.PathLike[str], opened: tuple[int, ...], where: object
) -> None:
    """Refuse to go on reading a checkpoint whose file ``path`` is no longer the one opened.

    For files a reader must open by path after the checkpoint was opened (a Zarr
    store's chunks): ``opened`` is :func:`identity` of ``path`` when it was.

    Raises:
        FormatError: ``path`` was replaced (another save committed) or removed.
    """
    try:
        now = identity(os.stat(path))
    except OSError:
        now = None
    if now != opened:
        raise FormatError(
            f"{where} was replaced since it was opened (another save committed a new "
            "version); this handle reads only the version it opened: open it again"
        )


def check_unchanged(file: int | str | os.PathLike[str], size: int, where: object) -> None:
    """Refuse to hand out a view of a mapped file whose size changed since it was opened.

    Touching a mapped page past the end of a file that another process truncated
    raises SIGBUS, which kills the interpreter; this ``fstat`` (or ``stat`` of the
    path) before each view turns the common case into a :class:`FormatError`. A
    truncation that races a read already in progress can still SIGBUS: no check
    can close that window (see docs/dev/robustness.md).

    ``file`` is a descriptor of the mapped file or its path.
    """
    now = os.fstat(file).st_size if isinstance(file, int) else os.stat(file).st_size
    if now != size:
        raise FormatError(
            f"{where} changed size since it was opened ({size} -> {now} bytes): another "
            "process is writing it; open it again once that write is complete"
        )


def array_at(
    buf: Any, offset: int, shape: tuple[int, ...], row: DTypeRow, *, name: str = "?"
) -> np.ndarray:
    """A zero-copy array of ``shape`` and ``row``'s dtype at ``offset`` of ``buf``."""
    return bits_at(buf, offset, shape, row, name=name).view(row.numpy)


def bits_at(
    buf: Any, offset: int, shape: tuple[int, ...], row: DTypeRow, *, name: str = "?"
) -> np.ndarray:
    """:func:`array_at`'s array as ``row``'s carrier (itself where native): the same
    bytes, checked the same way, without making ``row``'s dtype (no ml_dtypes)."""
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    nbytes = count * row.itemsize
    if offset < 0 or offset + nbytes > len(buf):
        raise FormatError(
            f"tensor {name!r}: bytes {offset}..{offset + nbytes} lie outside the file's "
            f"{len(buf)} bytes; the file is truncated or corrupt"
        )
    if count == 0:
        try:
            return np.empty(shape, row.carrier_numpy)
        except ValueError:  # a zero beside dimensions whose product NumPy cannot index
            raise FormatError(
                f"tensor {name!r}: the shape {list(shape)} has no elements but dimensions "
                "too large to index; the file is corrupt"
            ) from None
    return np.frombuffer(buf, dtype=row.carrier_numpy, count=count, offset=offset).reshape(shape)
