"""cast_report(): what casting to a floating-point or complex dtype does to each value.

The cast is the one ``to_numpy(x, dtype=...)`` runs, torch's kernel, applied chunk
by chunk; the report counts overflow to inf, saturation, flush to zero, NaNs made
or changed (sign and payload), zeros and signs the target cannot hold (float8_e8m0fnu
has neither: torch casts 0.0 to 2^-127 and -1.0 to +1.0, where ml_dtypes makes NaN)
and errors in units of the target's ULP. NumPy's ``astype`` (ml_dtypes' kernels for
their types) runs on the same values beside it and its disagreements are counted,
since the two kernels part ways on overflow, zero and sign for the float8 types. The
``semantics`` line is probed on the installed torch, once per dtype pair (ties,
overflow, inf, zero and sign, the NaN it makes: :mod:`._cast_semantics`), not copied
from documents: torch 2.13 began to saturate float8_e4m3fn overflow, where older
releases make NaN. Chunks whose values are all finite, in range and rounded to nearest
take a quick path of about ten passes (:func:`_quick_chunk`); the others are counted
value by value (:meth:`_Tally.add_chunk`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np
import torch

from ..convert import to_numpy, to_torch
from ..dtypes import DTypeLike, DTypeRow, resolve_dtype
from ..errors import InvalidArgumentError, UnsupportedDtypeError
from ._cast_semantics import semantics
from ._record import Record
from ._values import (
    BITS_BY_SIZE,
    Format,
    Scratch,
    bits_of,
    chunks,
    component_row,
    format_of,
    real_parts,
    source,
    to_float32,
)

ULP_BINS = ("0", "<=0.5", "<=1", "<=2", ">2")
_CHUNK = 1 << 20  # values per chunk: its float32 buffers stay in the last-level cache


@dataclass(frozen=True)
class CastReport(Record):
    """What casting to ``target_dtype`` with torch's kernel does to each value.

    Counts are over real values (a complex element counts twice):

    Attributes:
        kernel / semantics: whose cast this is ("torch", what ``to_numpy(x, dtype=)`` runs)
            and how it treats ties, overflow, inf and NaN, as probed on this installation.
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
            negative value cast to float8_e8m0fnu.
        astype_differs: values whose bits ``astype`` would make differently.
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
    """What casting ``x`` to ``dtype`` would do, with torch's kernel (``to_numpy(x, dtype=)``).

    >>> import torch, tensorbridge as tb
    >>> r = tb.cast_report(torch.tensor([0.5, 1e6, -1.0]), "float8_e5m2")
    >>> r.overflow_inf, r.exact, r.safe
    (1, 2, False)
    >>> r = tb.cast_report(torch.tensor([0.3, 1.0]), "float8_e4m3fn", rtol=0.01)
    >>> r.safe, round(r.max_rel_err, 4), r.ok  # 0.3 became 0.3125: over rtol
    (True, 0.0417, False)

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
    fmt = format_of(component_row(dst))
    sfmt = format_of(component_row(src.row)) if src.row.category in ("float", "complex") else None
    tally = _Tally()
    quick_plan = _quick_plan(src.row, dst)
    scratch = Scratch()
    for chunk in chunks(src, _CHUNK):
        tally.c["numel"] += chunk.numel()
        if chunk.is_complex() and not dst.torch.is_complex:
            tally.c["imag"] += int(torch.count_nonzero(chunk.imag != 0))
            chunk_in = chunk.real
        else:
            chunk_in = chunk
        res = scratch.get("res", dst.torch, chunk_in.numel()).copy_(chunk_in)
        quick = (
            _quick_chunk(chunk_in, res, fmt, scratch, quick_plan)
            if quick_plan is not None
            else None
        )
        if quick is not None:
            tally.add_quick(quick, chunk_in.numel())
            if tally.astype_ok and not quick_plan:  # the kernels may part ways on these values
                s_nan = torch.zeros(chunk_in.numel(), dtype=torch.bool)
                tally.astype_ok = _astype_check(chunk_in, res, s_nan, dst, tally.c)
            continue
        s_nan = tally.add_chunk(chunk_in, res, fmt, sfmt)
        if tally.astype_ok:
            tally.astype_ok = _astype_check(chunk_in, res, s_nan, dst, tally.c)
    return tally.report(src.row, dst, rtol)


# what cast_report counts, chunk by chunk (a CastReport's counts, under shorter names)
_COUNTS = (
    "numel",
    "exact",
    "inexact",
    "overflow_inf",
    "saturated",
    "nan_created",
    "flushed",
    "subnormal",
    "nan_changed",
    "zero_replaced",
    "sign_dropped",
    "ml_nan",
    "differs",
    "imag",
    "rel_n",
)


@dataclass
class _Tally:
    """What :func:`cast_report` has counted so far, chunk by chunk, and the report of it."""

    c: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_COUNTS, 0))
    hist: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ULP_BINS, 0))
    max_abs: float = 0.0
    max_rel: float = 0.0
    rel_sum: float = 0.0
    seen_finite: bool = False
    seen_rel: bool = False
    astype_ok: bool = True  # NumPy's astype could cast every chunk so far

    def add_quick(self, quick: _Quick, n: int) -> None:
        """A chunk :func:`_quick_chunk` counted: ``n`` finite values, rounded in range."""
        c = self.c
        c["exact"] += quick.exact
        c["inexact"] += n - quick.exact
        c["flushed"] += quick.flushed
        c["subnormal"] += quick.subnormal
        self.seen_finite = True
        self.max_abs = max(self.max_abs, quick.max_abs)
        if quick.nonzero:
            self.seen_rel = True
            self.max_rel = max(self.max_rel, quick.max_rel)
            self.rel_sum += quick.rel_sum
            c["rel_n"] += quick.nonzero
        self.hist["0"] += quick.exact  # at most half a ULP off: every inexact value there
        self.hist["<=0.5"] += n - quick.exact

    def add_chunk(
        self, chunk: torch.Tensor, res: torch.Tensor, fmt: Format, sfmt: Format | None
    ) -> torch.Tensor:
        """A chunk counted value by value (the general path); its source NaNs."""
        c = self.c
        s, r = _cast_parts(chunk, res)
        sv, rv = s.to(torch.float64), r.to(torch.float64)
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
        if sfmt is not None and bool(s_nan.any()):
            c["nan_changed"] += _nan_changes(s[s_nan], r[s_nan], r_nan[s_nan], sfmt, fmt)
        both = s_fin & r_fin
        if bool(both.any()):
            self._add_errors(sv, rv, both, fmt)
        return s_nan

    def _add_errors(
        self, sv: torch.Tensor, rv: torch.Tensor, both: torch.Tensor, fmt: Format
    ) -> None:
        """The errors of the values whose source and result are both finite."""
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
        u = err / _target_ulp(ref, fmt)
        for name, n in zip(ULP_BINS, _histogram(u), strict=True):
            self.hist[name] += n

    def report(self, src: DTypeRow, dst: DTypeRow, rtol: float | None) -> CastReport:
        """The :class:`CastReport` of every chunk counted, judged against ``rtol``."""
        c = self.c
        unsafe = ("overflow_inf", "saturated", "nan_created", "flushed", "nan_changed", "imag")
        safe = not any(c[k] for k in (*unsafe, "zero_replaced", "sign_dropped"))
        within = rtol is None or not self.seen_rel or self.max_rel <= rtol
        return CastReport(
            source_dtype=src.name,
            target_dtype=dst.name,
            kernel="torch",
            semantics=semantics(src, dst),
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
            ml_dtypes_nan=c["ml_nan"] if self.astype_ok else None,
            astype_differs=c["differs"] if self.astype_ok else None,
            imag_discarded=c["imag"],
            safe=safe,
            rtol=None if rtol is None else float(rtol),
            ok=safe and within,
        )


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
    if res.element_size() == 2:  # torch widens 16-bit values inside the subtraction
        err = torch.sub(res, s, out=scratch.get("err", f32, n))
    else:
        rv = to_float32(res, scratch, "r", finite=True)
        err = torch.sub(rv, s, out=rv if rv is not res else scratch.get("err", f32, n))
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
    s: torch.Tensor, r: torch.Tensor, r_nan: torch.Tensor, sf: Format, rf: Format
) -> int:
    """NaNs whose result is not a NaN of the same sign and the same (aligned) payload."""
    sb, rb = bits_of(s), bits_of(r)
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
