"""``.npz``: a zip of ``.npy`` members, read without trust and written aligned.

Each member is a ``.npy`` file named ``<key>.npy``, with everything
:mod:`tensorbridge.io.npy` promises: the bit-carrier convention for bfloat16, float8
and complex32, and every header validated before anything is mapped or allocated.

**Reading.** Members stored uncompressed are mapped at their data offset (from the
zip's local header) and their CRC is checked only by owned (``mmap=False``) reads;
deflated members (``np.savez_compressed``) are read into memory after their declared
size has been checked against the header and the compressed size. Encrypted members
and other compression methods are refused. Any fault raises
:class:`~tensorbridge.FormatError` naming the file and the member.

**Names** become member names ``<key>.npy`` (as ``np.savez`` names them; ``np.load``
takes the ``.npy`` off again). :data:`NAMES` refuses what a member name cannot carry
faithfully: an empty name, a NUL (``zipfile`` ends the name there), a lone surrogate,
``\\`` (a separator to Windows and unzip tools), a path out of the archive (absolute,
or a ``..`` component), and keys ``a`` and ``a.npy`` together (``np.load(p)["a.npy"]``
reads the member ``a.npy``, which is the key ``a``).

**Writing** is deterministic (fixed timestamps) and pads each member's local header
with a zipalign-style extra field so that its data starts at a 64-byte file offset:
mapped arrays are aligned. Every header is worked out before a byte is written, and
the data is streamed a chunk at a time inside an atomic write.

>>> import os, tempfile, numpy as np
>>> p = os.path.join(tempfile.mkdtemp(), "a.npz")
>>> save({"x": np.arange(3), "y": np.zeros((2, 2))}, p)
>>> with np.load(p) as z:  # NumPy's own reader agrees
...     z["x"].tolist()
[0, 1, 2]
"""

from __future__ import annotations

import contextlib
import os
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .._atomic import atomic_write
from .._chunks import DEFAULT_CHUNK
from .._keys import (
    NameRules,
    forward_slashes,
    inside_container,
    mapping_of,
    no_nul,
    not_empty,
    npy_stem,
    valid_unicode,
)
from .._progress import progress_bar
from .._tensorfile import TensorFile
from ..dtypes import DTypeLike, DTypeRow
from ..errors import FormatError, TensorBridgeError, UnsupportedDtypeError, UnsupportedTensorError
from ._common import loader
from ._detect import ZIP_ERRORS
from ._npy_header import (
    HEAD_LIMIT,
    Header,
    parse_header,
    raw_row,
    read_data,
    stored_header,
    view_data,
)
from .npy import (
    MappedFile,
    NpyBytes,
    no_metadata,
    open_at,
    prepare,
    write_entry,
    write_npy_bytes,
)

__all__ = ["NpzFile", "load", "open", "save"]

_ALIGN = 64  # data alignment of members we write (NumPy's ARRAY_ALIGN)
_ALIGN_EXTRA_ID = 0xD935  # the zip extra field Android's zipalign pads with
_ZIP64_EXTRA = 20  # the zip64 extra zipfile adds to a local header when forced
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature ... name length, extra length
_DEFLATE_MAX_RATIO = 1032  # deflate cannot expand data more than this

# the rules of tensorbridge._keys a member name is held to
NAMES = NameRules(
    (not_empty, no_nul, valid_unicode, forward_slashes, inside_container),
    same=npy_stem,
    same_means="are one member to np.load, which looks a key up as a member name first "
    "(the key 'a.npy' reads the member 'a.npy' of the key 'a')",
)


# --- writing ---------------------------------------------------------------------------------


