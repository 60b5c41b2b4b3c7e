"""Zarr v3 data types for bfloat16, float8, float4 and complex32, under tensorstore's names.

zarr-python has no data type for the ml_dtypes types that ML checkpoints are made of. This
module defines them as zarr 3 ``ZDType`` classes and registers them with zarr, so that any
process with NumPy, ml_dtypes and zarr reads and writes such arrays bit for bit. It imports
neither torch nor the rest of tensorbridge: a plain NumPy process (a dask worker, a
notebook) needs only ``import tensorbridge.zarr_dtypes``.

=====================  =====================  ====================================
``data_type`` name     NumPy dtype            what it is
=====================  =====================  ====================================
``bfloat16``           ``ml_dtypes.bfloat16``  8 exponent, 7 mantissa bits
``float8_e4m3fn``      ``float8_e4m3fn``       OCP E4M3: no infinity, NaN 0x7f/0xff
``float8_e5m2``        ``float8_e5m2``         OCP E5M2: IEEE-like
``float8_e4m3fnuz``    ``float8_e4m3fnuz``     no infinity, no -0, NaN 0x80
``float8_e5m2fnuz``    ``float8_e5m2fnuz``     no infinity, no -0, NaN 0x80
``float8_e8m0fnu``     ``float8_e8m0fnu``      MX scales: exponent only, NaN 0xff
``float4_e2m1fn``      ``float4_e2m1fn``       MX FP4, one value a byte (low bits)
``complex_float16``    ``ml_dtypes.complex32``  two float16 (torch.complex32)
=====================  =====================  ====================================

The names are tensorstore's and zarr-extensions' (tensorstore reads and writes the first
seven natively). ``float8_e4m3`` is deliberately absent: in zarr-extensions it is the
IEEE-style E4M3 (with infinities), a different format from ``float8_e4m3fn``.

**Fill values** follow the zarr v3 core rules for floats: a JSON number, ``"NaN"``,
``"Infinity"``, ``"-Infinity"``, or ``"0x.."``, the raw bits as a hexadecimal integer,
the only spelling of a NaN other than the type's canonical one (so payloads survive).
Values the type cannot hold (``"Infinity"`` for an ``fn`` type, ``"NaN"`` for
``float4_e2m1fn``) are refused rather than rounded. Zarr v2 has no name for these types.

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

import math
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

try:  # zarr >= 3.2 moved it (the old name warns); zarr 3.1 has it only here
    from zarr.errors import DataTypeValidationError  # type: ignore[attr-defined,unused-ignore]
except ImportError:
    from zarr.core.dtype.common import DataTypeValidationError

__all__ = [
    "DATA_TYPES",
    "BFloat16",
    "ComplexFloat16",
    "Float4E2M1FN",
    "Float8E4M3FN",
    "Float8E4M3FNUZ",
    "Float8E5M2",
    "Float8E5M2FNUZ",
    "Float8E8M0FNU",
    "MLFloat",
    "register",
    "zarr_name",
]

_SPECIAL = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_HOST: Literal["little", "big"] = "little" if sys.byteorder == "little" else "big"
_BITS: dict[int, np.dtype[Any]] = {1: np.dtype(np.uint8), 2: np.dtype("<u2"), 4: np.dtype("<u4")}


def _bits_of(value: np.generic, itemsize: int) -> int:
    """The raw bits of one scalar as an integer (its bytes read little-endian)."""
    return int(np.asarray(value).reshape(1).view(np.uint8).view(_BITS[itemsize])[0])


def _hex(bits: int, itemsize: int) -> str:
    return f"0x{bits:0{2 * itemsize}x}"


class _Scalar:
    """Fill-value rules for one real float type (also each half of a complex one)."""

    def __init__(self, dtype: np.dtype[Any], name: str, *, hex_only: bool = False) -> None:
        self.dtype = dtype
        self.name = name
        self.hex_only = hex_only  # spell every value but NaN as its bits
        self.canonical_nan = self._round_trips(math.nan)
        self.has_inf = self._round_trips(math.inf) is not None
        self.has_nan = self.canonical_nan is not None

    def _round_trips(self, value: float) -> int | None:
        """The bits of ``value`` in this type, or None when the type cannot hold it."""
        with np.errstate(all="ignore"):
            x = np.array([value]).astype(self.dtype)
        back = float(x.astype(np.float64)[0])
        if math.isnan(value):
            return _bits_of(x[0], self.dtype.itemsize) if math.isnan(back) else None
        return _bits_of(x[0], self.dtype.itemsize) if back == value else None

    def from_bits(self, bits: int) -> np.generic:
        width = self.dtype.itemsize
        raw = np.array([bits], np.uint64).astype(_BITS[width])
        out: np.generic = raw.view(self.dtype)[0]
        return out

    def from_json(self, data: JSON) -> np.generic:
        """A fill value as the spec spells it -> this type's scalar, exactly, or raise."""
        width = self.dtype.itemsize
        if isinstance(data, str) and data.startswith("0x"):
            try:
                bits = int(data, 16)
            except ValueError:
                bits = -1
            if not 0 <= bits < 1 << (8 * width):
                raise ValueError(
                    f"fill value {data!r} is not {width} byte(s) of hexadecimal bits "
                    f"for {self.name}"
                )
            return self.from_bits(bits)
        if isinstance(data, str) and data in _SPECIAL:
            value = _SPECIAL[data]
        elif isinstance(data, (int, float)) and not isinstance(data, bool):
            value = float(data)
        else:
            raise TypeError(
                f"fill value {data!r} is not a {self.name} value; give a number, 'NaN', "
                "'Infinity', '-Infinity' or '0x' and the raw bits in hexadecimal"
            )
        found = self._round_trips(value)
        if found is None and value == 0:
            found = 0  # a type without zero: tensorstore writes its all-zero default as 0.0
        if found is None:
            raise ValueError(
                f"fill value {data!r} has no exact {self.name} representation; give one of its "
                "values, or its raw bits as a '0x' hexadecimal string"
            )
        return self.from_bits(found)

    def to_json(self, value: np.generic) -> JSON:
        """The JSON spelling of a scalar that keeps its bits: NaN payloads as ``0x`` bits."""
        bits = _bits_of(value, self.dtype.itemsize)
        with np.errstate(all="ignore"):  # a signalling NaN warns on the way to float64
            f = float(np.asarray(value).astype(np.float64))
        if math.isnan(f):
            return "NaN" if bits == self.canonical_nan else _hex(bits, self.dtype.itemsize)
        if math.isinf(f):
            return "Infinity" if f > 0 else "-Infinity"
        if self.hex_only or self._round_trips(f) != bits:  # float4's unused high bits, say
            return _hex(bits, self.dtype.itemsize)
        return f  # exact: every value of these types is a float64; -0.0 stays -0.0

    def cast(self, data: object) -> np.generic:
        """A Python or NumPy value -> this type's scalar (a scalar of the type keeps its bits)."""
        if isinstance(data, self.dtype.type):
            return data  # type: ignore[no-any-return]
        if isinstance(data, np.ndarray) and data.shape == () and data.dtype == self.dtype:
            return data[()]  # type: ignore[return-value]
        if isinstance(data, bool) or not isinstance(data, (int, float, np.number, str)):
            raise TypeError(
                f"cannot use {data!r} ({type(data).__qualname__}) as a {self.name} value"
            )
        if isinstance(data, str):
            return self.from_json(data)
        return self.dtype.type(data)  # type: ignore[no-any-return]


