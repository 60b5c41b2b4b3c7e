"""How the installed torch casts one dtype to another, probed, not copied from documents.

:func:`semantics` casts a few values (the two midpoints above 1.0, a value beyond the
target's range, ±inf, 0, -1, NaN) with torch's kernel and says, in one line, what
became of them: the tie rule, overflow (inf, NaN or saturation: torch 2.13 began to
saturate float8_e4m3fn overflow, where older releases make NaN), zero and sign in a
target without them (float8_e8m0fnu), and the NaN made. ``cast_report`` prints it as
its ``semantics``; it is probed once per dtype pair.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache

import numpy as np
import torch

from ..dtypes import DTypeRow
from ._values import BITS_BY_SIZE, Format, bits_of, component_row, format_of

__all__ = ["semantics"]


@cache
def semantics(src: DTypeRow, dst: DTypeRow) -> str:
    """How torch's kernel casts src -> dst (ties, overflow, inf, NaN), probed on this install."""
    dcomp = component_row(dst)
    df = format_of(dcomp)
    parts = [f"torch's CPU cast {src.name} -> {dst.name}, as tb.to_numpy(x, dtype=...) runs it"]
    if src.category not in ("float", "complex"):
        top = 1 if src.category == "bool" else int(np.iinfo(src.numpy).max)
        big = min(top, int(df.max) * 4)
        parts.append("integers round to the nearest representable value")
        if big > df.max:
            got = torch.tensor([big], dtype=src.torch).to(dcomp.torch)
            parts.append(f"overflow {_outcome(got, df)}")
        parts += _zero_and_sign(lambda v: torch.tensor(v).to(src.torch).to(dcomp.torch), src, df)
        return "; ".join(parts)
    probe = component_row(src)
    pf = format_of(probe)
    if src.category == "complex" and dst.category != "complex":
        parts.append("the imaginary part is dropped")

    def cast(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float64).to(probe.torch).to(dcomp.torch)

    if pf.nmant > df.nmant:
        parts.append(_tie_rule(cast, dcomp))
    elif pf.max <= df.max and pf.smallest_subnormal >= df.smallest_subnormal:
        parts.append("widening: every value is kept exactly")
    if pf.max > df.max:
        parts.append(f"overflow {_outcome(cast([min(pf.max, df.max * 4)]), df)}")
        if _has_inf(probe):
            parts.append(f"±inf {_outcome(cast([math.inf]), df)}")
    parts += _zero_and_sign(cast, src, df)
    parts.append(f"NaN -> {_hex(cast([math.nan]), df)}")
    return "; ".join(parts)


def _zero_and_sign(
    cast: Callable[[list[float]], torch.Tensor], src: DTypeRow, df: Format
) -> list[str]:
    """What becomes of 0 and -1 in a target that has no zero or no sign (float8_e8m0fnu)."""
    parts = []
    zero = cast([0.0])
    if float(zero.to(torch.float64)[0]) != 0:
        parts.append(f"0 {_outcome(zero, df)} ({_hex(zero, df)})")
    if not df.signed and src.category not in ("bool", "uint"):
        parts.append(f"-1 {_outcome(cast([-1.0]), df)}")
    return parts


def _hex(t: torch.Tensor, fmt: Format) -> str:
    return f"{int(bits_of(t)[0]):#0{fmt.width // 4 + 2}x}"


def _tie_rule(cast: Callable[[list[float]], torch.Tensor], row: DTypeRow) -> str:
    """Cast the two midpoints above 1.0 and see which neighbour each one went to."""
    one = int(bits_of(torch.ones(1, dtype=row.torch))[0])
    ladder = torch.tensor([one, one + 1, one + 2]).to(BITS_BY_SIZE[row.itemsize])
    v = ladder.view(row.torch).to(torch.float64).tolist()
    got = bits_of(cast([(v[0] + v[1]) / 2, (v[1] + v[2]) / 2])).tolist()
    if got == [lo + lo % 2 for lo in (one, one + 1)]:
        return "rounds to nearest, ties to even"
    if got == [one + 1, one + 2]:
        return "rounds to nearest, ties away from zero"
    return "rounds to nearest"


def _has_inf(row: DTypeRow) -> bool:
    inf = torch.tensor([math.inf], dtype=torch.float64).to(row.torch).to(torch.float64)
    return bool(inf.isinf().all())


def _outcome(t: torch.Tensor, fmt: Format) -> str:
    v = float(t.to(torch.float64)[0])
    if math.isinf(v):
        return "-> ±inf"
    if math.isnan(v):
        return "-> NaN"
    if abs(v) == fmt.max:
        return f"-> ±{fmt.max:g} (saturates)"
    return f"-> {v:g}"
