"""compare / stats / cast_report / describe for the rows issue 29 added.

torch has no kernels for the sub-byte integers (int1 ... uint4) and no dtype at all for
the ml_dtypes types it lacks (float8_e3m4, float8_e4m3, float8_e4m3b11fnuz,
float8_e5m3fnu, float6_e2m3fn, float6_e3m2fn, float4_e2m1fn, bcomplex32). The
diagnostics read them through ml_dtypes: values as ml_dtypes reads each byte, ULPs in
the type's own format, casts by ml_dtypes' ``astype`` (what ``to_numpy(x, dtype=...)``
runs for them). Every expectation here is computed independently from ml_dtypes: its
``astype`` to float64, its ``finfo``, and the bit patterns themselves.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

import tensorbridge as tb
from conftest import NUMPY_ONLY_ROWS, ROWS, make_patterns
from tensorbridge import diagnostics as dg
from tensorbridge.diagnostics import _values

SUBBYTE = [r for r in ROWS if not r.kernels]  # int1 ... uint4: in torch, no kernels
NEW = [*SUBBYTE, *NUMPY_ONLY_ROWS]
NEW_FLOATS = [r for r in NUMPY_ONLY_ROWS if r.category == "float"]  # one byte each
ONE_BYTE = [r for r in NEW if r.itemsize == 1]
EVERY_BYTE = np.arange(256, dtype=np.uint16).astype(np.uint8)


def ids(r: tb.DTypeRow) -> str:
    return r.name


def wide(a: np.ndarray) -> np.ndarray:
    """ml_dtypes' own float64 (complex128) values of ``a``."""
    exact = np.complex128 if tb.resolve_dtype(a.dtype).category == "complex" else np.float64
    with np.errstate(all="ignore"):  # NaN patterns: NumPy's cast warns, and keeps them
        return a.astype(exact)


def every(row: tb.DTypeRow) -> np.ndarray:
    """Every byte of a one-byte row; for bcomplex32 the conftest's patterns."""
    return EVERY_BYTE.view(row.numpy) if row.itemsize == 1 else make_patterns(row)


def finfo(row: tb.DTypeRow) -> Any:
    return ml_dtypes.finfo(row.numpy)  # type: ignore[no-untyped-call]


def clean_codes(row: tb.DTypeRow) -> np.ndarray:
    """The codes of a one-byte float row that use only its own bits (0 .. 2**width - 1)."""
    return np.arange(1 << int(finfo(row).bits), dtype=np.uint16).astype(np.uint8)


# --- the facts the arithmetic reads --------------------------------------------------------------

# (width in bits, exponent bias, has inf, has NaN, NaN bits ml_dtypes makes, signed, -0)
FACTS = {
    "float8_e3m4": (8, 3, True, True, 0x78, True, True),
    "float8_e4m3": (8, 7, True, True, 0x7C, True, True),
    "float8_e4m3b11fnuz": (8, 11, False, True, 0x80, True, False),
    "float8_e5m3fnu": (8, 15, False, True, 0xFF, False, False),
    "float6_e2m3fn": (6, 1, False, False, None, True, True),
    "float6_e3m2fn": (6, 3, False, False, None, True, True),
    "float4_e2m1fn": (4, 1, False, False, None, True, True),
}


@pytest.mark.parametrize("row", NEW_FLOATS, ids=ids)
def test_format_facts_follow_ml_dtypes(row: tb.DTypeRow) -> None:
    fmt = _values.format_of(row)
    fi = finfo(row)
    got = (fmt.width, fmt.bias, fmt.has_inf, fmt.has_nan, fmt.nan_bits, fmt.signed)
    assert (*got, fmt.signed_zero) == FACTS[row.name]
    assert (fmt.nmant, fmt.max, fmt.smallest_normal) == (fi.nmant, fi.max, fi.smallest_normal)
    assert fmt.subnormals and fmt.smallest_subnormal == float(fi.smallest_subnormal)
    values = wide(every(row))
    assert bool(np.isinf(values).any()) == fmt.has_inf
    assert bool(np.isnan(values).any()) == fmt.has_nan
    assert bool((values < 0).any()) == fmt.signed
    # 1.0 has the exponent field ``bias`` and no mantissa bits
    one = int(np.array([1.0]).astype(row.numpy).view(np.uint8)[0])
    assert one == fmt.bias << fmt.nmant