def save(
    tensors: Mapping[str, Any],
    path: str | os.PathLike[str],
    *,
    float_dtype: DTypeLike | None = None,
    metadata: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    chunk_bytes: int = DEFAULT_CHUNK,
) -> None:
    """Write a mapping of names to tensors or arrays to a ``.npz``, streamed and atomic.

    Every member's header is worked out first, then the data is written about
    ``chunk_bytes`` at a time (cast on the way when ``float_dtype`` asks).

    >>> import os, tempfile, ml_dtypes, numpy as np
    >>> p = os.path.join(tempfile.mkdtemp(), "w.npz")
    >>> save({"w": np.ones(3, ml_dtypes.bfloat16)}, p)
    >>> load(p)["w"].dtype
    dtype(bfloat16)

    Args:
        tensors: a mapping of non-empty string names to tensors or arrays.
        path: the file (written whatever its suffix).
        float_dtype: cast floating-point values (only) to this dtype.
        metadata: must be empty: a ``.npz`` has no place for it.
        progress: show a progress bar (``None``: when stderr is a terminal).
        chunk_bytes: about how many bytes are converted at a time.

    Raises:
        UnsupportedDtypeError: a dtype with no row in the dtype table.
        InvalidNameError: a name :data:`NAMES` refuses.
        UnsupportedTensorError: not a mapping, a name that is no string, or a
            sparse/nested tensor.
        ValueError: ``metadata`` given.
    """
    path = Path(path)
    no_metadata(metadata, path)
    NAMES.check(mapping_of(tensors, repr(str(path)), "named arrays"), repr(str(path)))
    entries: list[tuple[str, Any]] = []
    for name, x in tensors.items():
        if not isinstance(name, str):
            raise UnsupportedTensorError(f"{str(path)!r}: .npz keys are strings, got {name!r}")
        if isinstance(x, NpyBytes):  # a member torch cannot hold, copied as it is
            x.check_cast(float_dtype, name)
            entries.append((name, x))
            continue
        try:
            entries.append((name, prepare(x, float_dtype)))
        except TensorBridgeError as err:
            raise type(err)(f"at {name!r}: {err}") from None
    sizes = [e.size if isinstance(e, NpyBytes) else len(e.header) + e.nbytes for _, e in entries]
    bar = progress_bar(sum(sizes), f"saving {path.name}", progress, tensors=len(entries))
    try:
        with atomic_write(path) as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as zf:
            for (name, e), size in zip(entries, sizes, strict=True):
                info = _member_info(f"{name}.npy", f.tell(), size)
                with zf.open(info, "w", force_zip64=True) as member:  # as np.savez does
                    if isinstance(e, NpyBytes):
                        write_npy_bytes(member, e, chunk_bytes, bar)
                    else:
                        write_entry(member, e, chunk_bytes, bar)
    finally:
        bar.close()


