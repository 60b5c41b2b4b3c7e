"""HDF5 datatypes and the dtype table: the row a dataset's type holds, what a row is written as.

**Reading** decides from the HDF5 type itself, never from h5py's NumPy dtype (h5py
widens what it cannot name: HDF5 2.0's bfloat16 comes back as float32, its float8 as
float16). :func:`stored_type` takes the type's class and, for floats, its bit layout:

* integers of 1, 2, 4 or 8 bytes (full precision, no offset), either byte order;
* floats by their layout, as the HDF5 type states it (size, precision, offset, sign,
  exponent and mantissa positions and sizes, exponent bias, implied mantissa bit,
  zero padding), matched against every floating row of the table, whose layout
  comes from ``ml_dtypes.finfo``: IEEE float16 / float32 / float64, and HDF5 2.0's
  ``H5T_FLOAT_BFLOAT16LE``/``BE``, ``H5T_FLOAT_F8E4M3`` and ``H5T_FLOAT_F8E5M2`` (or
  any type a program built with the same fields, ``H5Tset_fields``). Two rows of one
  layout (OCP's E4M3 and ml_dtypes' IEEE-style ``float8_e4m3``, which differ only in
  which codes are NaN and infinity) are told apart the way HDF5 names the type:
  ``H5T_FLOAT_F8E4M3`` is OCP FP8 E4M3, ``float8_e4m3fn`` (the HDF5 reference manual
  warns that HDF5's own conversions may turn some of its values into infinities or
  NaN, which only a type without infinities suffers);
* h5py's bool (an enum of int8 with ``FALSE = 0`` and ``TRUE = 1``); other enums as
  their base integer, as h5py reads them;
* complex: HDF5 2.0's complex class, or a compound of two equal floats at offsets 0
  and half the size named ``r``/``i`` (h5py's convention) or ``real``/``imag``;
* opaque bytes (h5py's ``|V2``) only with a ``dtype`` attribute naming a table row of
  that size (:data:`MARKER`: what Keras writes for bfloat16, and what tensorbridge
  writes for every type h5py has no HDF5 type for), or with the reader's ``dtype=``.
  Two opaque bytes are never taken for bfloat16 by their size alone.

Anything else (strings, references, variable-length and array types, other layouts)
raises :class:`~tensorbridge.errors.UnsupportedDtypeError` naming the type.

**Writing** (:func:`file_type`): a row NumPy itself holds gets the HDF5 type h5py makes
for it (little-endian integers and IEEE floats, bool as h5py's enum, complex as h5py's
``r``/``i`` compound); a row whose NumPy type comes from ml_dtypes (bfloat16, the
float8 family, complex32, ...) is opaque bytes of its size with :data:`MARKER` naming it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from ...dtypes import DTypeRow, dtype_table, resolve_dtype
from ...errors import MissingExtraError, UnsupportedDtypeError

__all__ = [
    "MARKER",
    "Stored",
    "file_type",
    "float_layouts",
    "marker_of",
    "plain_type",
    "require_h5py",
    "stored_type",
]

# the attribute naming an opaque dataset's type: Keras' (saving_lib.H5IOStore.__setitem__
# writes ``ds.attrs["dtype"] = "bfloat16"``; __getitem__ reads bfloat16 back by it)
MARKER = "dtype"
# the rows HDF5 2.0 names (H5Tpublic.h: H5T_FLOAT_BFLOAT16LE, _F8E4M3, _F8E5M2): a layout
# two rows share is read as the one HDF5 means
_HDF5_NAMES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")
# a float's layout: size, precision, offset, sign position, exponent position and size,
# mantissa position and size, exponent bias
Layout = tuple[int, int, int, int, int, int, int, int, int]
# complex compounds' member names: h5py's default (h5py.get_config().complex_names), and
# the spelled-out pair other writers use
_COMPLEX_NAMES = ((b"r", b"i"), (b"real", b"imag"))
_CLASS_NAMES = {
    2: "time",
    3: "string",
    4: "bitfield",
    6: "compound",
    7: "reference",
    9: "variable-length",
    10: "array",
}


def require_h5py() -> Any:
    """The ``h5py`` module, or a clear error.

    Raises:
        MissingExtraError: h5py is not installed.
    """
    try:
        import h5py
    except ImportError as err:
        raise MissingExtraError(
            f"HDF5 files need h5py ({err}); pip install tensorbridge[hdf5]"
        ) from None
    return h5py


@dataclass(frozen=True)
class Stored:
    """What a dataset's elements are: the table row, and how the bytes lie."""

    row: DTypeRow
    big_endian: bool  # stored big-endian: read by swapping ``unit``-byte pieces
    unit: int  # the bytes one number takes (half the item for complex types)
    marked: bool = False  # opaque bytes named by :data:`MARKER` (the attribute is the type's)

    @property
    def view_dtype(self) -> np.dtype[Any] | None:
        """The dtype a zero-copy view of the stored bytes has, or None (a copy must swap)."""
        dtype: np.dtype[Any] = self.row.numpy
        if not self.big_endian or self.unit == 1:
            return dtype
        if self.row.carried:  # ml_dtypes types have no byte-swapped NumPy dtype
            return None
        swapped: np.dtype[Any] = dtype.newbyteorder(">")
        return swapped