@dataclass(frozen=True, kw_only=True)
class MLFloat(ZDType[np.dtype[Any], np.generic], HasItemSize):
    """A zarr v3 data type for one ml_dtypes scalar type (the subclasses name which).

    Instances compare equal when they are the same type; the JSON name is
    ``_zarr_v3_name``; the NumPy dtype is ``np.dtype(ml_dtypes.<numpy_name>)``.

    >>> Float8E4M3FN().to_json(zarr_format=3), Float8E4M3FN().to_native_dtype()
    ('float8_e4m3fn', dtype(float8_e4m3fn))
    """

    numpy_name: ClassVar[str]  # the ml_dtypes attribute
    hex_fill: ClassVar[bool] = False  # fill values are written as their bits (not numbers)
    _numpy: ClassVar[np.dtype[Any]]
    _rules: ClassVar[_Scalar]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "numpy_name" in cls.__dict__:
            dt = np.dtype(getattr(ml_dtypes, cls.numpy_name))
            cls._numpy = dt
            cls.dtype_cls = type(dt)
            if dt.kind != "c":  # complex types spell each part as a float
                cls._rules = _Scalar(dt, cls._zarr_v3_name, hex_only=cls.hex_fill)

    @property
    def item_size(self) -> int:
        return int(self._numpy.itemsize)

    @classmethod
    def from_native_dtype(cls, dtype: np.dtype[Any]) -> MLFloat:
        if cls._check_native_dtype(dtype):
            return cls()
        raise DataTypeValidationError(f"{dtype} is not {cls._numpy}")

    def to_native_dtype(self) -> np.dtype[Any]:
        return self._numpy

    @classmethod
    def _from_json_v2(cls, data: DTypeJSON) -> MLFloat:
        raise DataTypeValidationError(
            f"zarr v2 has no name for {cls._zarr_v3_name}; such arrays are zarr v3 only"
        )

    @classmethod
    def _from_json_v3(cls, data: DTypeJSON) -> MLFloat:
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


