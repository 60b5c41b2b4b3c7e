"""``.npy``: NumPy's own file of one array, with bfloat16, float8 and complex32 kept.

The format is NumPy's (``numpy.lib.format``): magic, a header that is a Python dict
literal ``{'descr', 'fortran_order', 'shape'}``, then the raw bytes. A ``.npz``
(:mod:`tensorbridge.io.npz`) is a zip of such files, built from this module's parts.

**The bit-carrier convention.** NumPy has no descr for the ml_dtypes types (``np.save``
writes bfloat16 as raw ``'<V2'`` and float8_e5m2 as ``'<f1'``, which ``np.load``
refuses), and ``np.load`` rejects any header key beyond the three above, so the true
dtype cannot ride in an extra key. tensorbridge writes every row of the dtype table that
has a carrier as a *one-field structured dtype named after the dtype, whose field is the
same-width little-endian unsigned integer*: bfloat16 -> ``[('bfloat16', '<u2')]``, each
float8 -> ``[('float8_e4m3fn', '|u1')]``, complex32 -> ``[('complex32', '<u4')]``. Plain
``np.load`` opens such a file without error (``a['bfloat16']`` is the raw bits,
``a.view(ml_dtypes.bfloat16)`` the values), every reader that knows structured dtypes can
too, and tensorbridge reads it back as the real dtype. Exactly that descr is recognised,
nothing looser. Native dtypes get the standard header: for them the file is
byte-identical to ``np.save`` (Fortran-ordered arrays included).

**Reading** validates every header before mapping anything: magic and version, header
length within ``MAX_HEADER_SIZE`` and the file, a literal-only parse (``ast.literal_eval``,
never pickle; Python 2's ``2L`` integers in version 1.0 / 2.0 headers are read as
``np.load`` reads them), exactly the three keys, a shape of non-negative ints, and a data length
equal to the shape times the item size, to the byte. Object arrays are refused. Any
violation raises :class:`~tensorbridge.FormatError` naming the file (and member).
With ``mmap=True`` NumPy results are read-only views of the file; torch results share one
copy-on-write mapping per opened file (writes never reach the file).

**A directory of ``.npy`` files** (a chunked checkpoint converted with
``format="npy"``) names each file ``NAME.npy``: :data:`DIRECTORY_NAMES` holds names to
what one file name can carry (not empty, no NUL, no lone surrogate, no ``/`` or ``\\``,
not only periods) and refuses two names that differ only in case.
"""

from __future__ import annotations

import abc
import builtins
import contextlib
import io
import mmap
import os
import weakref
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from .._atomic import atomic_write
from .._chunks import DEFAULT_CHUNK, iter_bytes
from .._filemap import FileReader, check_unchanged, open_reader
from .._keys import NameRules, case_insensitive, no_nul, not_empty, one_file_name, valid_unicode
from .._progress import progress_bar
from .._tensorfile import StoredBits, TensorFile, cast_target, row_of
from .._torch_checks import is_tensor
from ..dtypes import (
    DTypeLike,
    DTypeRow,
)
from ..errors import (
    FormatError,
    NoDataError,
    UnsupportedDtypeError,
    UnsupportedTensorError,
)
from ._common import loader
from ._formats import Layout, PlannedFile
from ._npy_header import (
    HEAD_LIMIT,
    MAX_HEADER_SIZE,
    Header,
    disk_dtype,
    header_bytes,
    parse_header,
    raw_row,
    read_data,
    stored_header,
    view_data,
)

__all__ = [
    "MAX_HEADER_SIZE",
    "NpyBytes",
    "NpyDirectory",
    "NpyEntries",
    "NpyFile",
    "disk_dtype",
    "load",
    "open",
    "save",
]

# a directory of NAME.npy files: the rules of tensorbridge._keys each NAME is held to
DIRECTORY_NAMES = NameRules(
    (not_empty, no_nul, valid_unicode, one_file_name),
    same=case_insensitive,
    same_means="differ only in case: as files NAME.npy they are one on a case-insensitive "
    "filesystem (macOS, Windows)",
)


