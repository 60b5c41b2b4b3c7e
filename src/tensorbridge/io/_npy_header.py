"""The ``.npy`` header and the dtype convention: writing, parsing and validating headers.

What :mod:`tensorbridge.io.npy`'s docstring specifies, as code: the bit-carrier
convention (:func:`disk_dtype`, derived from the dtype table), a header's bytes for a
row and shape (:func:`header_bytes`), and the untrusting parse of a header
(:func:`parse_header`: magic and version, length, a literal-only dict, exactly the three
keys, the data length to the byte) with the data it describes (:func:`view_data`,
:func:`read_data`). Both ``.npy`` and ``.npz`` (:mod:`tensorbridge.io.npz`) read and
write through it; :mod:`tensorbridge.io.npy` re-exports what they import.

>>> import tensorbridge as tb
>>> parse_header(header_bytes(tb.resolve_dtype("bf16"), (2,)), 132, "x.npy").shape
(2,)
"""

from __future__ import annotations

import ast
import io
import struct
import tokenize
from math import prod
from tokenize import TokenError
from typing import Any, BinaryIO, NamedTuple

import numpy as np
from numpy.lib import format as npformat

from .._versions import NUMPY_MAXDIMS
from ..dtypes import (
    DTypeRow,
    dtype_table,
    explain_numpy,
    resolve_dtype,
    row_of_numpy,
)
from ..errors import (
    FormatError,
    UnsupportedDtypeError,
)

MAGIC = b"\x93NUMPY"
MAX_HEADER_SIZE = 10_000  # characters, numpy's own default for untrusted files
_LENGTH_FORMAT = {1: "<H", 2: "<I", 3: "<I"}  # header-length field per major version
_ENCODING = {1: "latin1", 2: "latin1", 3: "utf8"}
_MAX_NDIM = NUMPY_MAXDIMS  # 32 on NumPy 1.x
HEAD_LIMIT = len(MAGIC) + 2 + 4 + MAX_HEADER_SIZE * 4  # utf8: up to 4 bytes a character


# --- the convention, derived from the table --------------------------------------------------


def disk_dtype(row: DTypeRow) -> np.dtype[Any]:
    """The dtype a ``.npy`` header records for ``row`` (see the module docstring).

    >>> import tensorbridge as tb
    >>> disk_dtype(tb.resolve_dtype("bf16"))
    dtype([('bfloat16', '<u2')])
    >>> disk_dtype(tb.resolve_dtype("f32"))
    dtype('float32')
    """
    return _DISK[row]


_DISK: dict[DTypeRow, np.dtype[Any]] = {
    r: np.dtype([(r.name, f"<u{r.itemsize}")]) if r.carried else r.numpy for r in dtype_table()
}
_BY_DISK: dict[np.dtype[Any], DTypeRow] = {d: r for r, d in _DISK.items()}
# What np.save writes for ml_dtypes arrays: raw void of the width, except float8_e5m2
# ('<f1') and complex32 ('<c4'), descrs NumPy itself cannot parse. The bytes are kept;
# the type is lost, so only the reader's dtype= can restore it.
_RAW_ROWS: dict[int, list[DTypeRow]] = {}
for _r in _DISK:
    if _r.carried:
        _RAW_ROWS.setdefault(_r.itemsize, []).append(_r)
_RAW = {np.dtype(f"V{w}") for w in _RAW_ROWS}
_RAW_DESCR = {d: np.dtype(f"V{w}") for d, w in (("<f1", 1), ("|f1", 1), ("<c4", 4))}


# --- headers ---------------------------------------------------------------------------------


class Header(NamedTuple):
    """A validated ``.npy`` header: what it holds and where its data starts."""

    row: DTypeRow
    stored: np.dtype[Any]  # the dtype as on disk (the carrier, or a byte-swapped one)
    shape: tuple[int, ...]
    fortran: bool
    offset: int  # of the data, from the start of the .npy bytes
    nbytes: int


def header_bytes(row: DTypeRow, shape: tuple[int, ...], fortran: bool = False) -> bytes:
    """The magic, version, length and header of a ``.npy`` holding ``row`` values of ``shape``.

    NumPy's own header writer, so native dtypes get exactly ``np.save``'s bytes.
    """
    d = {"descr": npformat.dtype_to_descr(_DISK[row]), "fortran_order": fortran, "shape": shape}
    buf = io.BytesIO()
    try:
        npformat.write_array_header_1_0(buf, d)
    except ValueError:  # more than 64 KiB of header: format 2.0, as np.save does
        buf = io.BytesIO()
        npformat.write_array_header_2_0(buf, d)
    return buf.getvalue()


