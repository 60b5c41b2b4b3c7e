"""Fill-value rules for :mod:`tensorbridge.zarr_dtypes`: a type's fill value to and from JSON.

The zarr v3 core rules, kept bit-exact: a float's fill value is a JSON number,
``"NaN"``, ``"Infinity"``, ``"-Infinity"`` or ``"0x.."`` (its raw bits, the only spelling
that keeps a NaN payload), refused when the type cannot hold it exactly
(:class:`FloatFill`); an integer's is a JSON integer within the type's range
(:class:`IntFill`). Like the package, it imports NumPy and zarr only.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np
from zarr.core.common import JSON

__all__ = ["BITS", "FloatFill", "IntFill", "Rules", "bits_of", "from_bits_of", "hex_bits"]

SPECIAL = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
BITS: dict[int, np.dtype[Any]] = {1: np.dtype(np.uint8), 2: np.dtype("<u2"), 4: np.dtype("<u4")}


def bits_of(value: np.generic, itemsize: int) -> int:
    """The raw bits of one scalar as an integer (its bytes read little-endian)."""
    return int(np.asarray(value).reshape(1).view(np.uint8).view(BITS[itemsize])[0])


def hex_bits(bits: int, itemsize: int) -> str:
    return f"0x{bits:0{2 * itemsize}x}"


def from_bits_of(dtype: np.dtype[Any], bits: int) -> np.generic:
    """The scalar of ``dtype`` whose bytes are ``bits`` (little-endian)."""
    raw = np.array([bits], np.uint64).astype(BITS[dtype.itemsize])
    out: np.generic = raw.view(dtype)[0]
    return out


class Rules(Protocol):
    """What a data type asks of its fill-value rules (:class:`FloatFill`, :class:`IntFill`)."""

    def from_bits(self, bits: int) -> np.generic: ...

    def from_json(self, data: JSON) -> np.generic: ...

    def to_json(self, value: np.generic) -> JSON: ...

    def cast(self, data: object) -> np.generic: ...


class FloatFill:
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
            return bits_of(x[0], self.dtype.itemsize) if math.isnan(back) else None
        return bits_of(x[0], self.dtype.itemsize) if back == value else None

    def from_bits(self, bits: int) -> np.generic:
        return from_bits_of(self.dtype, bits)

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
        if isinstance(data, str) and data in SPECIAL:
            value = SPECIAL[data]
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
        bits = bits_of(value, self.dtype.itemsize)
        with np.errstate(all="ignore"):  # a signalling NaN warns on the way to float64
            f = float(np.asarray(value).astype(np.float64))
        if math.isnan(f):
            return "NaN" if bits == self.canonical_nan else hex_bits(bits, self.dtype.itemsize)
        if math.isinf(f):
            return "Infinity" if f > 0 else "-Infinity"
        if self.hex_only or self._round_trips(f) != bits:  # float4's unused high bits, say
            return hex_bits(bits, self.dtype.itemsize)
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


class IntFill:
    """Fill-value rules for one sub-byte integer type: the zarr v3 core rules for integers.

    A fill value is a JSON integer within the type's range (an integral float, as zarr's
    own integer types take, too); it is written as the value of the element's low bits.
    """

    def __init__(self, dtype: np.dtype[Any], name: str) -> None:
        values = np.arange(256, dtype=np.uint8).view(dtype).astype(np.int64)  # every byte
        self.dtype, self.name = dtype, name
        self.min, self.max = int(values.min()), int(values.max())

    def from_bits(self, bits: int) -> np.generic:
        return from_bits_of(self.dtype, bits)

    def from_json(self, data: JSON) -> np.generic:
        """A fill value as the spec spells it -> this type's scalar, or raise."""
        if isinstance(data, float) and data.is_integer():
            data = int(data)
        if isinstance(data, bool) or not isinstance(data, int):
            raise TypeError(
                f"fill value {data!r} is not a {self.name} value; give an integer from "
                f"{self.min} to {self.max}"
            )
        if not self.min <= data <= self.max:
            raise ValueError(
                f"fill value {data!r} is outside {self.name}'s range; give an integer from "
                f"{self.min} to {self.max}"
            )
        out: np.generic = np.array([data], np.int64).astype(self.dtype)[0]
        return out

    def to_json(self, value: np.generic) -> JSON:
        return int(value)  # ml_dtypes reads the low bits

    def cast(self, data: object) -> np.generic:
        """A Python or NumPy integer -> this type's scalar (a scalar of the type keeps its bits)."""
        if isinstance(data, self.dtype.type):
            return data  # type: ignore[no-any-return]
        if isinstance(data, np.ndarray) and data.shape == () and data.dtype == self.dtype:
            return data[()]  # type: ignore[return-value]
        if isinstance(data, np.integer):
            data = int(data)
        return self.from_json(data)  # type: ignore[arg-type]