# --- writing ---------------------------------------------------------------------------------


class Entry(NamedTuple):
    """One array to write: its data, stored dtype, header bytes and data size."""

    data: Any  # tensor or array, streamed in C order
    dst: DTypeRow
    header: bytes
    nbytes: int


def prepare(x: Any, float_dtype: Any) -> Entry:
    """Everything a header needs, worked out before a byte is written."""
    if is_tensor(x):
        import torch

        if x.layout is not torch.strided or x.is_nested:
            raise UnsupportedTensorError(
                f"a {x.layout}{' nested' if x.is_nested else ''} tensor has no .npy layout; "
                "pass x.to_dense() (or save its parts)"
            )
        if x.device.type == "meta":
            raise NoDataError(f"a meta tensor (shape {tuple(x.shape)}) holds no data to save")
        shape = tuple(int(n) for n in x.shape)
        reverse = x.permute(*range(x.ndim)[::-1]) if x.ndim > 1 else x
        fortran = not x.is_contiguous() and reverse.is_contiguous()  # as np.save decides
        data: Any = reverse if fortran else x
    elif isinstance(x, StoredBits):  # a file's bytes, copied: C order
        shape, fortran, data = x.shape, False, x
    else:
        a = x if isinstance(x, np.ndarray) else np.asarray(x)
        shape = a.shape
        fortran = a.flags.f_contiguous and not a.flags.c_contiguous  # as np.save decides
        data = a.T if fortran else a
    dst = cast_target(row_of(data), float_dtype)
    return Entry(data, dst, header_bytes(dst, shape, fortran), prod(shape) * dst.itemsize)


@dataclass(frozen=True)
class NpyBytes:
    """A whole ``.npy`` (header and data) of a dtype torch cannot hold (float128,
    strings, structured), carried unchanged from one NumPy file to another.

    Its values are never read: the bytes are copied, their header validated first
    (object arrays, a pickle, are refused, not copied). A NumPy writer (``.npy``,
    ``.npz``) takes it as a value.
    """

    where: str  # the file (and member), for messages
    stored: np.dtype[Any]
    shape: tuple[int, ...]
    size: int  # of the whole .npy
    opener: Callable[[], AbstractContextManager[BinaryIO]]  # its bytes, from the magic on
    crc: int | None = None  # a zip member's CRC-32, checked as the bytes are copied

    def check_cast(self, float_dtype: Any, name: str) -> None:
        """Refuse a cast of a carried floating-point array: no torch dtype can do it."""
        if float_dtype is not None and self.stored.kind in "fc":
            raise UnsupportedDtypeError(
                f"at {name!r}: {self.stored} has no torch dtype, so it is copied unchanged "
                "and cannot be cast; leave it out, or convert without a cast"
            )


def write_npy_bytes(f: Any, e: NpyBytes, chunk_bytes: int, bar: Any) -> None:
    """Copy ``e``'s bytes to ``f``, checking their length (and CRC) against what was read."""
    done, crc = 0, 0
    with e.opener() as src:
        while done < e.size:
            chunk = src.read(min(chunk_bytes, e.size - done))
            if not chunk:
                break
            f.write(chunk)
            crc = zlib.crc32(chunk, crc)
            done += len(chunk)
            bar.update(len(chunk))
    if done != e.size:
        raise FormatError(f"{e.where}: the file changed while it was copied; open it again")
    if e.crc is not None and crc != e.crc:
        raise FormatError(f"{e.where}: the data does not match its CRC; the file is corrupt")


@contextlib.contextmanager
def open_at(file: BinaryIO, start: int) -> Iterator[BinaryIO]:
    """``file`` (a stream of its own over an opened file) read from byte ``start``."""
    with file as f:
        f.seek(start)
        yield f