def _member_info(name: str, offset: int, size: int) -> zipfile.ZipInfo:
    """A stored member whose local-header extra pads its data to a 64-byte file offset."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))  # reproducible files
    info.compress_type = zipfile.ZIP_STORED
    info.file_size = size
    encoded = name.encode("ascii" if name.isascii() else "utf-8")
    pad = -(offset + _LOCAL_HEADER.size + len(encoded) + _ZIP64_EXTRA) % _ALIGN
    if pad:
        pad += _ALIGN if pad < 6 else 0  # the field itself takes 6 bytes
        info.extra = struct.pack("<HHH", _ALIGN_EXTRA_ID, pad - 4, _ALIGN) + bytes(pad - 6)
    return info


# --- reading ---------------------------------------------------------------------------------


class NpzFile(MappedFile):
    """A ``.npz`` archive: keys are the member names without ``.npy``; nothing read until asked."""

    def __init__(self, path: str | os.PathLike[str], *, dtype: DTypeLike | None = None) -> None:
        p = Path(path)
        where = repr(str(p))
        self._raw = raw_row(dtype)
        super().__init__(p)
        try:
            with self._reader() as f, zipfile.ZipFile(f) as zf:
                infos = zf.infolist()
        except ZIP_ERRORS as err:
            self.close()
            raise FormatError(f"{where}: not a readable .npz (zip) archive: {err}") from None
        except BaseException:
            self.close()
            raise
        self._members: dict[str, zipfile.ZipInfo] = {}
        for info in infos:
            if not info.filename:
                raise FormatError(f"{where}: a member has an empty name; the archive is corrupt")
            if info.filename.endswith("/"):
                continue  # a directory entry
            key = info.filename.removesuffix(".npy")
            if key in self._members:
                raise FormatError(f"{where}: two members are both named {key!r}")
            if not 0 <= info.header_offset <= self._size - _LOCAL_HEADER.size:
                raise FormatError(
                    f"{where}: member {info.filename!r} starts at {info.header_offset}, outside "
                    f"the file's {self._size} bytes; the archive is corrupt"
                )
            if info.flag_bits & 0x1:
                raise FormatError(f"{where}: member {info.filename!r} is encrypted")
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise FormatError(
                    f"{where}: member {info.filename!r} uses zip compression "
                    f"method {info.compress_type}; only stored and deflated "
                    "members (np.savez / np.savez_compressed) are read"
                )
            self._members[key] = info
        self._headers: dict[str, tuple[Header, int]] = {}

    def keys(self) -> list[str]:
        return list(self._members)

    def info(self, name: str) -> tuple[DTypeRow, tuple[int, ...]]:
        h, _ = self._header(name)
        return h.row, h.shape

    def _where(self, name: str) -> str:
        return f"{str(self._path)!r}, member {self._members[name].filename!r}"

    def _header(self, name: str) -> tuple[Header, int]:
        """The member's validated header, and its data offset in the file (-1: compressed)."""
        cached = self._headers.get(name)
        if cached is not None:
            return cached
        if name not in self._members:
            raise KeyError(f"{name!r} is not in this file; its keys are {self.keys()[:10]}")
        info, where = self._members[name], self._where(name)
        if info.compress_type == zipfile.ZIP_STORED:
            start = self._stored_start(info, where)
            mm = self._map(False)
            head = mm[start : start + min(info.file_size, HEAD_LIMIT)]
            h = parse_header(head, info.file_size, where, self._raw)
            result = (h, start + h.offset)
        else:
            limit = info.compress_size * _DEFLATE_MAX_RATIO + 1024
            if info.file_size > limit:
                raise FormatError(
                    f"{where}: declares {info.file_size} bytes from "
                    f"{info.compress_size} deflated ones, more than deflate "
                    "can produce; the archive is corrupt"
                )
            with _member(self._reader(), info, where) as f:
                head = f.read(min(info.file_size, HEAD_LIMIT))
            result = (parse_header(head, info.file_size, where, self._raw), -1)
        self._headers[name] = result
        return result

    def _stored_start(self, info: zipfile.ZipInfo, where: str) -> int:
        """Where a stored member's bytes begin, from its local header (checked in bounds)."""
        mm = self._map(False)
        off = info.header_offset  # in bounds: checked when the archive was opened
        sig, name_len, extra_len = _LOCAL_HEADER.unpack_from(mm, off)
        if sig != b"PK\x03\x04":
            raise FormatError(f"{where}: no local file header at offset {off}")
        start: int = off + _LOCAL_HEADER.size + name_len + extra_len
        if info.compress_size != info.file_size or start + info.file_size > len(mm):
            raise FormatError(
                f"{where}: its {info.file_size} stored bytes at {start} do not "
                f"fit the file's {len(mm)} bytes; the archive is truncated"
            )
        return start

    def npy_bytes(self, name: str) -> NpyBytes:
        self._header_or_raw(name)
        info, where = self._members[name], self._where(name)
        opener: Callable[[], AbstractContextManager[BinaryIO]]
        if info.compress_type == zipfile.ZIP_STORED:
            start = self._stored_start(info, where)
            head = bytes(self._map(False)[start : start + min(info.file_size, HEAD_LIMIT)])
            opener = lambda: open_at(self._reader(), start)  # noqa: E731
        else:
            with _member(self._reader(), info, where) as f:
                head = f.read(min(info.file_size, HEAD_LIMIT))
            opener = lambda: _member(self._reader(), info, where)  # noqa: E731
        stored, shape, _ = stored_header(head, info.file_size, where)
        return NpyBytes(where, stored, shape, info.file_size, opener, info.CRC)

    def _header_or_raw(self, name: str) -> None:
        """``name``'s header checks, whether or not torch can hold its dtype."""
        with contextlib.suppress(UnsupportedDtypeError):  # a dtype torch lacks: copied as is
            self._header(name)

    def _array(self, name: str, *, copy_on_write: bool) -> np.ndarray:
        h, start = self._header(name)
        if start >= 0:
            return view_data(self._map(copy_on_write), start, h)
        return self._owned(name)

    def _owned(self, name: str) -> np.ndarray:
        h, start = self._header(name)
        info, where = self._members[name], self._where(name)
        if start < 0:
            with _member(self._reader(), info, where) as f:
                f.read(h.offset)
                return read_data(f, h, where)
        mm = self._map(False)
        first = start - h.offset
        with memoryview(mm) as whole, whole[first : first + info.file_size] as member:
            if zlib.crc32(member) != info.CRC:  # a mapped read skips this: it reads nothing
                raise FormatError(f"{where}: the data does not match its CRC; the file is corrupt")
        return np.array(view_data(mm, start, h), copy=True)