def header_literal(text: str, major: int) -> Any:
    """The header's dict, read as ``np.load`` reads it (``numpy/lib/_format_impl.py``).

    ``ast.literal_eval`` first (literals only: never calls, never pickles). Python 2
    wrote long integers with an ``L`` suffix (``'shape': (2L,)``, NumPy's own
    ``win64python2.npy``); for a version 1.0 or 2.0 header that is not a literal, NumPy
    drops each ``L`` token that directly follows a number (``_filter_header``) and
    tries again: so does this, with the same tokenizer, which only splits text.

    >>> header_literal("{'shape': (2L, 3L), }", 1)
    {'shape': (2, 3)}
    """
    try:
        return ast.literal_eval(text)
    except SyntaxError:
        if major > 2:  # NumPy never wrote version 3.0 on Python 2
            raise
    tokens: list[tokenize.TokenInfo] = []
    after_number = False
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if not (after_number and token.type == tokenize.NAME and token.string == "L"):
            tokens.append(token)
        after_number = token.type == tokenize.NUMBER
    return ast.literal_eval(tokenize.untokenize(tokens))


def parse_header(head: bytes, size: int, where: str, raw: DTypeRow | None = None) -> Header:
    """Validate the start of a ``.npy`` (``head``: its first bytes) holding ``size`` bytes.

    ``raw`` is the dtype to read raw bytes as: ``np.save`` of an ml_dtypes array writes
    raw void (``|V2`` for bfloat16, ``|V1`` for most float8) or, for float8_e5m2, ``<f1``,
    and only the user can say which type it was. Members of another dtype ignore it.

    Raises:
        FormatError: anything malformed; the message starts with ``where``.
        UnsupportedDtypeError: a well-formed file of a dtype with no torch counterpart.
    """
    stored, shape, fortran, offset = _fields(head, size, where)
    row = _row_of_stored(stored, where, raw)
    nbytes = _data_size(stored, shape, offset, size, row.name, where)
    return Header(row, stored, shape, fortran, offset, nbytes)


def stored_header(head: bytes, size: int, where: str) -> tuple[np.dtype[Any], tuple[int, ...], int]:
    """The stored dtype, shape and data size of a ``.npy`` of any dtype but objects,
    validated as :func:`parse_header` does, for copying it unchanged (:class:`NpyBytes`)."""
    stored, shape, _, offset = _fields(head, size, where)
    return stored, shape, _data_size(stored, shape, offset, size, str(stored), where)


def _fields(head: bytes, size: int, where: str) -> tuple[np.dtype[Any], tuple[int, ...], bool, int]:
    """The header's dtype, shape, order and data offset, validated; object arrays refused."""

    def bad(problem: str) -> FormatError:
        return FormatError(f"{where}: {problem}")

    if len(head) < len(MAGIC) + 2 or head[: len(MAGIC)] != MAGIC:
        raise bad(
            f"not a .npy file (it starts with {bytes(head[:8])!r}, not the .npy magic {MAGIC!r})"
        )
    major, minor = head[len(MAGIC)], head[len(MAGIC) + 1]
    fmt = _LENGTH_FORMAT.get(major)
    if fmt is None or minor != 0:
        raise bad(f".npy format version {major}.{minor} is unknown (1.0, 2.0 and 3.0 exist)")
    start = len(MAGIC) + 2 + struct.calcsize(fmt)
    if len(head) < start:
        raise bad(f"truncated: {size} bytes end inside the header length field")
    (hlen,) = struct.unpack_from(fmt, head, len(MAGIC) + 2)
    if hlen > MAX_HEADER_SIZE * (4 if major == 3 else 1):
        raise bad(
            f"the header claims {hlen} bytes, more than the {MAX_HEADER_SIZE} a .npy "
            "header may have here; the file is corrupt or not a plain array"
        )
    if start + hlen > size:
        raise bad(f"truncated: the header needs {start + hlen} bytes, the file has {size}")
    try:
        text = bytes(head[start : start + hlen]).decode(_ENCODING[major])
    except UnicodeDecodeError:
        raise bad("the header is not valid text") from None
    if len(text) > MAX_HEADER_SIZE:
        raise bad(f"the header has {len(text)} characters, more than {MAX_HEADER_SIZE}")
    try:
        d = header_literal(text, major)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError, TokenError):
        raise bad(f"the header is not a Python literal: {text.strip()[:200]!r}") from None
    if not isinstance(d, dict) or set(d) != {"descr", "fortran_order", "shape"}:
        got = sorted(map(str, d)) if isinstance(d, dict) else type(d).__name__
        raise bad(
            f"the header must be a dict of exactly 'descr', 'fortran_order' and 'shape', got {got}"
        )
    shape, fortran, descr = d["shape"], d["fortran_order"], d["descr"]
    if (
        not isinstance(shape, tuple)
        or len(shape) > _MAX_NDIM
        or not all(type(n) is int and n >= 0 for n in shape)
    ):
        raise bad(f"shape {shape!r} is not a tuple of at most {_MAX_NDIM} non-negative ints")
    if not isinstance(fortran, bool):
        raise bad(f"fortran_order {fortran!r} is not a bool")
    stored = _RAW_DESCR.get(descr) if isinstance(descr, str) else None
    if stored is None:
        try:
            stored = npformat.descr_to_dtype(descr)
        except Exception:  # NumPy's descr parser raises anything from TypeError to SyntaxError
            raise bad(f"descr {descr!r} is not a dtype NumPy knows") from None
    if stored.hasobject:
        raise UnsupportedDtypeError(
            f"{where}: descr {descr!r} holds Python objects, which only pickle can read; "
            "tensorbridge never unpickles, and does not copy them to another file either "
            "(np.load(path, allow_pickle=True) if you trust the file)"
        )
    return stored, shape, fortran, start + hlen