class NpyEntries(TensorFile):
    """A reader whose entries are ``.npy`` bytes (``.npy``, ``.npz``, a directory of them):
    an entry torch cannot hold can still be copied to another NumPy file unchanged."""

    @abc.abstractmethod
    def npy_bytes(self, name: str) -> NpyBytes:
        """Entry ``name``'s whole ``.npy``, to copy unchanged.

        Raises:
            UnsupportedDtypeError: an object array (a pickle): never read, never copied.
        """


def write_entry(f: Any, e: Entry, chunk_bytes: int, bar: Any) -> None:
    f.write(e.header)
    bar.update(len(e.header))
    for chunk in iter_bytes(e.data, e.dst, chunk_bytes):
        f.write(chunk)
        bar.update(len(chunk))


def save(
    tensors: Any,
    path: str | os.PathLike[str],
    *,
    float_dtype: DTypeLike | None = None,
    metadata: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    chunk_bytes: int = DEFAULT_CHUNK,
) -> None:
    """Write one tensor or array to ``.npy``, streamed and atomic.

    The header is worked out first, then the data is written about ``chunk_bytes`` at
    a time (cast on the way when ``float_dtype`` asks), so a memory-mapped input larger
    than RAM needs about one chunk of memory. It writes ``.npy`` bytes whatever the
    path is called (``tb.save`` picks the format by suffix).

    >>> import os, tempfile, ml_dtypes, numpy as np
    >>> p = os.path.join(tempfile.mkdtemp(), "w.npy")
    >>> save(np.ones(3, ml_dtypes.bfloat16), p)
    >>> np.load(p).dtype, load(p).dtype
    (dtype([('bfloat16', '<u2')]), dtype(bfloat16))

    Args:
        tensors: a tensor or array.
        path: the file.
        float_dtype: cast floating-point values (only) to this dtype.
        metadata: must be empty: a ``.npy`` has no place for it.
        progress: show a progress bar (``None``: when stderr is a terminal).
        chunk_bytes: about how many bytes are converted at a time.

    Raises:
        UnsupportedDtypeError: a dtype with no row in the dtype table.
        UnsupportedTensorError: a sparse/nested tensor, or a mapping.
        ValueError: ``metadata`` given.
    """
    path = Path(path)
    no_metadata(metadata, path)
    if isinstance(tensors, Mapping):
        raise UnsupportedTensorError(
            f"{str(path)!r}: a .npy file holds one array, got a mapping of {len(tensors)}; "
            "save to a .npz path, or pass one tensor"
        )
    if isinstance(tensors, NpyBytes):  # a .npy of a dtype torch lacks, copied as it is
        tensors.check_cast(float_dtype, path.stem)
        bar = progress_bar(tensors.size, f"saving {path.name}", progress)
        try:
            with atomic_write(path) as f:
                write_npy_bytes(f, tensors, chunk_bytes, bar)
        finally:
            bar.close()
        return
    e = prepare(tensors, float_dtype)
    bar = progress_bar(len(e.header) + e.nbytes, f"saving {path.name}", progress)
    try:
        with atomic_write(path) as f:
            write_entry(f, e, chunk_bytes, bar)
    finally:
        bar.close()


def no_metadata(metadata: Mapping[str, Any] | None, path: Path) -> None:
    """Refuse ``metadata``: ``.npy`` and ``.npz`` headers have no place for it."""
    if metadata:
        raise ValueError(
            f"{str(path)!r}: {path.suffix or 'this'} files have no place for metadata; leave "
            f"out metadata= ({', '.join(map(str, list(metadata)[:5]))})"
        )


# --- reading ---------------------------------------------------------------------------------


