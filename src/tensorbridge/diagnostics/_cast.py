"""cast_report(): what casting to a floating-point or complex dtype does to each value.

The cast is the one ``to_numpy(x, dtype=...)`` runs, applied chunk by chunk; the
report counts overflow to inf, saturation, flush to zero, NaNs made or changed (sign
and payload), zeros and signs the target cannot hold (float8_e8m0fnu has neither:
torch casts 0.0 to 2^-127 and -1.0 to +1.0, where ml_dtypes makes NaN) and errors in
units of the target's ULP. The kernel is torch's where torch has kernels for both
dtypes, and then NumPy's ``astype`` (ml_dtypes' kernels for their types) runs on the
same values beside it and its disagreements are counted, since the two kernels part
ways on overflow, zero and sign for the float8 types. Where torch has no kernels for
either dtype (int4 and its kin) or lacks it (float6_e2m3fn, float8_e4m3, ...), the
plans cast with ml_dtypes' ``astype``, and so does the report: from the values as
stored (``_values.host_chunks``), into the target's own type, its results widened
exactly to be counted. The ``semantics`` line is probed on the installation, once per
dtype pair and kernel (:mod:`._semantics`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import torch

from .._ml_cast import astype
from ..convert import to_numpy, to_torch
from ..dtypes import DTypeLike, DTypeRow, resolve_dtype
from ..errors import InvalidArgumentError, UnsupportedDtypeError
from ._record import Record
from ._semantics import kernel_of, semantics
from ._values import (
    BITS_BY_SIZE,
    Format,
    Scratch,
    Source,
    bits_of,
    chunks,
    component_row,
    format_of,
    host_chunks,
    part_bits,
    real_parts,
    source,
    to_float32,
    wide_row,
)

ULP_BINS = ("0", "<=0.5", "<=1", "<=2", ">2")
_CHUNK = 1 << 20  # values per chunk: its float32 buffers stay in the last-level cache


@dataclass(frozen=True)
class CastReport(Record):
    """What casting to ``target_dtype`` with the kernel ``to_numpy`` runs does to each value.

    Counts are over real values (a complex element counts twice):

    Attributes:
        kernel / semantics: whose cast this is, the one ``to_numpy(x, dtype=)`` runs
            ("torch"; "ml_dtypes" where torch has no kernels for a dtype or lacks it) and
            how it treats ties, overflow, inf, zero, sign and NaN, as probed on this
            installation (a NaN cast to float6 or float4, which have none, becomes -0).
        exact / inexact: finite values kept exactly / changed.
        overflow_inf: finite values that became ±inf.
        saturated: values beyond the target's range (or ±inf) clamped to ±max finite.
        nan_created: non-NaN values that became NaN.
        flushed_to_zero: nonzero finite values that became ±0.
        subnormal: results that are subnormal in the target.
        nan_changed: NaNs whose sign or payload (the top mantissa bits that fit) changed.
        zero_replaced: zeros that became a nonzero value, in a target with no zero
            (torch casts ±0.0 to float8_e8m0fnu's smallest value, 2^-127, bits 0x00).
        sign_dropped: negative values that came out positive, in a target with no sign
            (torch casts -1.0 to float8_e8m0fnu's +1.0).
        max_abs_err / max_rel_err / mean_rel_err: over finite values with a finite
            result (relative: nonzero values only); ``None`` when there are none.
        ulp_histogram: |result - value| in units of the target's ULP at the value
            (correct rounding gives at most 0.5; saturation lands in ">2").
        ml_dtypes_nan: non-NaN values that NumPy's ``astype`` (ml_dtypes' kernel for its
            types) would turn into NaN instead — e.g. float8_e4m3fn overflow, or a zero or
            negative value cast to float8_e8m0fnu (with the "ml_dtypes" kernel: the
            values that became NaN).
        astype_differs: values whose bits ``astype`` would make differently (0 with the
            "ml_dtypes" kernel, which is ``astype``).
        imag_discarded: nonzero imaginary parts dropped by a complex-to-real cast.
        safe: nothing overflowed, saturated, flushed, lost its zero or sign, or became or
            changed a NaN. It says nothing of rounding: a cast to float8 that is "safe"
            can still change values by 12 % or more (see ``max_rel_err``, ``rtol``).
        rtol: the relative tolerance asked for (``None``: rounding is not judged).
        ok: the verdict: ``safe``, and with ``rtol`` given, ``max_rel_err <= rtol``.
    """

    source_dtype: str
    target_dtype: str
    kernel: str
    semantics: str
    numel: int
    exact: int
    inexact: int
    overflow_inf: int
    saturated: int
    nan_created: int
    flushed_to_zero: int
    subnormal: int
    nan_changed: int
    zero_replaced: int
    sign_dropped: int
    max_abs_err: float | None
    max_rel_err: float | None
    mean_rel_err: float | None
    ulp_histogram: Mapping[str, int]
    ml_dtypes_nan: int | None
    astype_differs: int | None
    imag_discarded: int
    safe: bool
    rtol: float | None = None
    ok: bool = True


def cast_report(x: Any, dtype: DTypeLike, *, rtol: float | None = None) -> CastReport:
    """What casting ``x`` to ``dtype`` would do, with the kernel ``to_numpy(x, dtype=)`` runs.

    >>> import torch, tensorbridge as tb
    >>> r = tb.cast_report(torch.tensor([0.5, 1e6, -1.0]), "float8_e5m2")
    >>> r.overflow_inf, r.exact, r.safe
    (1, 2, False)
    >>> r = tb.cast_report(torch.tensor([0.3, 1.0]), "float8_e4m3fn", rtol=0.01)
    >>> r.safe, round(r.max_rel_err, 4), r.ok  # 0.3 became 0.3125: over rtol
    (True, 0.0417, False)
    >>> r = tb.cast_report(torch.tensor([0.3, 9.0]), "float6_e2m3fn")  # not in torch
    >>> r.kernel, r.saturated, r.exact  # ml_dtypes' astype: 9.0 became 7.5
    ('ml_dtypes', 1, 0)

    Args:
        x: a tensor, array or number.
        dtype: the floating-point or complex dtype to cast to.
        rtol: the largest relative rounding error the verdict ``ok`` accepts (``None``:
            ``ok`` is ``safe``, which judges overflow, flushing and NaNs, not rounding).

    Raises:
        UnsupportedDtypeError: ``dtype`` is unknown or not a floating/complex dtype.
        InvalidArgumentError: a negative or NaN ``rtol``.
    """
    if rtol is not None and not rtol >= 0:
        raise InvalidArgumentError(
            f"rtol={rtol!r} is not a tolerance; pass a number >= 0, or None to judge only "
            "overflow, flushing and NaNs"
        )
    src = source(x)
    dst = resolve_dtype(dtype)
    if dst.category not in ("float", "complex"):
        raise UnsupportedDtypeError(
            f"cast_report reports on casts to floating-point or complex dtypes, not {dst.name} "
            "(a cast to integers truncates); pass e.g. dtype='float32'"
        )
    counts = _Counts(src.row, dst)
    kernel = kernel_of(src.row, dst)
    if kernel == "torch":
        _count_torch(src, dst, counts)
    else:
        _count_ml_dtypes(src, dst, counts)
    return counts.report(kernel, rtol)


class _Counts:
    """What :func:`cast_report` counts, chunk by chunk, for either kernel."""

    def __init__(self, src: DTypeRow, dst: DTypeRow) -> None:
        self.src, self.dst = src, dst
        self.fmt = format_of(component_row(dst))
        is_float = src.category in ("float", "complex")
        self.sfmt = format_of(component_row(src)) if is_float else None
        self.c = dict.fromkeys(_COUNTS, 0)
        self.hist = dict.fromkeys(ULP_BINS, 0)
        self.max_abs = self.max_rel = self.rel_sum = 0.0
        self.seen_finite = self.seen_rel = False
        self.astype_ok = True  # False once NumPy's astype could not be compared

    def add_quick(self, q: _Quick, n: int) -> None:
        """A chunk :func:`_quick_chunk` counted (finite, in range, rounded to nearest)."""
        c = self.c
        c["exact"] += q.exact
        c["inexact"] += n - q.exact
        c["flushed"] += q.flushed
        c["subnormal"] += q.subnormal
        self.seen_finite = True
        self.max_abs = max(self.max_abs, q.max_abs)
        if q.nonzero:
            self.seen_rel = True
            self.max_rel, self.rel_sum = max(self.max_rel, q.max_rel), self.rel_sum + q.rel_sum
            c["rel_n"] += q.nonzero
        self.hist["0"] += q.exact  # at most half a ULP off: every inexact value there
        self.hist["<=0.5"] += n - q.exact

    def add(self, sv: torch.Tensor, rv: torch.Tensor, nan_bits: _Bits) -> torch.Tensor:
        """Source and result values (float64, side by side) of one chunk; ``nan_bits``
        gives both sides' stored bits where the source is NaN. Returns the NaN mask."""
        c, fmt = self.c, self.fmt
        s_nan, s_fin, r_fin, r_nan = sv.isnan(), sv.isfinite(), rv.isfinite(), rv.isnan()
        same_value = s_fin & (rv == sv)
        c["exact"] += int(torch.count_nonzero(same_value))
        c["inexact"] += int(torch.count_nonzero(s_fin & ~same_value))
        c["overflow_inf"] += int(torch.count_nonzero(s_fin & rv.isinf()))
        beyond = sv.isinf() | (s_fin & _overflows(sv.abs(), fmt))
        c["saturated"] += int(torch.count_nonzero(beyond & r_fin & (rv.abs() == fmt.max)))
        c["nan_created"] += int(torch.count_nonzero(~s_nan & r_nan))
        c["flushed"] += int(torch.count_nonzero(s_fin & (sv != 0) & (rv == 0)))
        c["zero_replaced"] += int(torch.count_nonzero((sv == 0) & (rv != 0) & ~r_nan))
        c["sign_dropped"] += int(torch.count_nonzero((sv < 0) & (rv > 0)))
        c["subnormal"] += int(
            torch.count_nonzero(r_fin & (rv != 0) & (rv.abs() < fmt.smallest_normal))
        )
        if self.sfmt is not None and bool(s_nan.any()):
            sb, rb = nan_bits(s_nan)
            c["nan_changed"] += _nan_changes(sb, rb, r_nan[s_nan], self.sfmt, fmt)
        both = s_fin & r_fin
        if bool(both.any()):
            self._errors(sv, rv, both)
        return s_nan

    def _errors(self, sv: torch.Tensor, rv: torch.Tensor, both: torch.Tensor) -> None:
        """Absolute, relative and ULP errors where source and result are finite."""
        self.seen_finite = True
        every = bool(both.all())  # the usual case: no boolean-index copies
        err = (rv - sv).abs_() if every else (rv[both] - sv[both]).abs()
        ref = sv.abs() if every else sv[both].abs()
        self.max_abs = max(self.max_abs, float(err.max()))
        nz = ref > 0
        if bool(nz.any()):
            self.seen_rel = True
            rel = err / ref if bool(nz.all()) else err[nz] / ref[nz]
            self.max_rel = max(self.max_rel, float(rel.max()))
            self.rel_sum += float(rel.sum())
            self.c["rel_n"] += int(torch.count_nonzero(nz))
        u = err / _target_ulp(ref, self.fmt)
        for name, n in zip(ULP_BINS, _histogram(u), strict=True):
            self.hist[name] += n

    def report(self, kernel: str, rtol: float | None) -> CastReport:
        c = self.c
        unsafe = ("overflow_inf", "saturated", "nan_created", "flushed", "nan_changed", "imag")
        safe = not any(c[k] for k in (*unsafe, "zero_replaced", "sign_dropped"))
        within = rtol is None or not self.seen_rel or self.max_rel <= rtol
        ml_nan, differs = c["ml_nan"], c["differs"]
        if kernel != "torch":  # ml_dtypes' own kernel: what NumPy's astype does was counted
            ml_nan, differs = c["nan_created"], 0
        return CastReport(
            source_dtype=self.src.name,
            target_dtype=self.dst.name,
            kernel=kernel,
            semantics=semantics(self.src, self.dst, kernel),
            numel=c["numel"],
            exact=c["exact"],
            inexact=c["inexact"],
            overflow_inf=c["overflow_inf"],
            saturated=c["saturated"],
            nan_created=c["nan_created"],
            flushed_to_zero=c["flushed"],
            subnormal=c["subnormal"],
            nan_changed=c["nan_changed"],
            zero_replaced=c["zero_replaced"],
            sign_dropped=c["sign_dropped"],
            max_abs_err=self.max_abs if self.seen_finite else None,
            max_rel_err=self.max_rel if self.seen_rel else None,
            mean_rel_err=self.rel_sum / c["rel_n"] if self.seen_rel else None,
            ulp_histogram=self.hist,
            ml_dtypes_nan=ml_nan if self.astype_ok else None,
            astype_differs=differs if self.astype_ok else None,
            imag_discarded=c["imag"],
            safe=safe,
            rtol=None if rtol is None else float(rtol),
            ok=safe and within,
        )


_COUNTS = (
    "numel", "exact", "inexact", "overflow_inf", "saturated", "nan_created", "flushed",
    "subnormal", "nan_changed", "zero_replaced", "sign_dropped", "ml_nan", "differs", "imag",
    "rel_n",
)  # fmt: skip
# the stored bits of source and result where a mask (the source's NaNs) is set, as int64
_Bits = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def _count_torch(src: Source, dst: DTypeRow, counts: _Counts) -> None:
    """torch's kernel, a chunk at a time: the quick path where it applies, else every count,
    with NumPy's ``astype`` run beside it and its disagreements counted."""
    quick_plan = _quick_plan(src.row, dst)
    scratch = Scratch()
    for chunk in chunks(src, _CHUNK):
        counts.c["numel"] += chunk.numel()
        if chunk.is_complex() and not dst.torch.is_complex:
            counts.c["imag"] += int(torch.count_nonzero(chunk.imag != 0))
            chunk_in = chunk.real
        else:
            chunk_in = chunk
        res = scratch.get("res", dst.torch, chunk_in.numel()).copy_(chunk_in)
        quick = (
            _quick_chunk(chunk_in, res, counts.fmt, scratch, quick_plan)
            if quick_plan is not None
            else None
        )
        if quick is not None:
            n = chunk_in.numel()
            counts.add_quick(quick, n)
            if counts.astype_ok and not quick_plan:  # the kernels may part ways on these values
                s_nan = torch.zeros(n, dtype=torch.bool)
                counts.astype_ok = _astype_check(chunk_in, res, s_nan, dst, counts.c)
            continue
        s, r = _cast_parts(chunk_in, res)

        def nan_bits(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return bits_of(s[mask]), bits_of(r[mask])  # noqa: B023  (called at once)

        s_nan = counts.add(s.to(torch.float64), r.to(torch.float64), nan_bits)
        if counts.astype_ok:
            counts.astype_ok = _astype_check(chunk_in, res, s_nan, dst, counts.c)


def _count_ml_dtypes(src: Source, dst: DTypeRow, counts: _Counts) -> None:
    """ml_dtypes' ``astype``, a chunk at a time, from the values as stored (a row torch has
    no kernels for, or a target torch lacks): what ``to_numpy(x, dtype=dst)`` runs."""
    comp = component_row(src.row).numpy
    drop_imag = src.row.category == "complex" and dst.category != "complex"
    to_complex = dst.category == "complex" and src.row.category != "complex"
    wide = wide_row(dst).numpy
    for raw, values in host_chunks(src, _CHUNK):
        counts.c["numel"] += values.numel()
        if drop_imag:
            counts.c["imag"] += int(torch.count_nonzero(values.imag != 0))
            raw, values = raw.view(comp).reshape(-1, 2)[:, 0], values.real
        res = astype(raw, dst.numpy)
        made = to_torch(res) if dst.kernels else torch.from_numpy(astype(res, wide))
        s, r = _cast_parts(values, made)

        def nan_bits(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            rb = part_bits(res)  # noqa: B023  (called at once)
            rb = rb[::2] if to_complex else rb  # a real source faces the real parts
            sb = torch.from_numpy(part_bits(raw))  # noqa: B023
            return sb[mask], torch.from_numpy(rb)[mask]

        counts.add(s.to(torch.float64), r.to(torch.float64), nan_bits)


def _quick_plan(src: DTypeRow, dst: DTypeRow) -> bool | None:
    """Whether chunks of ``src`` cast to ``dst`` may take :func:`_quick_chunk` (``None``:
    never), and whether NumPy's ``astype`` is known to agree with torch's cast there
    (``True``: :func:`_kernels_agree` found it so, and the comparison is skipped)."""
    if src.category != "float" or dst.category != "float":
        return None
    if src.itemsize > 4 or dst.itemsize > 4 or not format_of(dst).signed:
        return None
    return _kernels_agree(src, dst)


@dataclass(frozen=True)
class _Quick:
    """What :func:`_quick_chunk` counts of one chunk."""

    exact: int
    flushed: int
    subnormal: int
    max_abs: float
    max_rel: float
    rel_sum: float
    nonzero: int


def _quick_chunk(
    s_in: torch.Tensor, res: torch.Tensor, fmt: Format, scratch: Scratch, agree: bool
) -> _Quick | None:
    """The counts of one real chunk whose values are all finite, within the target's range
    and rounded to nearest, in float32, in about ten passes; ``None`` when the chunk is
    not such a one (the general path then counts it).

    Such values cannot overflow, saturate, become NaN or lose their zero or sign (the
    target is signed), and each is at most half a ULP off, so what is left to count is
    rounding: the error ``r - s`` is exact in float32 (``r`` is within a factor of two of
    ``s``, or zero). Where ``agree`` (torch's kernel made ml_dtypes' bits on every tie
    probed, :func:`_kernels_agree`) the half-ULP bound is torch's rounding to nearest;
    otherwise it is checked on each value: the target's ULP at ``|s|`` is
    ``2^(max(e, emin) - nmant)``, where ``2^e`` is ``|s|`` with its mantissa bits cleared.
    """
    n = s_in.numel()
    f32 = torch.float32
    s = to_float32(s_in, scratch, "s")
    mag = torch.abs(s, out=scratch.get("mag", f32, n))
    lo, hi = (float(v) for v in torch.aminmax(mag))
    if not hi <= fmt.max:  # NaN, inf, or beyond the largest finite value
        return None
    rv = to_float32(res, scratch, "r", finite=True)  # widened first: a mixed-dtype
    err = torch.sub(rv, s, out=rv if rv is not res else scratch.get("err", f32, n))  # sub is slow
    e_lo, e_hi = torch.aminmax(err)
    max_abs = max(-float(e_lo), float(e_hi))
    if not agree and not _within_half_ulp(mag, err, lo, fmt, scratch):
        return None
    small = _small_counts(mag, res, fmt, lo == 0) if lo < fmt.smallest_normal else (0, 0, 0)
    rel = torch.div(err, mag, out=mag)
    if lo == 0:  # zeros among the values (0 / 0): they have no relative error
        rel.nan_to_num_(nan=0.0)
    # float32 quotients of exact operands, correctly rounded: the largest is the float32
    # rounding of the exact largest (within 6e-8 of it, relative)
    r_lo, r_hi = torch.aminmax(rel)
    max_rel = max(-float(r_lo), float(r_hi))
    if not max_rel <= 1:  # at most half a ULP: never more than the value itself
        return None
    rel_sum = float(rel.abs_().sum())
    # a relative error is 0 or positive: its sign counts the inexact values (a float32 sum
    # of at most 2^24 ones and zeros is exact)
    inexact = int(rel.sign_().sum())
    zeros, flushed, subnormal = small
    return _Quick(n - inexact, flushed, subnormal, max_abs, max_rel, rel_sum, n - zeros)


def _within_half_ulp(
    mag: torch.Tensor, err: torch.Tensor, lo: float, fmt: Format, scratch: Scratch
) -> bool:
    """Whether every ``|err|`` is at most half the target's ULP at ``mag``."""
    emin = _emin_bits(fmt)
    ex = torch.bitwise_and(
        mag.view(torch.int32), 0x7F800000, out=scratch.get("e", torch.int32, mag.numel())
    )
    scale = (ex.clamp_min_(emin) if lo < fmt.smallest_normal else ex).view(torch.float32)
    w = torch.div(err, scale, out=scale)
    w_lo, w_hi = torch.aminmax(w)
    return max(-float(w_lo), float(w_hi)) <= 2.0 ** -(fmt.nmant + 1)


_ROW = 256  # values per row when the rows holding small values are picked out


def _small_counts(
    mag: torch.Tensor, res: torch.Tensor, fmt: Format, has_zeros: bool
) -> tuple[int, int, int]:
    """(zeros, flushed to zero, subnormal results) of a chunk that holds magnitudes below
    the target's smallest normal; counted on the rows of ``_ROW`` values that hold such
    values (8-bit results: from a histogram of their bit patterns). ``has_zeros``: the
    smallest magnitude is 0 (otherwise no zero is counted)."""
    n = mag.numel()
    full = n - n % _ROW
    m_rows = mag[:full].view(-1, _ROW)
    bits = res.view(BITS_BY_SIZE[res.element_size()])
    if full:
        rows = torch.nonzero(m_rows.amin(dim=1) < fmt.smallest_normal).reshape(-1)
        if len(rows) * 4 < len(m_rows):  # a few rows: gather them (and the ragged tail)
            m_sub = m_rows.index_select(0, rows).reshape(-1)
            b_sub = bits[:full].view(-1, _ROW).index_select(0, rows).reshape(-1)
            if full < n:
                m_sub, b_sub = torch.cat((m_sub, mag[full:])), torch.cat((b_sub, bits[full:]))
            mag, bits = m_sub, b_sub
    zeros = mag.numel() - int(torch.count_nonzero(mag)) if has_zeros else 0
    if bits.dtype is torch.uint8:  # one histogram of the 256 patterns, classified once
        counts = torch.bincount(bits, minlength=256)
        zero, small = _classes(fmt.row)
        zero_results, small_results = int(counts[zero].sum()), int(counts[small].sum())
    else:  # a few rows of wider results: their values
        v = bits.view(res.dtype).to(torch.float32)
        zero_results = v.numel() - int(torch.count_nonzero(v))
        small_results = int(torch.count_nonzero(v.abs_() < fmt.smallest_normal))
    return zeros, zero_results - zeros, small_results - zero_results


@cache
def _classes(row: DTypeRow) -> tuple[torch.Tensor, torch.Tensor]:
    """The bit patterns of ``row`` (8 bits) that are ±0, and those that are ±0 or
    subnormal, as index tensors."""
    width = row.itemsize * 8
    raw = torch.arange(1 << width, dtype=torch.int32)
    raw = torch.where(raw >= 1 << (width - 1), raw - (1 << width), raw)
    v = raw.to(BITS_BY_SIZE[row.itemsize]).view(row.torch).to(torch.float32)
    smallest = format_of(row).smallest_normal
    zero = torch.nonzero(v == 0).reshape(-1)
    small = torch.nonzero(v.isfinite() & (v.abs() < smallest)).reshape(-1)
    return zero, small


@cache
def _emin_bits(fmt: Format) -> int:
    """The float32 exponent bits of the target's smallest normal."""
    return int(np.asarray(fmt.smallest_normal, np.float32).view(np.int32)) & 0x7F800000


@cache
def _kernels_agree(src: DTypeRow, dst: DTypeRow) -> bool:
    """Whether NumPy's ``astype`` (ml_dtypes' kernels) makes the same bits as torch's cast
    from ``src`` to ``dst`` for every finite value within ``dst``'s range, probed on this
    installation: every bit pattern of an 8- or 16-bit ``src``; for float32, every upper
    half with the lower halves that hold the target's ties and their neighbours."""
    width = src.itemsize * 8
    if width <= 16:
        raw = torch.arange(1 << width, dtype=torch.int64)
    else:
        lows = {0, 0xFFFF}
        for k in range(16):
            lows |= {1 << k, (1 << k) - 1, (1 << k) + 1}
        low = torch.tensor(sorted(lows), dtype=torch.int64)
        raw = (torch.arange(1 << 16, dtype=torch.int64)[:, None] << 16 | low).reshape(-1)
    raw = torch.where(raw >= 1 << (width - 1), raw - (1 << width), raw)
    values = raw.to(BITS_BY_SIZE[src.itemsize]).view(src.torch)
    wide = values.to(torch.float64)
    values = values[wide.isfinite() & (wide.abs() <= format_of(component_row(dst)).max)]
    ours = values.to(dst.torch)
    try:
        with np.errstate(all="ignore"):
            theirs = to_torch(to_numpy(values).astype(dst.numpy))
    except (TypeError, ValueError):
        return False
    return bool(torch.equal(bits_of(ours), bits_of(theirs)))


def _cast_parts(src: torch.Tensor, res: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Source and result values side by side (a real source facing a complex result: reals)."""
    if res.is_complex() and not src.is_complex():
        return src.reshape(-1), torch.view_as_real(res)[..., 0].reshape(-1)
    return real_parts(src).reshape(-1), real_parts(res).reshape(-1)


def _overflows(mag: torch.Tensor, fmt: Format) -> torch.Tensor:
    """Magnitudes that round (half to even, unbounded exponent) above the largest finite."""
    half = fmt.max + fmt.top_ulp / 2
    return (mag > half) | ((mag == half) & bool(fmt.max_ord & 1))


def _target_ulp(mag: torch.Tensor, fmt: Format) -> torch.Tensor:
    """The target's spacing at each magnitude (continued past the largest finite value)."""
    emin = math.frexp(fmt.smallest_normal)[1] - 1
    exponent = torch.frexp(mag).exponent.to(torch.int64) - 1
    exponent = torch.where(mag == 0, emin, exponent.clamp(min=emin))
    return torch.exp2((exponent - fmt.nmant).to(torch.float64))


def _histogram(u: torch.Tensor) -> list[int]:
    edges = [(u == 0), (u > 0) & (u <= 0.5), (u > 0.5) & (u <= 1), (u > 1) & (u <= 2), u > 2]
    return [int(torch.count_nonzero(e)) for e in edges]


def _nan_changes(
    sb: torch.Tensor, rb: torch.Tensor, r_nan: torch.Tensor, sf: Format, rf: Format
) -> int:
    """NaNs whose result is not a NaN of the same sign and the same (aligned) payload, from
    the stored bits (int64) of the NaN sources and of their results."""
    s_sign = (sb >> (sf.width - 1)) & 1 if sf.signed else torch.zeros_like(sb)
    r_sign = (rb >> (rf.width - 1)) & 1 if rf.signed else torch.zeros_like(rb)
    sp, rp = sb & ((1 << sf.nmant) - 1), rb & ((1 << rf.nmant) - 1)
    shift = sf.nmant - rf.nmant
    aligned = sp >> shift if shift >= 0 else sp << -shift
    return int(torch.count_nonzero(~r_nan | (s_sign != r_sign) | (aligned != rp)))


def _astype_check(
    src: torch.Tensor, res: torch.Tensor, s_nan: torch.Tensor, dst: DTypeRow, c: dict[str, int]
) -> bool:
    """Count what NumPy's astype (ml_dtypes' kernels) would do differently; False if it can't."""
    try:
        with np.errstate(all="ignore"):  # overflow in the cast is what is being measured
            ref = to_numpy(src).astype(dst.numpy)
    except (TypeError, ValueError):
        return False
    ref_t = to_torch(ref)
    _, rv = _cast_parts(src, ref_t)
    c["ml_nan"] += int(torch.count_nonzero(~s_nan & rv.to(torch.float64).isnan()))
    w = dst.itemsize
    ours = res.contiguous().reshape(-1).view(torch.uint8).reshape(-1, w)
    theirs = ref_t.reshape(-1).view(torch.uint8).reshape(-1, w)
    c["differs"] += int(torch.count_nonzero((ours != theirs).any(dim=1)))
    return True
