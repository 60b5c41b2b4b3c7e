"""How a cast treats ties, overflow, inf, zero, sign and NaN, probed on this installation.

:func:`semantics` is the ``semantics`` line of a cast report. It is not copied from
documents: a handful of values are cast with the kernel ``to_numpy(x, dtype=...)``
runs and the results read back, once per pair of dtypes. torch 2.13 began to saturate
float8_e4m3fn overflow, where older releases make NaN; ml_dtypes saturates the MX
types (float6, float4: no inf) and makes -0 of a NaN there (``mxfloat.h``:
"Conversion from NaNs is implementation-defined (by MX specification)", its
``quiet_NaN`` is ``0b1'00'000``), NaN of overflow in the fnuz types, and NaN of a
negative value in the unsigned float8_e5m3fnu.

The two kernels (``"torch"``: torch's CPU cast; ``"ml_dtypes"``: NumPy's ``astype``,
whose loops for the ml_dtypes types are ml_dtypes' own) are probed the same way, each
result an array of the target's NumPy dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache
from typing import Any

import ml_dtypes
import numpy as np
import torch

from .._ml_cast import astype
from ..convert import to_numpy
from ..dtypes import DTypeRow
from ._values import Array, Format, component_row, format_of

# float64 values (a 1-D array) -> the cast's results, an array of the target's NumPy dtype
Cast = Callable[[Array], Array]


def kernel_of(src: DTypeRow, dst: DTypeRow) -> str:
    """Whose cast ``to_numpy(x, dtype=dst)`` runs: torch's, or where torch has no kernels
    for either dtype (or no dtype), ml_dtypes' ``astype`` (the plans' ``_through_numpy``
    branches in ``_plan_numpy.py``, and ``_array_to_numpy``'s cast of an array)."""
    return "torch" if src.kernels and dst.kernels else "ml_dtypes"


def _casts(src: DTypeRow, probe: DTypeRow, dst: DTypeRow, kernel: str) -> Cast:
    """Values -> ``probe`` (how the source holds them) -> ``dst``, with ``kernel``."""
    if kernel == "torch":

        def by_torch(values: Array) -> Array:
            t = torch.from_numpy(values)
            if src.category not in ("float", "complex"):  # integers: exact, as given
                t = t.to(torch.int64)
            made: Array = to_numpy(t.to(probe.torch).to(dst.torch))
            return made

        return by_torch

    def by_ml_dtypes(values: Array) -> Array:
        if src.category not in ("float", "complex"):
            values = values.astype(np.int64)
        return astype(astype(values, probe.numpy), dst.numpy)

    return by_ml_dtypes


def _who(src: DTypeRow, dst: DTypeRow, kernel: str) -> str:
    if kernel == "torch":
        return f"torch's CPU cast {src.name} -> {dst.name}"
    rows = dict.fromkeys((src, dst))
    kernel_less = [r.name for r in rows if r.in_torch and not r.kernels]
    absent = [r.name for r in rows if not r.in_torch]
    lacks = [f"kernels for {' or '.join(kernel_less)}"] if kernel_less else []
    lacks += [" or ".join(absent)] if absent else []
    return f"ml_dtypes' astype {src.name} -> {dst.name} (torch has no {' and no '.join(lacks)})"


