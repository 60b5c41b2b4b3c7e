"""Zarr v3 data types for the ml_dtypes types, under tensorstore's and zarr-extensions' names.

zarr-python has no data type for the ml_dtypes types that ML checkpoints are made of. This
module defines them as zarr 3 ``ZDType`` classes and registers them with zarr, so that any
process with NumPy, ml_dtypes and zarr reads and writes such arrays bit for bit. It imports
neither torch nor the rest of tensorbridge: a plain NumPy process (a dask worker, a
notebook) needs only ``import tensorbridge.zarr_dtypes``.

======================  ========================  ========================================
``data_type`` name      NumPy dtype               what it is
======================  ========================  ========================================
``bfloat16``            ``ml_dtypes.bfloat16``    8 exponent, 7 mantissa bits
``float8_e4m3fn``       ``float8_e4m3fn``         OCP E4M3: no infinity, NaN 0x7f/0xff
``float8_e5m2``         ``float8_e5m2``           OCP E5M2: IEEE-like
``float8_e4m3fnuz``     ``float8_e4m3fnuz``       no infinity, no -0, NaN 0x80
``float8_e5m2fnuz``     ``float8_e5m2fnuz``       no infinity, no -0, NaN 0x80
``float8_e8m0fnu``      ``float8_e8m0fnu``        MX scales: exponent only, NaN 0xff
``float8_e4m3``         ``float8_e4m3``           IEEE-style E4M3: infinities, NaN 0x7c
``float8_e3m4``         ``float8_e3m4``           IEEE-style E3M4: infinities, NaN 0x78
``float8_e4m3b11fnuz``  ``float8_e4m3b11fnuz``    bias 11, no infinity, no -0, NaN 0x80
``float6_e2m3fn``       ``float6_e2m3fn``         MX FP6 E2M3, one a byte (low 6 bits)
``float6_e3m2fn``       ``float6_e3m2fn``         MX FP6 E3M2, one a byte (low 6 bits)
``float4_e2m1fn``       ``float4_e2m1fn``         MX FP4, one value a byte (low bits)
``int4``, ``uint4``     ``int4``, ``uint4``       4-bit integers, one a byte (low bits)
``int2``, ``uint2``     ``int2``, ``uint2``       2-bit integers, one a byte (low bits)
``complex_float16``     ``ml_dtypes.complex32``   two float16 (torch.complex32)
``complex_bfloat16``    ``ml_dtypes.bcomplex32``  two bfloat16
======================  ========================  ========================================

The names and bit layouts are zarr-extensions' (``data-types/<name>/README.md`` in
github.com/zarr-developers/zarr-extensions: the ``bytes`` codec stores one element a
byte, the value in the low bits); tensorstore 0.1 reads and writes ``bfloat16``, the
float8 types but ``float8_e4m3``, ``float4_e2m1fn``, ``int4`` and ``int2`` natively. A
sub-byte element's high bits are kept as written (zarr-extensions: "ignored"; ml_dtypes
reads only the low bits). zarr-extensions names no ``int1``, ``uint1`` or
``float8_e5m3fnu``: this module defines none (no name is invented), so those arrays
have no Zarr data type (:func:`zarr_name` is ``None``). ``float8_e4m3`` is the
IEEE-style E4M3 (with infinities), a different format from ``float8_e4m3fn``: each is
stored under its own name.

**Fill values** follow the zarr v3 core rules: for floats a JSON number, ``"NaN"``,
``"Infinity"``, ``"-Infinity"``, or ``"0x.."``, the raw bits as a hexadecimal integer,
the only spelling of a NaN other than the type's canonical one (so payloads survive);
for integers a JSON integer within the type's range. Values the type cannot hold
(``"Infinity"`` for an ``fn`` type, ``"NaN"`` for ``float4_e2m1fn``, ``8`` for
``int4``) are refused rather than rounded. Zarr v2 has no name for these types.

**Registration** happens on import (:func:`register`, idempotent) and through the
``zarr.data_type`` entry-point group in tensorbridge's package metadata, which zarr-python
3.2 and later load by themselves; zarr 3.1 never loads entry points, so there the import
is needed.

**Write with** ``config={"write_empty_chunks": True}``: zarr skips a chunk whose values
compare equal to the fill value, and its comparison folds NaN payloads (and, for
bfloat16, ``-0.0`` into ``0.0``); a skipped chunk reads back as the fill value's bits.

>>> import numpy as np, ml_dtypes, zarr
>>> import tensorbridge.zarr_dtypes
>>> z = zarr.create_array({}, shape=(3,), dtype=ml_dtypes.bfloat16, fill_value=0)
>>> z[:] = np.array([1.5, -2, 3], ml_dtypes.bfloat16)
>>> z.metadata.data_type.to_json(zarr_format=3), z[:].dtype
('bfloat16', dtype(bfloat16))
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeGuard, overload

import ml_dtypes
import numpy as np
from zarr.core.common import JSON, ZarrFormat
from zarr.core.dtype import data_type_registry
from zarr.core.dtype.common import DTypeJSON, HasEndianness, HasItemSize
from zarr.core.dtype.wrapper import ZDType

from ._fill import FloatFill, IntFill, Rules, bits_of

try:  # zarr >= 3.2 moved it (the old name warns); zarr 3.1 has it only here
    from zarr.errors import DataTypeValidationError  # type: ignore[attr-defined,unused-ignore]
except ImportError:
    from zarr.core.dtype.common import DataTypeValidationError

__all__ = [
    "DATA_TYPES",
    "BFloat16",
    "ComplexBFloat16",
    "ComplexFloat16",
    "Float4E2M1FN",
    "Float6E2M3FN",
    "Float6E3M2FN",
    "Float8E3M4",
    "Float8E4M3",
    "Float8E4M3B11FNUZ",
    "Float8E4M3FN",
    "Float8E4M3FNUZ",
    "Float8E5M2",
    "Float8E5M2FNUZ",
    "Float8E8M0FNU",
    "Int2",
    "Int4",
    "MLComplex",
    "MLFloat",
    "MLInt",
    "MLType",
    "UInt2",
    "UInt4",
    "register",
    "zarr_name",
]

_HOST: Literal["little", "big"] = "little" if sys.byteorder == "little" else "big"


@dataclass(frozen=True, kw_only=True)
class MLType(ZDType[np.dtype[Any], np.generic], HasItemSize):
    """A zarr v3 data type for one ml_dtypes scalar type (the subclasses name which).

    Instances compare equal when they are the same type; the JSON name is
    ``_zarr_v3_name``; the NumPy dtype is ``np.dtype(ml_dtypes.<numpy_name>)``. A
    subclass whose type the installed ml_dtypes lacks is left out of :data:`DATA_TYPES`.

    >>> Float8E4M3FN().to_json(zarr_format=3), Float8E4M3FN().to_native_dtype()
    ('float8_e4m3fn', dtype(float8_e4m3fn))
    """

    numpy_name: ClassVar[str]  # the ml_dtypes attribute
    hex_fill: ClassVar[bool] = False  # fill values are written as their bits (not numbers)
    _numpy: ClassVar[np.dtype[Any]]
    _rules: ClassVar[Rules]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        ml_type = getattr(ml_dtypes, cls.__dict__.get("numpy_name", ""), None)
        if ml_type is not None:
            dt = np.dtype(ml_type)
            cls._numpy = dt
            cls.dtype_cls = type(dt)
            cls._make_rules(dt)

    @classmethod
    def _make_rules(cls, dt: np.dtype[Any]) -> None:
        cls._rules = FloatFill(dt, cls._zarr_v3_name, hex_only=cls.hex_fill)

    @classmethod
    def available(cls) -> bool:
        """Whether the installed ml_dtypes has this type."""
        return "_numpy" in cls.__dict__

    @property
    def item_size(self) -> int:
        return int(self._numpy.itemsize)

    @classmethod
    def from_native_dtype(cls, dtype: np.dtype[Any]) -> MLType:
        if cls._check_native_dtype(dtype):
            return cls()
        raise DataTypeValidationError(f"{dtype} is not {cls._numpy}")

    def to_native_dtype(self) -> np.dtype[Any]:
        return self._numpy

    @classmethod
    def _from_json_v2(cls, data: DTypeJSON) -> MLType:
        raise DataTypeValidationError(
            f"zarr v2 has no name for {cls._zarr_v3_name}; such arrays are zarr v3 only"
        )

    @classmethod
    def _from_json_v3(cls, data: DTypeJSON) -> MLType:
        if data == cls._zarr_v3_name:
            return cls()
        raise DataTypeValidationError(f"{data!r} is not {cls._zarr_v3_name!r}")

    @overload
    def to_json(self, zarr_format: Literal[2]) -> Any: ...

    @overload
    def to_json(self, zarr_format: Literal[3]) -> str: ...

    def to_json(self, zarr_format: ZarrFormat) -> Any:
        if zarr_format == 3:
            return self._zarr_v3_name
        raise ValueError(
            f"zarr v2 has no name for {self._zarr_v3_name}; create the array with zarr_format=3"
        )

    def _check_scalar(self, data: object) -> TypeGuard[np.generic]:
        try:
            self._rules.cast(data)
        except (TypeError, ValueError):
            return False
        return True

    def cast_scalar(self, data: object) -> np.generic:
        return self._rules.cast(data)

    def default_scalar(self) -> np.generic:
        """All bits zero: 0.0, except float8_e8m0fnu (no zero), where it is 2**-127."""
        return self._rules.from_bits(0)

    def from_json_scalar(self, data: JSON, *, zarr_format: ZarrFormat) -> np.generic:
        return self._rules.from_json(data)

    def to_json_scalar(self, data: object, *, zarr_format: ZarrFormat) -> JSON:
        return self._rules.to_json(self.cast_scalar(data))


class MLFloat(MLType):
    """A float type: fill values as the zarr v3 core spells floats (numbers, ``"NaN"``,
    ``"Infinity"``, ``"0x.."`` bits)."""


class MLInt(MLType):
    """A sub-byte integer type: fill values are integers within its range.

    >>> Int4().to_json_scalar(-8, zarr_format=3), int(UInt2().default_scalar())
    (-8, 0)
    """

    @classmethod
    def _make_rules(cls, dt: np.dtype[Any]) -> None:
        cls._rules = IntFill(dt, cls._zarr_v3_name)


@dataclass(frozen=True, kw_only=True)
class MLFloatWide(MLFloat, HasEndianness):
    """An ml_dtypes type wider than a byte: the ``bytes`` codec names its byte order.

    ml_dtypes types exist in native byte order only, so chunks stored in the other
    order are refused with a clear error rather than read wrongly.
    """

    endianness: Literal["little", "big"] = _HOST

    @classmethod
    def from_native_dtype(cls, dtype: np.dtype[Any]) -> MLType:
        if cls._check_native_dtype(dtype):
            return cls(endianness=_HOST)
        raise DataTypeValidationError(f"{dtype} is not {cls._numpy}")

    @classmethod
    def _from_json_v3(cls, data: DTypeJSON) -> MLType:
        if data == cls._zarr_v3_name:
            return cls(endianness=_HOST)
        raise DataTypeValidationError(f"{data!r} is not {cls._zarr_v3_name!r}")

    def to_native_dtype(self) -> np.dtype[Any]:
        if self.endianness != _HOST:
            raise ValueError(
                f"{self._zarr_v3_name} chunks stored {self.endianness}-endian cannot be read "
                f"on this {_HOST}-endian machine (ml_dtypes has no byte-swapped "
                f"{self.numpy_name}); rewrite the array with the bytes codec's endian "
                f"set to {_HOST!r}"
            )
        return self._numpy


class BFloat16(MLFloatWide):
    """``bfloat16``: ``ml_dtypes.bfloat16`` (torch.bfloat16's bits)."""

    _zarr_v3_name = "bfloat16"
    numpy_name = "bfloat16"


class Float8E4M3FN(MLFloat):
    """``float8_e4m3fn``: ``ml_dtypes.float8_e4m3fn`` (torch.float8_e4m3fn)."""

    _zarr_v3_name = "float8_e4m3fn"
    numpy_name = "float8_e4m3fn"


class Float8E5M2(MLFloat):
    """``float8_e5m2``: ``ml_dtypes.float8_e5m2`` (torch.float8_e5m2)."""

    _zarr_v3_name = "float8_e5m2"
    numpy_name = "float8_e5m2"


class Float8E4M3FNUZ(MLFloat):
    """``float8_e4m3fnuz``: ``ml_dtypes.float8_e4m3fnuz`` (torch.float8_e4m3fnuz)."""

    _zarr_v3_name = "float8_e4m3fnuz"
    numpy_name = "float8_e4m3fnuz"


class Float8E5M2FNUZ(MLFloat):
    """``float8_e5m2fnuz``: ``ml_dtypes.float8_e5m2fnuz`` (torch.float8_e5m2fnuz)."""

    _zarr_v3_name = "float8_e5m2fnuz"
    numpy_name = "float8_e5m2fnuz"


class Float8E8M0FNU(MLFloat):
    """``float8_e8m0fnu``: ``ml_dtypes.float8_e8m0fnu`` (torch.float8_e8m0fnu, MX scales).

    Fill values are written as ``"0x.."`` bits: tensorstore 0.1 spells this type's
    numbers with another exponent bias (its ``1.0`` is bits ``0x3f``, not ``0x7f``), so
    only bits mean the same to both (its data bytes agree with ml_dtypes). A ``0`` fill
    value (which the type cannot hold, and tensorstore writes by default) reads as bits
    ``0x00``.
    """

    _zarr_v3_name = "float8_e8m0fnu"
    numpy_name = "float8_e8m0fnu"
    hex_fill = True


class Float4E2M1FN(MLFloat):
    """``float4_e2m1fn``: ``ml_dtypes.float4_e2m1fn``, one value a byte in its low bits."""

    _zarr_v3_name = "float4_e2m1fn"
    numpy_name = "float4_e2m1fn"


class Float8E4M3(MLFloat):
    """``float8_e4m3``: ``ml_dtypes.float8_e4m3``, IEEE-style (infinities; NaN ``0x7c``)."""

    _zarr_v3_name = numpy_name = "float8_e4m3"


class Float8E3M4(MLFloat):
    """``float8_e3m4``: ``ml_dtypes.float8_e3m4``, IEEE-style (infinities; NaN ``0x78``)."""

    _zarr_v3_name = numpy_name = "float8_e3m4"


class Float8E4M3B11FNUZ(MLFloat):
    """``float8_e4m3b11fnuz``: ``ml_dtypes.float8_e4m3b11fnuz`` (bias 11; NaN ``0x80``)."""

    _zarr_v3_name = numpy_name = "float8_e4m3b11fnuz"


class Float6E2M3FN(MLFloat):
    """``float6_e2m3fn``: ``ml_dtypes.float6_e2m3fn`` (MX FP6), one a byte in its low bits."""

    _zarr_v3_name = numpy_name = "float6_e2m3fn"


class Float6E3M2FN(MLFloat):
    """``float6_e3m2fn``: ``ml_dtypes.float6_e3m2fn`` (MX FP6), one a byte in its low bits."""

    _zarr_v3_name = numpy_name = "float6_e3m2fn"


class Int4(MLInt):
    """``int4``: ``ml_dtypes.int4`` (torch.int4), -8 to 7, one a byte in its low bits."""

    _zarr_v3_name = numpy_name = "int4"


class UInt4(MLInt):
    """``uint4``: ``ml_dtypes.uint4`` (torch.uint4), 0 to 15, one a byte in its low bits."""

    _zarr_v3_name = numpy_name = "uint4"


class Int2(MLInt):
    """``int2``: ``ml_dtypes.int2`` (torch.int2), -2 to 1, one a byte in its low bits."""

    _zarr_v3_name = numpy_name = "int2"


class UInt2(MLInt):
    """``uint2``: ``ml_dtypes.uint2`` (torch.uint2), 0 to 3, one a byte in its low bits."""

    _zarr_v3_name = numpy_name = "uint2"


@dataclass(frozen=True, kw_only=True)
class MLComplex(MLFloatWide):
    """A complex type of two float parts, real then imaginary (the subclasses name the part).

    Fill values are ``[real, imag]``, each spelled as a fill value of the part's type.
    """

    part: ClassVar[np.dtype[Any]]  # the type of each part
    _part: ClassVar[FloatFill]

    @classmethod
    def _make_rules(cls, dt: np.dtype[Any]) -> None:
        cls._part = FloatFill(cls.part, cls.part.name)

    def _check_scalar(self, data: object) -> TypeGuard[np.generic]:
        try:
            self.cast_scalar(data)
        except (TypeError, ValueError):
            return False
        return True

    def cast_scalar(self, data: object) -> np.generic:
        if isinstance(data, self._numpy.type):
            return data  # type: ignore[no-any-return]
        if isinstance(data, bool) or not isinstance(data, (int, float, complex, np.number)):
            raise TypeError(
                f"cannot use {data!r} ({type(data).__qualname__}) as a {self._zarr_v3_name} value"
            )
        out: np.generic = np.array([data], np.complex128).astype(self._numpy)[0]
        return out

    def default_scalar(self) -> np.generic:
        return self._pair(0, 0)

    def _pair(self, real_bits: int, imag_bits: int) -> np.generic:
        parts = np.array([real_bits, imag_bits], np.uint16)
        out: np.generic = parts.view(self._numpy)[0]
        return out

    def from_json_scalar(self, data: JSON, *, zarr_format: ZarrFormat) -> np.generic:
        if isinstance(data, Sequence) and not isinstance(data, str) and len(data) == 2:
            re, im = (self._part.from_json(part) for part in data)
            return self._pair(bits_of(re, 2), bits_of(im, 2))
        raise TypeError(
            f"fill value {data!r} is not a {self._zarr_v3_name} value; give [real, imaginary]"
        )

    def to_json_scalar(self, data: object, *, zarr_format: ZarrFormat) -> JSON:
        parts = np.asarray(self.cast_scalar(data)).reshape(1).view(self.part)
        return [self._part.to_json(parts[0]), self._part.to_json(parts[1])]


class ComplexFloat16(MLComplex):
    """``complex_float16``: ``ml_dtypes.complex32`` (torch.complex32), two float16."""

    _zarr_v3_name = "complex_float16"
    numpy_name = "complex32"
    part = np.dtype(np.float16)


class ComplexBFloat16(MLComplex):
    """``complex_bfloat16``: ``ml_dtypes.bcomplex32``, two bfloat16."""

    _zarr_v3_name = "complex_bfloat16"
    numpy_name = "bcomplex32"
    part = np.dtype(ml_dtypes.bfloat16)


# In the order of the entry points in pyproject.toml; a type the installed ml_dtypes lacks
# is left out.
_ALL: tuple[type[MLType], ...] = (
    BFloat16, Float8E4M3FN, Float8E5M2, Float8E4M3FNUZ, Float8E5M2FNUZ, Float8E8M0FNU,
    Float4E2M1FN, ComplexFloat16, Float8E4M3, Float8E3M4, Float8E4M3B11FNUZ,
    Float6E2M3FN, Float6E3M2FN, Int4, UInt4, Int2, UInt2, ComplexBFloat16,
)  # fmt: skip
DATA_TYPES: tuple[type[MLType], ...] = tuple(cls for cls in _ALL if cls.available())
_BY_NUMPY = {cls._numpy: cls for cls in DATA_TYPES}


def register() -> None:
    """Register every data type of this module with zarr (idempotent; done on import).

    >>> register()
    >>> from zarr.core.dtype import data_type_registry
    >>> data_type_registry.get("float8_e8m0fnu").__name__
    'Float8E8M0FNU'
    """
    for cls in DATA_TYPES:
        data_type_registry.register(cls._zarr_v3_name, cls)


def zarr_name(dtype: Any) -> str | None:
    """The zarr v3 ``data_type`` name this module stores ``dtype`` under, or None.

    >>> import ml_dtypes
    >>> zarr_name(ml_dtypes.float8_e4m3fn), zarr_name("float32")
    ('float8_e4m3fn', None)
    >>> zarr_name(ml_dtypes.int4), zarr_name(ml_dtypes.int1)  # int1: no name
    ('int4', None)
    """
    cls = _BY_NUMPY.get(np.dtype(dtype))
    return None if cls is None else cls._zarr_v3_name


register()