def test_bcomplex32_parts_are_bfloat16() -> None:
    if not hasattr(ml_dtypes, "bcomplex32"):
        pytest.skip(reason="this ml_dtypes has no bcomplex32 (0.7 has)")
    part = _values.component_row(tb.resolve_dtype("bcomplex32"))
    assert part is tb.resolve_dtype("bfloat16")


@pytest.mark.parametrize("row", NEW, ids=ids)
def test_the_wide_row_holds_every_value_exactly(row: tb.DTypeRow) -> None:
    w = _values.wide_row(row)
    assert w.kernels and w.in_torch
    values = every(row)
    with np.errstate(all="ignore"):
        widened = values.astype(w.numpy)
    assert np.array_equal(wide(widened), wide(values), equal_nan=True)
    assert np.array_equal(np.signbit(wide(widened).real), np.signbit(wide(values).real))


# --- compare ------------------------------------------------------------------------------------


@pytest.mark.parametrize("row", NEW, ids=ids)
def test_compare_every_pattern_with_itself(row: tb.DTypeRow) -> None:
    x = every(row)
    c = dg.compare(x, x.copy())
    assert c.ok and c.max_ulp == 0 and c.mismatches == c.nan_mismatches == 0
    assert c.bitwise_equal is True and c.worst_index is None
    floats = row.category in ("float", "complex")
    assert c.compared_in == (_values.component_row(row).name if floats else "integers (exact)")
    assert c.nan_payload_changes == 0
    if row.in_torch:  # the tensor torch holds (no kernels: a view of the same bytes)
        t = torch.from_numpy(x.view(np.uint8).copy()).view(row.torch)
        assert dg.compare(t, x).bitwise_equal is True and dg.compare(x, t).max_ulp == 0


@pytest.mark.parametrize("row", NEW_FLOATS, ids=ids)
@pytest.mark.parametrize("k", [1, 3])
def test_compare_a_k_code_neighbour_is_k_ulps(row: tb.DTypeRow, k: int) -> None:
    fmt = _values.format_of(row)
    codes = clean_codes(row).astype(np.int64)
    mag = codes & ((1 << (fmt.width - 1)) - 1) if fmt.signed else codes
    keep = mag + k < 1 << (fmt.width - fmt.signed)  # k codes further from zero, same sign
    codes = codes[keep]
    a, b = codes.astype(np.uint8).view(row.numpy), (codes + k).astype(np.uint8).view(row.numpy)
    finite = np.isfinite(wide(a)) & np.isfinite(wide(b))
    a, b = a[finite], b[finite]
    assert a.size > 8

    c = dg.compare(a, b)

    assert c.max_ulp == k and c.nan_mismatches == c.inf_mismatches == 0
    for x, y in zip(a, b, strict=True):  # each pair alone, not only the largest
        assert dg.compare(x[None], y[None]).max_ulp == k


@pytest.mark.parametrize("row", NEW_FLOATS, ids=ids)
def test_compare_across_zero_counts_both_sides(row: tb.DTypeRow) -> None:
    fmt = _values.format_of(row)
    sub = np.array([1], np.uint8).view(row.numpy)  # the smallest subnormal
    zero = np.array([0], np.uint8).view(row.numpy)
    assert dg.compare(zero, sub).max_ulp == 1
    if fmt.signed:
        neg = np.array([1 | 1 << (fmt.width - 1)], np.uint8).view(row.numpy)
        assert wide(neg)[0] == -fmt.smallest_subnormal
        assert dg.compare(neg, sub).max_ulp == 2  # -0 and +0 are one point
        if fmt.signed_zero:
            minus_zero = np.array([1 << (fmt.width - 1)], np.uint8).view(row.numpy)
            c = dg.compare(zero, minus_zero)
            assert c.max_ulp == 0 and c.ok and c.bitwise_equal is False


@pytest.mark.parametrize("row", [r for r in NEW_FLOATS if r.name.startswith(("float6", "float4"))])
def test_compare_reads_the_high_bits_of_a_sub_byte_float_as_ml_dtypes_does(
    row: tb.DTypeRow,
) -> None:
    # ml_dtypes reads any bit above the sign as the sign: 0x41 as float6_e2m3fn is -0.125
    width = _values.format_of(row).width
    low, high = np.array([1], np.uint8), np.array([1 | 1 << (width + 1)], np.uint8)
    assert wide(high.view(row.numpy))[0] == -wide(low.view(row.numpy))[0]
    c = dg.compare(low.view(row.numpy), high.view(row.numpy))
    assert c.max_ulp == 2 and c.max_abs_err == 2 * wide(low.view(row.numpy))[0]