def float_layouts() -> dict[Layout, DTypeRow]:
    """Every floating row's bit layout (from ``ml_dtypes.finfo``), the row HDF5 names first.

    >>> float_layouts()[(2, 16, 0, 15, 7, 8, 0, 7, 127)]
    DTypeRow(bfloat16)
    """
    return dict(_layouts())


@functools.cache
def _layouts() -> tuple[tuple[Layout, DTypeRow], ...]:
    rows = sorted(
        (r for r in dtype_table() if r.category == "float"),
        key=lambda r: r.name not in _HDF5_NAMES,  # stable: then table order
    )
    out: dict[Layout, DTypeRow] = {}
    for r in rows:
        info: Any = ml_dtypes.finfo(r.numpy)  # type: ignore[no-untyped-call]
        precision = 1 + int(info.nexp) + int(info.nmant)  # a sign bit: float8_e8m0fnu has none
        if precision != int(getattr(info, "bits", r.itemsize * 8)):
            continue
        nexp, nmant = int(info.nexp), int(info.nmant)
        bias = 1 - int(info.minexp)
        layout = (r.itemsize, precision, 0, precision - 1, nmant, nexp, 0, nmant, bias)
        out.setdefault(layout, r)
    return tuple(out.items())


def stored_type(tid: Any, marker: str | None, raw: DTypeRow | None, where: str) -> Stored:
    """The row and byte layout of the HDF5 datatype ``tid`` (an ``h5py.h5t.TypeID``).

    ``marker`` is the dataset's :data:`MARKER` attribute (None: none), ``raw`` the
    reader's ``dtype=`` for unmarked opaque data; ``where`` starts messages.

    Raises:
        UnsupportedDtypeError: a type no row holds, or opaque bytes nothing names.
    """
    h5t = require_h5py().h5t
    cls, size = tid.get_class(), tid.get_size()
    if cls == h5t.INTEGER:
        return _integer(tid, where)
    if cls == h5t.FLOAT:
        row = _float_row(tid, where)
        return Stored(row, tid.get_order() == h5t.ORDER_BE, size)
    if cls == h5t.ENUM:
        return _enum(tid, where)
    if cls == getattr(h5t, "COMPLEX", -1):
        base = _float_row(tid.get_super(), where)
        return Stored(_complex_of(base, where), tid.get_order() == h5t.ORDER_BE, base.itemsize)
    if cls == h5t.COMPOUND:
        return _compound(tid, where)
    if cls == h5t.OPAQUE:
        return _opaque(size, marker, raw, where)
    what = _CLASS_NAMES.get(cls, f"class-{cls}")
    raise UnsupportedDtypeError(
        f"{where} holds HDF5 {what} values ({size} bytes each), which have no torch dtype; "
        "read it with h5py, or leave it out with keys="
    )


def _integer(tid: Any, where: str) -> Stored:
    h5t = require_h5py().h5t
    size = tid.get_size()
    if size not in (1, 2, 4, 8) or tid.get_precision() != 8 * size or tid.get_offset() != 0:
        raise UnsupportedDtypeError(
            f"{where} holds {tid.get_precision()}-bit integers at bit {tid.get_offset()} of "
            f"{size} bytes, which no dtype holds; read it with h5py (it widens them)"
        )
    signed = tid.get_sign() != h5t.SGN_NONE
    row = resolve_dtype(f"{'int' if signed else 'uint'}{8 * size}")
    return Stored(row, tid.get_order() == h5t.ORDER_BE and size > 1, size)


def _float_row(tid: Any, where: str) -> DTypeRow:
    """The row whose bit layout the HDF5 float type ``tid`` states exactly."""
    h5t = require_h5py().h5t
    if tid.get_class() != h5t.FLOAT:
        raise UnsupportedDtypeError(f"{where} holds complex numbers of non-float parts")
    spos, epos, esize, mpos, msize = tid.get_fields()
    layout = (tid.get_size(), tid.get_precision(), tid.get_offset(), spos, epos, esize, mpos,
              msize, tid.get_ebias())  # fmt: skip
    plain = (
        tid.get_norm() == h5t.NORM_IMPLIED
        and tid.get_pad() == (h5t.PAD_ZERO, h5t.PAD_ZERO)
        and tid.get_inpad() == h5t.PAD_ZERO
        and tid.get_order() in (h5t.ORDER_LE, h5t.ORDER_BE)
    )
    row = dict(_layouts()).get(layout) if plain else None
    if row is None:
        raise UnsupportedDtypeError(
            f"{where} holds floats of a layout no dtype has (size {layout[0]}, precision "
            f"{layout[1]}, sign bit {spos}, exponent {esize} bits at {epos}, mantissa "
            f"{msize} bits at {mpos}, bias {layout[8]}); read it with h5py (it widens them)"
        )
    return row