@cache
def semantics(src: DTypeRow, dst: DTypeRow, kernel: str = "torch") -> str:
    """How ``kernel`` casts src -> dst (ties, overflow, inf, NaN), probed on this install.

    >>> from tensorbridge.dtypes import resolve_dtype as row
    >>> line = semantics(row("float32"), row("float4_e2m1fn"), "ml_dtypes")
    >>> line.split(", as")[0]
    "ml_dtypes' astype float32 -> float4_e2m1fn (torch has no float4_e2m1fn)"
    >>> for part in line.split("; ")[1:]:
    ...     print(part)
    rounds to nearest, ties to even
    overflow -> ±6 (saturates)
    ±inf -> ±6 (saturates)
    NaN -> 0x8 (-0: float4_e2m1fn has no NaN)
    """
    dcomp = component_row(dst)
    df = format_of(dcomp)
    parts = [f"{_who(src, dst, kernel)}, as tb.to_numpy(x, dtype=...) runs it"]
    if src.category not in ("float", "complex"):
        cast = _casts(src, src, dcomp, kernel)
        parts.append("integers round to the nearest representable value")
        top, bottom = _int_range(src)
        big = min(top, int(df.max) * 4)
        if big > df.max:
            parts.append(f"overflow {_outcome(cast(np.array([big], np.float64)), df)}")
        elif -bottom > df.max:  # int4's -8 beyond float6_e2m3fn's 7.5
            low = max(bottom, -int(df.max) * 4)
            parts.append(f"overflow {_outcome(cast(np.array([low], np.float64)), df)}")
        parts += _zero_and_sign(cast, src, df)
        return "; ".join(parts)
    probe = component_row(src)
    pf = format_of(probe)
    cast = _casts(src, probe, dcomp, kernel)
    if src.category == "complex" and dst.category != "complex":
        parts.append("the imaginary part is dropped")
    if pf.nmant > df.nmant:
        parts.append(_tie_rule(cast, dcomp))
    elif pf.max <= df.max and pf.smallest_subnormal >= df.smallest_subnormal:
        parts.append("widening: every value is kept exactly")
    if pf.max > df.max:
        parts.append(f"overflow {_outcome(cast(np.array([min(pf.max, df.max * 4)])), df)}")
        if pf.has_inf:
            parts.append(f"±inf {_outcome(cast(np.array([math.inf])), df)}")
    parts += _zero_and_sign(cast, src, df)
    if pf.signed_zero and not df.signed_zero and _value(cast(np.array([0.0]))) == 0:
        parts.append(f"-0 {_outcome(cast(np.array([-0.0])), df)}")  # the fnuz types: +0
    if pf.has_nan:
        nan = cast(np.array([math.nan]))
        parts.append(f"NaN -> {_hex(nan, df)}{_not_nan(nan, df)}")
    return "; ".join(parts)


def _int_range(row: DTypeRow) -> tuple[int, int]:
    """The largest and smallest value of an integer row (bool: 1 and 0)."""
    if row.category == "bool":
        return 1, 0
    info: Any = ml_dtypes.iinfo(row.numpy)  # type: ignore[no-untyped-call]  # int4 too
    return int(info.max), int(info.min)


def _not_nan(a: Array, fmt: Format) -> str:
    """What a NaN became, where the target has no NaN to make of it."""
    v = float(astype(a, np.dtype(np.float64))[0])
    if math.isnan(v):
        return ""
    return f" ({v:g}: {fmt.row.name} has no NaN)"


def _zero_and_sign(cast: Cast, src: DTypeRow, df: Format) -> list[str]:
    """What becomes of 0 and -1 in a target that has no zero or no sign (float8_e8m0fnu,
    float8_e5m3fnu)."""
    parts = []
    zero = cast(np.array([0.0]))
    if _value(zero) != 0:
        parts.append(f"0 {_outcome(zero, df)} ({_hex(zero, df)})")
    if not df.signed and src.category not in ("bool", "uint"):
        parts.append(f"-1 {_outcome(cast(np.array([-1.0])), df)}")
    return parts


def _value(a: Array) -> float:
    return float(astype(a, np.dtype(np.float64))[0])


def _hex(a: Array, fmt: Format) -> str:
    bits = int(a.view(f"u{a.itemsize}")[0])
    return f"{bits:#0{fmt.width // 4 + 2}x}"


def _tie_rule(cast: Cast, row: DTypeRow) -> str:
    """Cast the two midpoints above 1.0 and see which neighbour each one went to."""
    unsigned = np.dtype(f"u{row.itemsize}")
    one = int(astype(np.array([1.0]), row.numpy).view(unsigned)[0])
    ladder = np.array([one, one + 1, one + 2], unsigned).view(row.numpy)
    v = astype(ladder, np.dtype(np.float64)).tolist()
    got = cast(np.array([(v[0] + v[1]) / 2, (v[1] + v[2]) / 2]))
    bits = got.view(f"u{got.itemsize}").tolist()
    if bits == [lo + lo % 2 for lo in (one, one + 1)]:
        return "rounds to nearest, ties to even"
    if bits == [one + 1, one + 2]:
        return "rounds to nearest, ties away from zero"
    return "rounds to nearest"


def _outcome(a: Array, fmt: Format) -> str:
    v = _value(a)
    if v == 0:
        return "-> -0" if math.copysign(1.0, v) < 0 else "-> +0"
    if math.isinf(v):
        return "-> ±inf"
    if math.isnan(v):
        return "-> NaN"
    if abs(v) == fmt.max:
        return f"-> ±{fmt.max:g} (saturates)"
    return f"-> {v:g}"