@dataclass(frozen=True, kw_only=True)
class MLFloatWide(MLFloat, HasEndianness):
    """An ml_dtypes type wider than a byte: the ``bytes`` codec names its byte order.

    ml_dtypes types exist in native byte order only, so chunks stored in the other
    order are refused with a clear error rather than read wrongly.
    """

    endianness: Literal["little", "big"] = _HOST

    @classmethod
    def from_native_dtype(cls, dtype: np.dtype[Any]) -> MLFloat:
        if cls._check_native_dtype(dtype):
            return cls(endianness=_HOST)
        raise DataTypeValidationError(f"{dtype} is not {cls._numpy}")

    @classmethod
    def _from_json_v3(cls, data: DTypeJSON) -> MLFloat:
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


@dataclass(frozen=True, kw_only=True)
class ComplexFloat16(MLFloatWide):
    """``complex_float16``: ``ml_dtypes.complex32``, a float16 real then imaginary part.

    Fill values are ``[real, imag]``, each spelled as a float16 fill value.
    """

    _zarr_v3_name = "complex_float16"
    numpy_name = "complex32"

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
                f"cannot use {data!r} ({type(data).__qualname__}) as a complex_float16 value"
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
            re, im = (_HALF.from_json(part) for part in data)
            return self._pair(_bits_of(re, 2), _bits_of(im, 2))
        raise TypeError(
            f"fill value {data!r} is not a complex_float16 value; give [real, imaginary]"
        )

    def to_json_scalar(self, data: object, *, zarr_format: ZarrFormat) -> JSON:
        parts = np.asarray(self.cast_scalar(data)).reshape(1).view(np.float16)
        return [_HALF.to_json(parts[0]), _HALF.to_json(parts[1])]


_HALF = _Scalar(np.dtype(np.float16), "float16")

DATA_TYPES: tuple[type[MLFloat], ...] = (
    BFloat16,
    Float8E4M3FN,
    Float8E5M2,
    Float8E4M3FNUZ,
    Float8E5M2FNUZ,
    Float8E8M0FNU,
    Float4E2M1FN,
    ComplexFloat16,
)
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
    """
    cls = _BY_NUMPY.get(np.dtype(dtype))
    return None if cls is None else cls._zarr_v3_name


register()
