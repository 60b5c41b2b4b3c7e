"""stats(): min, max, mean, std, sum and NaN/inf/zero counts of a tensor or array.

Values are read chunk by chunk and accumulated in float64, so a bfloat16 or float16
sum does not stall at its own precision. Each chunk's mean and squared deviations
are merged into the running ones with Chan et al.'s pairwise update, which stays
accurate where a running sum of squares would cancel. Complex values count as
their real and imaginary parts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ._record import Record
from ._values import chunks, real_parts, source


@dataclass(frozen=True)
class Stats(Record):
    """Summary of a tensor's or array's values, accumulated in float64.

    min/max/absmax/mean/std/sum are over the finite values (``None`` when there are
    none); std is the population one (ddof=0). Complex values contribute their real
    and imaginary parts as separate values.
    """

    dtype: str
    numel: int
    finite: int
    nan_count: int
    posinf_count: int
    neginf_count: int
    zeros: int
    min: float | None
    max: float | None
    absmax: float | None
    mean: float | None
    std: float | None
    sum: float | None

    @property
    def inf_count(self) -> int:
        return self.posinf_count + self.neginf_count


def stats(x: Any) -> Stats:
    """Min, max, mean, std, sum and NaN/inf counts of ``x``, accumulated in float64.

    >>> import torch, tensorbridge as tb
    >>> s = tb.stats(torch.ones(10_000, dtype=torch.bfloat16))
    >>> s.sum, s.mean, s.std
    (10000.0, 1.0, 0.0)

    Raises:
        UnsupportedDtypeError / UnsupportedTensorError / NoDataError: ``x`` holds no
            values this library can read.
    """
    src = source(x)
    numel = finite = nan = posinf = neginf = zeros = 0
    lo, hi, total, mean, m2 = math.inf, -math.inf, 0.0, 0.0, 0.0
    for chunk in chunks(src):
        numel += chunk.numel()
        v = real_parts(chunk).to(torch.float64)
        finite_mask = v.isfinite()
        fin = v
        if not bool(finite_mask.all()):  # the common all-finite chunk skips these passes
            nan += int(torch.count_nonzero(v.isnan()))
            posinf += int(torch.count_nonzero(v == math.inf))
            neginf += int(torch.count_nonzero(v == -math.inf))
            fin = v[finite_mask]
        zeros += int(torch.count_nonzero(fin == 0))
        n = fin.numel()
        if not n:
            continue
        lo, hi = min(lo, float(fin.min())), max(hi, float(fin.max()))
        s = float(fin.sum())
        m = s / n
        chunk_m2 = float(((fin - m) ** 2).sum())
        total += s
        delta = m - mean  # Chan et al.'s pairwise update of the mean and the squared deviations
        mean += delta * n / (finite + n)
        m2 += chunk_m2 + delta * delta * finite * n / (finite + n)
        finite += n
    some = finite > 0
    return Stats(
        dtype=src.row.name,
        numel=numel,
        finite=finite,
        nan_count=nan,
        posinf_count=posinf,
        neginf_count=neginf,
        zeros=zeros,
        min=lo if some else None,
        max=hi if some else None,
        absmax=max(abs(lo), abs(hi)) if some else None,
        mean=mean if some else None,
        std=math.sqrt(m2 / finite) if some else None,
        sum=total if some else None,
    )