class MappedFile(NpyEntries):
    """A file read through one read-only and one copy-on-write map (``.npy``, ``.npz``).

    The file is opened once: both maps and every read come from that descriptor, so
    a handle keeps reading the version it opened when another save replaces the path.
    """

    def __init__(self, path: Path) -> None:
        super().__init__()
        self._path = path
        self._fd, self._size = open_reader(path)
        # a plain descriptor closed on collection: dropping an unclosed file stays quiet
        self._closer = weakref.finalize(self, os.close, self._fd)
        self._maps: dict[bool, Any] = {}

    def _reader(self) -> io.BufferedReader:
        """The opened file as a stream of its own (its position shared with no one)."""
        if not self._closer.alive:
            raise ValueError(f"{str(self._path)!r} is closed; open it again")
        return io.BufferedReader(FileReader(self._fd, self._size))

    def _map(self, copy_on_write: bool) -> Any:
        mm = self._maps.get(copy_on_write)
        if mm is not None:
            check_unchanged(self._fd, self._size, repr(str(self._path)))
        else:
            if not self._closer.alive:
                raise ValueError(f"{str(self._path)!r} is closed; open it again")
            check_unchanged(self._fd, self._size, repr(str(self._path)))
            if self._size == 0:
                return b""
            access = mmap.ACCESS_COPY if copy_on_write else mmap.ACCESS_READ
            mm = self._maps[copy_on_write] = mmap.mmap(self._fd, 0, access=access)
        return mm

    def close(self) -> None:
        self._maps.clear()  # handed-out arrays keep their mapping alive
        self._closer()


class NpyFile(MappedFile):
    """One ``.npy`` file; its single key is the file's stem."""

    single = True

    def __init__(self, path: str | os.PathLike[str], *, dtype: DTypeLike | None = None) -> None:
        p = Path(path)
        super().__init__(p)
        self.name = p.stem
        self._refused: UnsupportedDtypeError | None = None
        try:
            with self._reader() as f:
                head = f.read(min(self._size, HEAD_LIMIT))
            try:
                self._header: Header | None = parse_header(
                    head, self._size, repr(str(p)), raw_row(dtype)
                )
            except UnsupportedDtypeError as err:  # well formed, but no torch dtype: copyable
                stored_header(head, self._size, repr(str(p)))  # the rest valid, objects refused
                self._header, self._refused = None, err
        except BaseException:
            self.close()
            raise

    @property
    def header(self) -> Header:
        """The validated header (a dtype torch cannot hold raises the reader's refusal)."""
        if self._header is None:
            assert self._refused is not None
            raise UnsupportedDtypeError(str(self._refused))
        return self._header

    def keys(self) -> list[str]:
        return [self.name]

    def info(self, name: str) -> tuple[DTypeRow, tuple[int, ...]]:
        self._check(name)
        return self.header.row, self.header.shape

    def _array(self, name: str, *, copy_on_write: bool) -> np.ndarray:
        self._check(name)
        return view_data(self._map(copy_on_write), self.header.offset, self.header)

    def _owned(self, name: str) -> np.ndarray:
        self._check(name)
        with self._reader() as f:
            f.seek(self.header.offset)
            return read_data(f, self.header, repr(str(self._path)))

    def npy_bytes(self, name: str) -> NpyBytes:
        self._check(name)
        where = repr(str(self._path))
        with builtins.open(self._path, "rb") as f:
            head = f.read(min(self._size, HEAD_LIMIT))
        stored, shape, _ = stored_header(head, self._size, where)
        return NpyBytes(where, stored, shape, self._size, lambda: open_at(self._reader(), 0))

    def _check(self, name: str) -> None:
        if name != self.name:
            raise KeyError(f"{name!r} is not in this file; its one key is {self.name!r}")