@contextlib.contextmanager
def _member(file: BinaryIO, info: zipfile.ZipInfo, where: str) -> Iterator[BinaryIO]:
    """A deflated member of the opened ``file`` as a stream; zip and zlib failures become
    :class:`FormatError`."""
    try:
        with file, zipfile.ZipFile(file) as zf, zf.open(info) as f:
            yield f  # type: ignore[misc]
    except ZIP_ERRORS as err:
        raise FormatError(f"{where}: corrupt member data: {err}") from None


def open(path: str | os.PathLike[str], *, dtype: DTypeLike | None = None) -> TensorFile:
    """Open a ``.npz`` lazily: keys are the member names without ``.npy``.

    Only the zip directory is read; a member's header is validated when it is first
    asked about. ``dtype`` names the type of raw-byte members (``np.save`` of an
    ml_dtypes array writes bfloat16 as ``|V2``): members of its width are read as it,
    every other member keeps its own dtype.

    >>> import os, tempfile, numpy as np
    >>> p = os.path.join(tempfile.mkdtemp(), "a.npz")
    >>> save({"x": np.arange(3), "y": np.zeros((2, 2))}, p)
    >>> with open(p) as f:
    ...     f.keys(), f.info("y")[1], f["x"].flags.writeable
    (['x', 'y'], (2, 2), False)

    Raises:
        FormatError: the file is not a valid ``.npz``.
    """
    return NpzFile(path, dtype=dtype)


load = loader(
    open,
    """Read a ``.npz``: a dict of its arrays (or tensors) by name.

    With ``mmap=True`` NumPy results are read-only views of the mapped file and torch
    results copy-on-write mappings; deflated members are read into memory either way.

    >>> import os, tempfile, torch
    >>> p = os.path.join(tempfile.mkdtemp(), "t.npz")
    >>> save({"t": torch.tensor([1.5, 2.0], dtype=torch.bfloat16)}, p)
    >>> load(p, framework="torch")
    {'t': tensor([1.5000, 2.0000], dtype=torch.bfloat16)}

    Args:
        framework: ``"numpy"`` or ``"torch"``.
        mmap: map the file (zero-copy) rather than read it into owned memory.
        device: where torch results go.
        float_dtype: cast floating-point values (only) to this dtype.
        keys: the names to read.
        dtype: the type of raw-byte members written by ``np.save`` from ml_dtypes arrays.
    """,
)