def test_compare_nan_as_each_type_defines_it() -> None:
    e4m3 = tb.resolve_dtype("float8_e4m3").numpy
    nans = np.array([0x7C, 0x7F, 0xFC], np.uint8).view(e4m3)  # three NaNs (IEEE-like)
    c = dg.compare(nans, np.array([0x7D, 0x7F, 0xFC], np.uint8).view(e4m3))
    assert c.ok and c.nan_mismatches == 0 and c.nan_payload_changes == 1
    c = dg.compare(nans, np.array([0x7C, 0x38, 0xFC], np.uint8).view(e4m3))  # NaN vs 1.0
    assert not c.ok and c.nan_mismatches == 1

    b11 = tb.resolve_dtype("float8_e4m3b11fnuz").numpy
    nan, one = np.array([0x80], np.uint8).view(b11), np.array([0x58], np.uint8).view(b11)
    assert math.isnan(wide(nan)[0]) and wide(one)[0] == 1.0
    assert dg.compare(nan, nan.copy()).ok and dg.compare(nan, one).nan_mismatches == 1

    if hasattr(ml_dtypes, "float8_e5m3fnu"):  # ml_dtypes 0.7
        fnu = tb.resolve_dtype("float8_e5m3fnu").numpy
        top = np.array([0xFE, 0xFF], np.uint8).view(fnu)  # the largest value, NaN
        assert dg.compare(top, top.copy()).ok
        assert dg.compare(top[:1], top[1:]).nan_mismatches == 1

    for name in ("float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn"):  # no NaN at all
        x = EVERY_BYTE.view(tb.resolve_dtype(name).numpy)
        assert dg.stats(x).nan_count == 0 and dg.compare(x, x.copy()).nan_mismatches == 0


@pytest.mark.parametrize("name", ["float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn", "float8_e4m3"])
def test_compare_float32_against_its_ml_dtypes_copy(name: str) -> None:
    row = tb.resolve_dtype(name)
    fmt = _values.format_of(row)
    rng = np.random.default_rng(29)
    x = np.clip(rng.standard_normal(4096) * fmt.max / 4, -fmt.max, fmt.max).astype(np.float32)
    copy = x.astype(row.numpy)

    c = dg.compare(x, copy)

    assert c.compared_in == name and c.dtype_mismatch and c.bitwise_equal is False
    assert c.max_ulp == 0  # in range, x rounds to its copy: ULPs in the copy's own format
    err = np.abs(wide(copy) - x.astype(np.float64))
    assert c.max_abs_err == pytest.approx(float(err.max()), rel=1e-6)
    assert c.mismatches == int(np.count_nonzero(err > fmt.smallest_subnormal + fmt.eps * abs(x)))

    # beyond the range the line goes on with the top spacing: max + 3 spacings is 3 ULPs
    beyond = np.array([fmt.max + 3 * fmt.top_ulp], np.float32)
    assert dg.compare(beyond, beyond.astype(row.numpy)).max_ulp == (0 if fmt.has_inf else 3)
    special = np.array([np.nan, np.inf], np.float32)
    got = dg.compare(special, special.astype(row.numpy))
    assert got.nan_mismatches == int(not fmt.has_nan)  # a NaN became -0 in float6 / float4
    assert got.inf_mismatches == int(not fmt.has_inf)  # inf saturated: a finite value


@pytest.mark.parametrize("row", SUBBYTE, ids=ids)
def test_compare_sub_byte_integers_as_ml_dtypes_reads_them(row: tb.DTypeRow) -> None:
    bits = int(ml_dtypes.iinfo(row.numpy).bits)  # type: ignore[no-untyped-call]
    a = EVERY_BYTE.view(row.numpy)
    low = (EVERY_BYTE & ((1 << bits) - 1)).view(row.numpy)  # the same values, high bits clear

    c = dg.compare(a, low)

    assert c.ok and c.max_ulp == 0 and c.bitwise_equal is False  # equal values, other bytes
    info = ml_dtypes.iinfo(row.numpy)  # type: ignore[no-untyped-call]
    lo, hi = np.array([info.min], row.numpy), np.array([info.max], row.numpy)
    far = dg.compare(lo, hi)
    assert far.max_ulp == int(info.max) - int(info.min) and far.compared_in == "integers (exact)"
    t = torch.from_numpy(EVERY_BYTE.copy()).view(row.torch)[::3]  # a strided torch tensor
    assert dg.compare(t, a[::3]).bitwise_equal is True
    assert dg.compare(t, np.asarray(wide(a[::3]), np.float32)).max_ulp == 0  # int vs float32