class NpyDirectory(NpyEntries):
    """A directory of ``NAME.npy`` files, one entry each, named by the file's stem.

    ``convert dcp/ out/ --format npy`` writes one (``tb.save(tb.open(dcp), out,
    format="npy")``). Every file's header is validated when the directory is opened;
    each file is mapped when first read. Other files in the directory are ignored.
    """

    def __init__(self, path: str | os.PathLike[str], *, dtype: DTypeLike | None = None) -> None:
        super().__init__()
        self.path = Path(path)
        self._files: dict[str, NpyFile] = {}
        try:
            for p in sorted(self.path.glob("*.npy")):
                if p.is_file():
                    self._files[p.stem] = NpyFile(p, dtype=dtype)
        except BaseException:
            self.close()
            raise
        if not self._files:
            raise FileNotFoundError(f"{self.path} holds no .npy file")

    def keys(self) -> list[str]:
        return list(self._files)

    def _file(self, name: str) -> NpyFile:
        try:
            return self._files[name]
        except KeyError:
            keys = self.keys()[:10]
            raise KeyError(f"{name!r} is not in {self.path}; its keys are {keys}") from None

    def info(self, name: str) -> tuple[DTypeRow, tuple[int, ...]]:
        return self._file(name).info(name)

    def _array(self, name: str, *, copy_on_write: bool) -> np.ndarray:
        return self._file(name)._array(name, copy_on_write=copy_on_write)

    def _owned(self, name: str) -> np.ndarray:
        return self._file(name)._owned(name)

    def npy_bytes(self, name: str) -> NpyBytes:
        return self._file(name).npy_bytes(name)

    def close(self) -> None:
        for f in self._files.values():
            f.close()


def open(path: str | os.PathLike[str], *, dtype: DTypeLike | None = None) -> TensorFile:
    """Open a ``.npy`` lazily (one key: the file's stem); its header is validated.

    ``dtype`` names the type of raw-byte data (``np.save`` of an ml_dtypes array
    writes bfloat16 as ``|V2`` and float8_e5m2 as ``<f1``). The bytes must be a
    ``.npy``, whatever the name (``tb.open`` picks the reader by content).

    >>> import os, tempfile, numpy as np
    >>> p = os.path.join(tempfile.mkdtemp(), "a.npy")
    >>> save(np.zeros((2, 2)), p)
    >>> with open(p) as f:
    ...     f.keys(), f.info("a")[1], f["a"].flags.writeable
    (['a'], (2, 2), False)

    Raises:
        FormatError: the file is not a valid ``.npy``.
    """
    return NpyFile(Path(path), dtype=dtype)


def assembly(
    entries: list[tuple[str, DTypeRow, tuple[int, ...]]],
    target: Path,
    *,
    metadata: Mapping[str, Any] | None = None,
    max_shard_size: int | str | None = None,
    index: bool = False,
) -> Layout:
    """A chunked checkpoint converted to the directory ``target`` (the row's ``assembles``,
    ``format="npy"``): ``NAME.npy`` per tensor, its header first. No metadata, no shards:
    the caller refuses them."""
    DIRECTORY_NAMES.check([n for n, _, _ in entries], repr(str(target)))
    files, placed = [], []
    for n, row, shape in entries:
        head = header_bytes(row, shape)
        nbytes = prod(shape) * row.itemsize
        final = target / f"{n}.npy"
        files.append(PlannedFile(final, head, len(head) + nbytes))
        placed.append((n, final, len(head), nbytes))
    return Layout(target, tuple(files), tuple(placed), creates=not target.exists())


load = loader(
    open,
    """Read a ``.npy``: its one array or tensor.

    With ``mmap=True`` NumPy results are read-only views of the mapped file and torch
    results copy-on-write mappings (writable; writes never reach the file).

    >>> import os, tempfile, torch
    >>> p = os.path.join(tempfile.mkdtemp(), "t.npy")
    >>> save(torch.tensor([1.5, 2.0], dtype=torch.bfloat16), p)
    >>> load(p, framework="torch")
    tensor([1.5000, 2.0000], dtype=torch.bfloat16)

    Args:
        framework: ``"numpy"`` or ``"torch"``.
        mmap: map the file (zero-copy) rather than read it into owned memory.
        device: where torch results go.
        float_dtype: cast floating-point values (only) to this dtype.
        keys: ``None``, or the one key (the file's stem).
        dtype: the type of raw-byte data written by ``np.save`` from ml_dtypes arrays.
    """,
)