def _data_size(
    stored: np.dtype[Any], shape: tuple[int, ...], offset: int, size: int, what: str, where: str
) -> int:
    """The data's size, which must be exactly what follows the header."""
    nbytes = prod(shape) * stored.itemsize
    if offset + nbytes != size:
        fault = "truncated" if offset + nbytes > size else "trailing bytes"
        raise FormatError(
            f"{where}: {fault}: shape {shape} of {what} needs {nbytes} data bytes after the "
            f"{offset}-byte header, the file holds {size - offset}"
        )
    return nbytes


def _row_of_stored(stored: np.dtype[Any], where: str, raw: DTypeRow | None) -> DTypeRow:
    row = _BY_DISK.get(stored)
    if row is not None:
        return row
    if stored.names is None and stored.kind != "V":
        row = row_of_numpy(stored.newbyteorder("="))
        if row is not None and not row.carried:
            return row  # byte-swapped: read as stored, converted on the way out
    if stored in _RAW:
        width = stored.itemsize
        if raw is not None and raw.carried and raw.itemsize == width:
            return raw
        kinds = ", ".join(r.name for r in _RAW_ROWS[width])
        if raw is not None:
            raise UnsupportedDtypeError(
                f"{where}: dtype={raw.name!r} does not fit raw {width}-byte data; the "
                f"{width}-byte types are {kinds}"
            )
        raise UnsupportedDtypeError(
            f"{where}: raw {width}-byte data: np.save writes ml_dtypes arrays this way and "
            f"drops their dtype; name it with dtype=, e.g. tb.load(path, "
            f"dtype={_RAW_ROWS[width][0].name!r}) (command line: --as-dtype "
            f"{_RAW_ROWS[width][0].name}); the {width}-byte types are {kinds}"
        )
    raise UnsupportedDtypeError(f"{where}: {explain_numpy(stored)}")


def view_data(buf: Any, start: int, h: Header) -> np.ndarray:
    """A zero-copy array of ``h``'s data at ``start`` of ``buf`` (a mapping or bytes)."""
    flat = np.frombuffer(buf, h.stored, count=prod(h.shape), offset=start)
    if h.row.carried:
        flat = flat.view(h.row.numpy)  # the bit-carrier convention, or raw bytes named by dtype=
    shaped: np.ndarray = flat.reshape(h.shape[::-1]).T if h.fortran else flat.reshape(h.shape)
    return shaped


def read_data(f: BinaryIO, h: Header, where: str) -> np.ndarray:
    """Read ``h``'s data from the stream ``f`` (positioned at it) into new memory."""
    out = np.empty(h.nbytes, np.uint8)
    view, got = out.data, 0
    while got < h.nbytes:
        n = f.readinto(view[got:])  # type: ignore[attr-defined]
        if not n:
            raise FormatError(f"{where}: truncated: {h.nbytes - got} data bytes are missing")
        got += n
    if f.read(1):  # reading to the end also makes zipfile check the member's CRC
        raise FormatError(f"{where}: more data than shape {h.shape} holds")
    return view_data(out, 0, h)


def raw_row(dtype: Any) -> DTypeRow | None:
    """The row a reader's ``dtype=`` names for raw-byte data (None: not given).

    Raises:
        UnsupportedDtypeError: a dtype that is no raw-byte type (it has no bit carrier).
    """
    if dtype is None:
        return None
    row = resolve_dtype(dtype)
    if not row.carried:
        raise UnsupportedDtypeError(
            f"dtype={dtype!r} names raw bytes that np.save wrote from an ml_dtypes array, so it "
            f"is one of {', '.join(r.name for rs in _RAW_ROWS.values() for r in rs)}; to cast "
            "values pass float_dtype="
        )
    return row