@pytest.mark.parametrize("row", NEW, ids=ids)
def test_compare_in_chunks_matches_whole(row: tb.DTypeRow, monkeypatch: pytest.MonkeyPatch) -> None:
    x = every(row)
    rng = np.random.default_rng(7)
    y = x.view(np.uint8).copy()
    flip = rng.integers(0, y.size, y.size // 8)
    y[flip] ^= 1  # some values one code apart (a payload or a sign for a few)
    y = y.view(row.numpy)
    whole = dg.compare(x, y)
    monkeypatch.setattr(_values, "_CHUNK", max(7, x.size // 40 + 1))  # uneven chunks
    assert dg.compare(x, y) == whole


# --- stats -------------------------------------------------------------------------------------


@pytest.mark.parametrize("row", NEW, ids=ids)
def test_stats_every_pattern(row: tb.DTypeRow, monkeypatch: pytest.MonkeyPatch) -> None:
    x = every(row)
    v = wide(x)
    parts = np.stack([v.real, v.imag], -1).reshape(-1) if np.iscomplexobj(v) else v
    fin = parts[np.isfinite(parts)]

    s = dg.stats(x)

    assert (s.dtype, s.numel, s.finite) == (row.name, x.size, fin.size)
    assert s.nan_count == int(np.isnan(parts).sum())
    assert (s.posinf_count, s.neginf_count) == (
        int((parts == np.inf).sum()),
        int((parts == -np.inf).sum()),
    )
    assert s.zeros == int((fin == 0).sum())
    assert (s.min, s.max) == (float(fin.min()), float(fin.max()))
    assert s.mean == pytest.approx(float(fin.mean()), rel=1e-12, abs=1e-300)
    assert s.std == pytest.approx(float(fin.std()), rel=1e-9)
    if row.category in ("int", "uint"):
        assert s.subnormals is None
    else:
        tiny = float(finfo(_values.component_row(row)).smallest_normal)
        assert s.subnormals == int(((fin != 0) & (np.abs(fin) < tiny)).sum()) > 0
    monkeypatch.setattr(_values, "_CHUNK", 5)
    chunked = dg.stats(x)
    assert chunked.subnormals == s.subnormals and chunked.sum == pytest.approx(s.sum)
    if row.in_torch:
        t = torch.from_numpy(x.view(np.uint8).copy()).view(row.torch)
        assert dg.stats(t).sum == s.sum and dg.stats(t.reshape(16, 16).T).sum == s.sum


def test_stats_of_torch_rows_leave_subnormals_uncounted() -> None:
    # torch's own rows are reduced without the pass (no new work on their chunks)
    assert dg.stats(torch.tensor([1e-40, 1.0])).subnormals is None
    assert dg.stats(np.array([1e-40, 1.0], np.float32)).subnormals is None


# --- cast_report -------------------------------------------------------------------------------

F32_CLASSES = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e30, 1e-30, -1e-30, 1.0, -1.0, 0.3, 3.5],
    np.float32,
)


def probes(row: tb.DTypeRow) -> np.ndarray:
    """float32 values around every value of ``row``: the values, the ties, just off them,
    beyond the range, and the float32 classes (±0, ±inf, NaN, tiny, huge)."""
    codes = wide(clean_codes(row).view(row.numpy))
    values = np.unique(codes[np.isfinite(codes)])
    ties = (values[:-1] + values[1:]) / 2
    top = values[-1] + (values[-1] - values[-2]) / 2
    base = np.concatenate([values, ties, [top, 2 * values[-1]]]).astype(np.float32)
    near = [np.nextafter(base, np.float32(np.inf)), np.nextafter(base, np.float32(-np.inf))]
    return np.concatenate([base, *near, -base, F32_CLASSES])


def expected(x: np.ndarray, got: np.ndarray, row: tb.DTypeRow) -> dict[str, int]:
    """The counts, worked out from float32 values and the cast's results alone."""
    fmt = _values.format_of(row)
    s, r = x.astype(np.float64), wide(got)
    fin = np.isfinite(s)
    half = fmt.max + fmt.top_ulp / 2
    beyond = np.isinf(s) | (
        fin & ((np.abs(s) > half) | ((np.abs(s) == half) & (fmt.max_ord % 2 == 1)))
    )
    return {
        "exact": int((fin & (r == s)).sum()),
        "inexact": int((fin & (r != s)).sum()),
        "overflow_inf": int((fin & np.isinf(r)).sum()),
        "saturated": int((beyond & np.isfinite(r) & (np.abs(r) == fmt.max)).sum()),
        "nan_created": int((~np.isnan(s) & np.isnan(r)).sum()),
        "flushed_to_zero": int((fin & (s != 0) & (r == 0)).sum()),
        "sign_dropped": int(((s < 0) & (r > 0)).sum()),
        "subnormal": int((np.isfinite(r) & (r != 0) & (np.abs(r) < fmt.smallest_normal)).sum()),
    }


@pytest.mark.parametrize("row", NEW_FLOATS, ids=ids)
def test_cast_report_into_each_new_float_counts_ml_dtypes_astype(row: tb.DTypeRow) -> None:
    x = probes(row)
    t = torch.from_numpy(x)
    got = tb.to_numpy(t, dtype=row)  # the cast the report must be about
    with np.errstate(all="ignore"):
        assert got.view(np.uint8).tobytes() == x.astype(row.numpy).view(np.uint8).tobytes()

    r = dg.cast_report(t, row)

    assert (r.kernel, r.source_dtype, r.target_dtype, r.numel) == (
        "ml_dtypes",
        "float32",
        row.name,
        x.size,
    )
    assert r.astype_differs == 0 and r.ml_dtypes_nan == r.nan_created
    for name, n in expected(x, got, row).items():
        assert getattr(r, name) == n, name
    # the one NaN keeps its sign and top payload bit only where the type has such a NaN
    assert r.nan_changed == int(row.name not in ("float8_e3m4", "float8_e4m3"))
    assert not r.safe and r.ulp_histogram["<=0.5"] > 0
    assert (r.ulp_histogram[">2"] > 0) == (r.saturated > 0)  # saturated: far from the value
    assert r.semantics.startswith(
        f"ml_dtypes' astype float32 -> {row.name} (torch has no {row.name})"
    )
    assert "rounds to nearest, ties to even" in r.semantics
    assert dg.cast_report(x, row) == r  # an array: the same cast


SEMANTICS = {
    "float8_e3m4": ["overflow -> ±inf", "±inf -> ±inf", "NaN -> 0x78"],
    "float8_e4m3": ["overflow -> ±inf", "±inf -> ±inf", "NaN -> 0x7c"],
    "float8_e4m3b11fnuz": ["overflow -> NaN", "±inf -> NaN", "-0 -> +0", "NaN -> 0x80"],
    "float8_e5m3fnu": ["overflow -> NaN", "±inf -> NaN", "-1 -> NaN", "-0 -> +0", "NaN -> 0xff"],
    "float6_e2m3fn": [
        "overflow -> ±7.5 (saturates)", "±inf -> ±7.5 (saturates)",
        "NaN -> 0x20 (-0: float6_e2m3fn has no NaN)",
    ],
    "float6_e3m2fn": [
        "overflow -> ±28 (saturates)", "±inf -> ±28 (saturates)",
        "NaN -> 0x20 (-0: float6_e3m2fn has no NaN)",
    ],
    "float4_e2m1fn": [
        "overflow -> ±6 (saturates)", "±inf -> ±6 (saturates)",
        "NaN -> 0x8 (-0: float4_e2m1fn has no NaN)",
    ],
}  # fmt: skip


@pytest.mark.parametrize("row", NEW_FLOATS, ids=ids)
def test_cast_report_semantics_are_probed_per_type(row: tb.DTypeRow) -> None:
    parts = dg.cast_report(np.float32(1.0), row).semantics.split("; ")
    assert parts[2:] == SEMANTICS[row.name]
    # and they are what ml_dtypes does
    with np.errstate(all="ignore"):
        probe = np.array([1e9, np.inf, np.nan, -0.0, -1.0], np.float32).astype(row.numpy)
    v = wide(probe)
    fmt = _values.format_of(row)
    assert ("NaN" in SEMANTICS[row.name][0]) == bool(np.isnan(v[0]))
    assert ("saturates" in SEMANTICS[row.name][0]) == (v[0] == fmt.max)
    assert f"NaN -> {int(probe.view(np.uint8)[2]):#0{fmt.width // 4 + 2}x}" in parts[-1]
    assert np.signbit(v[3]) == fmt.signed_zero
    assert np.isnan(v[4]) == (not fmt.signed)


@pytest.mark.parametrize("row", SUBBYTE, ids=ids)
@pytest.mark.parametrize("dst", ["float32", "bfloat16", "float6_e2m3fn", "float4_e2m1fn"])
def test_cast_report_from_sub_byte_integers(row: tb.DTypeRow, dst: str) -> None:
    a = EVERY_BYTE.view(row.numpy)
    target = tb.resolve_dtype(dst)
    got = tb.to_numpy(a, dtype=target)
    want = expected(np.asarray(wide(a), np.float32), got, target)

    r = dg.cast_report(a, dst)

    assert r.kernel == "ml_dtypes" and r.source_dtype == row.name and r.numel == 256
    assert f"torch has no kernels for {row.name}" in r.semantics
    for name, n in want.items():
        assert getattr(r, name) == n, name
    assert r.safe == (want["saturated"] == 0)  # integers: only saturation loses anything
    t = torch.from_numpy(EVERY_BYTE.copy()).view(row.torch)
    assert dg.cast_report(t, dst) == r


def test_cast_report_int4_minus_eight_saturates_in_float6() -> None:
    r = dg.cast_report(np.arange(-8, 8, dtype=np.int8).astype(ml_dtypes.int4), "float6_e2m3fn")
    assert (r.saturated, r.exact, r.max_abs_err) == (1, 15, 0.5)  # -8 -> -7.5
    assert "overflow -> ±7.5 (saturates)" in r.semantics


def test_cast_report_bcomplex32_both_ways() -> None:
    if not hasattr(ml_dtypes, "bcomplex32"):
        pytest.skip(reason="this ml_dtypes has no bcomplex32 (0.7 has)")
    x = np.array([1 + 2j, 0j, 3.0001 - 1j, complex(np.nan, 0)], np.complex64)
    x.real[1] = np.finfo(np.float32).max  # beyond bfloat16's largest: inf
    r = dg.cast_report(torch.from_numpy(x), "bcomplex32")
    assert r.kernel == "ml_dtypes" and r.numel == 4
    assert (r.overflow_inf, r.nan_changed) == (1, 0)  # bfloat16 parts keep inf and NaN
    assert r.exact == 5 and r.inexact == 2  # 1, 2, 0, -1, 0 exact; 3.0001 rounded, max to inf
    back = dg.cast_report(x.astype(ml_dtypes.bcomplex32), "float32")
    assert back.imag_discarded == 2 and "the imaginary part is dropped" in back.semantics
    assert "widening: every value is kept exactly" in back.semantics


@pytest.mark.parametrize("row", NEW_FLOATS, ids=ids)
def test_cast_report_chunked_matches_whole(
    row: tb.DTypeRow, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = probes(row)
    whole = dg.cast_report(x, row)
    monkeypatch.setattr(_values, "_CHUNK", 5)
    chunked = dg.cast_report(x, row)
    assert chunked.mean_rel_err == pytest.approx(whole.mean_rel_err, rel=1e-12)
    assert replace(chunked, mean_rel_err=None) == replace(whole, mean_rel_err=None)


# --- describe ----------------------------------------------------------------------------------


@pytest.mark.parametrize("row", NUMPY_ONLY_ROWS, ids=ids)
def test_describe_a_numpy_only_array_shows_its_widening(row: tb.DTypeRow) -> None:
    a = every(row)[:16]
    d = dg.describe(a)
    assert d.torch_dtype is None and d.to_torch.verdict == "error"
    assert d.widening is not None and d.widening.verdict == "copy"
    first = tb.dtypes.exact_widenings(row)[0]
    assert f"a cast to {first.name} makes new values" in d.widening.reason
    t = tb.to_torch(a, dtype=first.torch)  # what the plan says: a copy, every value kept
    back = tb.to_numpy(t)
    assert t.dtype is first.torch and not np.shares_memory(back, a)
    assert np.array_equal(wide(back), wide(a), equal_nan=True)


@pytest.mark.parametrize("row", SUBBYTE, ids=ids)
def test_describe_a_sub_byte_tensor_says_how_it_is_copied(row: tb.DTypeRow) -> None:
    t = torch.zeros(4, dtype=torch.uint8).view(row.torch)
    bits = int(ml_dtypes.iinfo(row.numpy).bits)  # type: ignore[no-untyped-call]
    for d in (dg.describe(t), dg.describe(tb.to_numpy(t))):
        assert d.to_numpy.verdict == "share" and d.widening is None
        note = next(n for n in d.notes if n.startswith(f"torch has no kernels for {row.name}"))
        assert f"low {bits} bit" in note and "as uint8" in note
