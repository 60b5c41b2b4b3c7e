"""stats(): min, max, mean, std, sum and NaN/inf/zero counts of a tensor or array.

Values are read chunk by chunk and accumulated in float64, so a bfloat16 or float16
sum does not stall at its own precision. Each chunk's mean and squared deviations
are merged into the running ones with Chan et al.'s pairwise update, which stays
accurate where a running sum of squares would cancel. Complex values count as
their real and imaginary parts.

A row torch has no kernels for (int4, float6_e2m3fn, bcomplex32, ...) is read as the
values ml_dtypes reads, widened exactly a chunk at a time (``_values.chunks``); its
subnormal values are counted on the widened values. Torch's own rows are reduced as
before, without that pass (``subnormals`` is ``None`` for them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..dtypes import DTypeRow
from ._record import Record
from ._values import chunks, component_row, format_of, real_parts, source


@dataclass(frozen=True)
class Stats(Record):
    """Summary of a tensor's or array's values, accumulated in float64.

    min/max/absmax/mean/std/sum are over the finite values (``None`` when there are
    none); std is the population one (ddof=0). Complex values contribute their real
    and imaginary parts as separate values. ``subnormals`` counts the values that are
    subnormal in the dtype, for the rows torch has no kernels for (read through
    ml_dtypes, where the pass costs little beside the widening) whose type has
    subnormals; it is ``None`` for integers, for types without subnormals
    (float8_e8m0fnu) and for torch's own rows, whose reductions skip that pass
    (``tb.cast_report(x, x.dtype).subnormal`` counts them).
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
    subnormals: int | None = None

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
    acc = StatsAccumulator(_subnormal_below(src.row))
    for chunk in chunks(src):
        acc.add(chunk)
    return acc.result(src.row.name)


def _subnormal_below(row: DTypeRow) -> float | None:
    """The smallest normal magnitude of a row whose subnormals :func:`stats` counts."""
    if row.kernels or row.category not in ("float", "complex"):
        return None
    fmt = format_of(component_row(row))
    return fmt.smallest_normal if fmt.subnormals else None


class StatsAccumulator:
    """:func:`stats` fed chunk by chunk (any order of values): for values computed piece by
    piece, such as a quantized weight dequantized a block row at a time.

    >>> import torch
    >>> acc = StatsAccumulator()
    >>> acc.add(torch.tensor([1.0, 2.0])); acc.add(torch.tensor([3.0, float("nan")]))
    >>> s = acc.result("float32")
    >>> s.mean, s.nan_count
    (2.0, 1)
    """

    def __init__(self, subnormal_below: float | None = None) -> None:
        """``subnormal_below``: the dtype's smallest normal magnitude, to count the nonzero
        finite values below it (``None``: not counted)."""
        self.numel = self.finite = self.nan = self.posinf = self.neginf = self.zeros = 0
        self.lo, self.hi, self.total, self.mean, self.m2 = math.inf, -math.inf, 0.0, 0.0, 0.0
        self.tiny, self.subnormals = subnormal_below, 0

    def add(self, chunk: torch.Tensor) -> None:
        """Take in one chunk's values."""
        self.numel += chunk.numel()
        v = real_parts(chunk).to(torch.float64)
        finite_mask = v.isfinite()
        fin = v
        if not bool(finite_mask.all()):  # the common all-finite chunk skips these passes
            self.nan += int(torch.count_nonzero(v.isnan()))
            self.posinf += int(torch.count_nonzero(v == math.inf))
            self.neginf += int(torch.count_nonzero(v == -math.inf))
            fin = v[finite_mask]
        zeros = int(torch.count_nonzero(fin == 0))
        self.zeros += zeros
        if self.tiny is not None:  # the values below the smallest normal, zeros excepted
            self.subnormals += int(torch.count_nonzero(fin.abs() < self.tiny)) - zeros
        n = fin.numel()
        if not n:
            return
        self.lo, self.hi = min(self.lo, float(fin.min())), max(self.hi, float(fin.max()))
        s = float(fin.sum())
        m = s / n
        chunk_m2 = float(((fin - m) ** 2).sum())
        self.total += s
        # Chan et al.'s pairwise update of the mean and the squared deviations
        delta = m - self.mean
        self.mean += delta * n / (self.finite + n)
        self.m2 += chunk_m2 + delta * delta * self.finite * n / (self.finite + n)
        self.finite += n

    def result(self, dtype: str) -> Stats:
        """The :class:`Stats` of every value taken in, labelled ``dtype``."""
        some = self.finite > 0
        return Stats(
            dtype=dtype,
            numel=self.numel,
            finite=self.finite,
            nan_count=self.nan,
            posinf_count=self.posinf,
            neginf_count=self.neginf,
            zeros=self.zeros,
            min=self.lo if some else None,
            max=self.hi if some else None,
            absmax=max(abs(self.lo), abs(self.hi)) if some else None,
            mean=self.mean if some else None,
            std=math.sqrt(self.m2 / self.finite) if some else None,
            sum=self.total if some else None,
            subnormals=self.subnormals if self.tiny is not None else None,
        )