def _enum(tid: Any, where: str) -> Stored:
    base = tid.get_super()
    members = {tid.get_member_name(i): tid.get_member_value(i) for i in range(tid.get_nmembers())}
    if tid.get_size() == 1 and members == {b"FALSE": 0, b"TRUE": 1}:
        return Stored(resolve_dtype("bool"), False, 1)  # h5py's bool
    return _integer(base, where)


def _complex_of(part: DTypeRow, where: str) -> DTypeRow:
    try:
        return resolve_dtype(f"complex{2 * 8 * part.itemsize}")
    except UnsupportedDtypeError:
        raise UnsupportedDtypeError(
            f"{where} holds complex numbers of {part.name} parts, which no dtype of this "
            "installation holds (complex32 needs ml_dtypes 0.7); read it with h5py"
        ) from None


def _compound(tid: Any, where: str) -> Stored:
    h5t = require_h5py().h5t
    n, size = tid.get_nmembers(), tid.get_size()
    names = tuple(tid.get_member_name(i) for i in range(n))
    if n == 2 and names in _COMPLEX_NAMES:
        a, b = tid.get_member_type(0), tid.get_member_type(1)
        if (
            a.get_class() == b.get_class() == h5t.FLOAT
            and a.get_size() == b.get_size() == size // 2
            and (tid.get_member_offset(0), tid.get_member_offset(1)) == (0, size // 2)
            and a.get_order() == b.get_order()
        ):
            part, other = _float_row(a, where), _float_row(b, where)
            if part is other:
                return Stored(_complex_of(part, where), a.get_order() == h5t.ORDER_BE, size // 2)
    fields = ", ".join(x.decode("utf-8", "replace") for x in names[:6])
    raise UnsupportedDtypeError(
        f"{where} holds HDF5 compound values ({fields}), a structured type with no torch "
        "dtype; read it with h5py"
    )


def _opaque(size: int, marker: str | None, raw: DTypeRow | None, where: str) -> Stored:
    kinds = [r.name for r in dtype_table() if r.carried and r.itemsize == size]
    fix = (
        f"name it with dtype=, e.g. tb.load(path, dtype={kinds[0]!r}) (command line: "
        f"--as-dtype {kinds[0]}); the {size}-byte types are {', '.join(kinds)}"
        if kinds
        else "read it with h5py"
    )
    if marker is not None:
        try:
            row = resolve_dtype(marker)
        except UnsupportedDtypeError:
            row = None
        if row is None or row.itemsize != size or row.name != marker:
            raise UnsupportedDtypeError(
                f"{where} holds opaque {size}-byte values whose {MARKER!r} attribute says "
                f"{marker[:40]!r}, which is no dtype of that size; {fix}"
            )
        return Stored(row, False, size, marked=True)
    if raw is not None and raw.itemsize == size:
        return Stored(raw, False, size)
    raise UnsupportedDtypeError(
        f"{where} holds opaque {size}-byte values (what h5py makes of an ml_dtypes array, "
        f"its type lost) and no {MARKER!r} attribute naming their type; {fix}"
    )


def plain_type(tid: Any, top: bool = True) -> bool:
    """Whether values of the HDF5 type ``tid`` are plain data h5py reads safely: numbers,
    fixed-length strings, opaque bytes, enums, arrays and compounds of them, and (``top``:
    not inside another type) variable-length strings, whose lengths the caller checks
    first (:mod:`.headers`). Variable-length sequences, references and times are not:
    h5py's conversion of a damaged one crashes the interpreter."""
    h5t = require_h5py().h5t
    cls = tid.get_class()
    if cls == h5t.STRING:
        return top or not tid.is_variable_str()
    if cls in (h5t.INTEGER, h5t.FLOAT, h5t.BITFIELD, h5t.OPAQUE):
        return True
    if cls in (h5t.ENUM, h5t.ARRAY):
        return plain_type(tid.get_super(), top=False)
    if cls == h5t.COMPOUND:
        n = tid.get_nmembers()
        return all(plain_type(tid.get_member_type(i), top=False) for i in range(n))
    return False


def file_type(row: DTypeRow) -> Any:
    """The HDF5 type tensorbridge writes ``row`` as (an ``h5py.h5t.TypeID``); rows
    stored as opaque bytes carry :data:`MARKER` (:func:`marker_of`)."""
    h5t = require_h5py().h5t
    if row.carried:
        return h5t.create(h5t.OPAQUE, row.itemsize)
    return h5t.py_create(row.numpy.newbyteorder("<"), logical=True)


def marker_of(row: DTypeRow) -> str | None:
    """The :data:`MARKER` value a dataset of ``row`` is written with (None: a native type)."""
    return row.name if row.carried else None
