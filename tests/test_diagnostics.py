"""describe / compare / cast_report / stats, checked against values computed by hand.

The hand computations are in the comments next to each expectation. ULP distances
are counted on the coarser dtype's ordered integer line, so a perturbation of k
bit patterns (within one sign) must come back as exactly k.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

import tensorbridge as tb
from tensorbridge import diagnostics as dg
from tensorbridge._versions import torch_e4m3fn_saturates
from tensorbridge.diagnostics import _values

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
NAN = math.nan
INF = math.inf


def all_patterns_u(itemsize: int) -> np.ndarray:
    """Every bit pattern of an 8- or 16-bit type, as unsigned integers."""
    return np.arange(1 << (8 * itemsize), dtype=np.uint32).astype(f"u{itemsize}")


def from_bits(bits: list[int], dtype: torch.dtype) -> torch.Tensor:
    """A 1-D tensor of ``dtype`` holding exactly these bit patterns."""
    size = torch.empty(0, dtype=dtype).element_size()
    wide = np.array(bits, dtype=np.uint64).astype(f"u{size}")
    return torch.from_numpy(wide.view(f"i{size}") if size > 1 else wide).view(dtype)


def bits_of(t: torch.Tensor) -> list[int]:
    size = t.element_size()
    raw = t.contiguous().view(torch.uint8).numpy().view(f"u{size}")
    return [int(v) for v in raw]


def json_ok(record: Any) -> None:
    json.dumps(record.to_dict(), allow_nan=False)


# --- describe ---------------------------------------------------------------------------------


def storage_range(t: torch.Tensor) -> tuple[int, int]:
    start = t.untyped_storage().data_ptr()
    return start, start + t.untyped_storage().nbytes()


def address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def test_describe_transposed_tensor_shares_with_its_strides() -> None:
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).T
    d = dg.describe(t)
    assert (d.shape, d.strides, d.strides_bytes) == ((4, 3), (1, 4), (4, 16))
    assert (d.c_contiguous, d.f_contiguous) == (False, True)
    assert (d.storage_offset, d.storage_nbytes, d.nbytes) == (0, 48, 48)
    assert d.to_numpy.verdict == "share" and d.to_numpy.shares
    assert d.to_torch.verdict == "share"
    assert (d.torch_dtype, d.numpy_dtype, d.category) == ("torch.float32", "float32", "float")
    a = tb.to_numpy(t)
    a[0, 1] = -1.0  # the mutation shows through: it really is shared
    assert t[0, 1].item() == -1.0
    json_ok(d)


def test_describe_expanded_tensor_notes_the_aliasing() -> None:
    t = torch.zeros(3, 1).expand(3, 4)
    d = dg.describe(t)
    assert d.strides == (1, 0)
    assert d.storage_nbytes == 12 and d.nbytes == 48
    assert d.to_numpy.verdict == "share"
    assert any("stride 0" in n and "(1,)" in n for n in d.notes)
    assert tb.to_numpy(t).strides == (4, 0)


def test_describe_conj_and_neg_bits_need_a_copy() -> None:
    z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
    d = dg.describe(z.conj())
    assert d.is_conj and not d.is_neg
    assert d.to_numpy.verdict == "copy"
    assert d.to_numpy.reason == (
        "the input has its conjugate or negative bit set (resolving it writes new values)"
    )
    with pytest.raises(tb.CopyRequiredError):
        tb.to_numpy(z.conj(), copy=False)
    n = dg.describe(z.conj().imag)  # the imaginary part of a conjugate view has the neg bit
    assert n.is_neg and n.to_numpy.verdict == "copy"


def test_describe_requires_grad_shares_through_detach() -> None:
    leaf = torch.ones(2, requires_grad=True)
    d = dg.describe(leaf)
    assert (d.requires_grad, d.is_leaf, d.grad_fn) == (True, True, None)
    assert d.to_numpy.verdict == "share" and "detach" in d.to_numpy.reason
    assert any("autograd" in n for n in d.notes)
    lo, hi = storage_range(leaf)
    assert lo <= address(tb.to_numpy(leaf)) < hi
    nonleaf = dg.describe(leaf * 2)
    assert (nonleaf.is_leaf, nonleaf.grad_fn) == (False, "MulBackward0")


def test_describe_read_only_array_is_copied_by_to_torch() -> None:
    a = np.arange(4.0)
    a.flags.writeable = False
    d = dg.describe(a)
    assert d.readonly and d.kind == "numpy.ndarray"
    assert d.to_numpy.verdict == "share"
    assert d.to_torch.verdict == "copy"
    assert d.to_torch.reason.startswith("the input is read-only, and a writable tensor")
    assert d.requires_grad is None and d.device == "cpu"


def test_describe_big_endian_array() -> None:
    a = np.arange(3, dtype=">f4")
    d = dg.describe(a)
    assert d.byteswapped and d.numpy_dtype == ">f4" and d.torch_dtype == "torch.float32"
    assert d.dtype_note is not None and "byte-swapped" in d.dtype_note
    assert d.to_torch.verdict == "copy" and d.to_torch.reason == "the input is byte-swapped (>f4)"


def test_describe_reversed_view_reports_its_offset() -> None:
    a = np.arange(10.0)[::-2]  # starts at element 9 of its base, walks back 2 at a time
    d = dg.describe(a)
    assert (d.strides, d.strides_bytes) == ((-2,), (-16,))
    assert (d.storage_offset, d.storage_offset_bytes, d.storage_nbytes) == (9, 72, 80)
    assert d.to_torch.reason == "the input has negative strides (torch has none)"


def test_describe_bfloat16_and_meta_without_cuda() -> None:
    d = dg.describe(torch.ones(2, dtype=torch.bfloat16))
    assert (d.numpy_dtype, d.itemsize, d.to_numpy.verdict) == ("bfloat16", 2, "share")
    m = dg.describe(torch.empty(2, 3, device="meta"))
    assert m.device == "meta" and m.shape == (2, 3)
    assert m.to_numpy.verdict == "error" and "meta tensor" in m.to_numpy.reason


def test_describe_cuda_tensor_needs_a_copy() -> None:
    if not torch.cuda.is_available():
        pytest.skip(reason="no CUDA device on this machine")
    d = dg.describe(torch.ones(2, device="cuda"))
    assert d.to_numpy.verdict == "copy" and d.to_numpy.reason == "the input is on cuda:0"


def test_describe_dtypes_without_a_counterpart() -> None:
    obj = dg.describe(np.array([object()]))
    assert obj.torch_dtype is None and obj.dtype_note is not None
    assert obj.to_torch.verdict == "error"
    fp4 = getattr(torch, "float4_e2m1fn_x2", None)
    if fp4 is not None:
        d = dg.describe(torch.zeros(2, dtype=torch.uint8).view(fp4))
        assert d.numpy_dtype is None and d.dtype_note and "two values a byte" in d.dtype_note
    with pytest.raises(tb.UnsupportedTensorError):
        dg.describe([1.0, 2.0])


def test_describe_every_row_shares(row: tb.DTypeRow) -> None:
    t = torch.from_numpy(np.zeros(2 * row.itemsize, np.uint8)).view(row.torch)
    d = dg.describe(t)
    assert (d.torch_dtype, d.numpy_dtype) == (str(row.torch), str(row.numpy))
    assert d.to_numpy.verdict == "share"
    a = dg.describe(tb.to_numpy(t))
    assert a.torch_dtype == str(row.torch) and a.to_torch.verdict == "share"


CASES = {
    "contiguous": lambda: torch.arange(6.0),
    "transposed": lambda: torch.arange(6.0).reshape(2, 3).T,
    "expanded": lambda: torch.arange(3.0).reshape(3, 1).expand(3, 2),
    "sliced": lambda: torch.arange(10.0)[2:8:3],
    "conj": lambda: torch.ones(2, dtype=torch.complex64).conj(),
    "grad": lambda: torch.ones(2, requires_grad=True),
    "param": lambda: torch.nn.Parameter(torch.ones(2)),
    "array": lambda: np.arange(6.0).reshape(2, 3)[:, ::2],
    "reversed": lambda: np.arange(6.0)[::-1],
    "readonly": lambda: np.frombuffer(b"\0" * 16, np.float32),
    "bigendian": lambda: np.arange(3, dtype=">i4"),
    "bf16-array": lambda: np.ones(3, ml_dtypes.bfloat16),
}


@pytest.mark.parametrize("make", CASES.values(), ids=CASES.keys())
def test_describe_verdict_matches_what_the_converters_do(make: Any) -> None:
    x = make()
    d = dg.describe(x)
    if isinstance(x, torch.Tensor):
        lo, hi = storage_range(x)
        shared = lo <= address(tb.to_numpy(x)) < hi
        assert shared == (d.to_numpy.verdict == "share")
    else:
        t = tb.to_torch(x)
        shared = bool(np.shares_memory(x, tb.to_numpy(t)))
        assert shared == (d.to_torch.verdict == "share")


# --- compare ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, E4M3, E5M2], ids=str)
def test_compare_identical_every_pattern(dtype: torch.dtype) -> None:
    size = torch.empty(0, dtype=dtype).element_size()
    x = torch.from_numpy(all_patterns_u(size).view(f"i{size}") if size > 1 else all_patterns_u(1))
    x = x.view(dtype)
    c = dg.compare(x, x.clone())
    assert c.ok and c.max_ulp == 0 and c.mismatches == 0
    assert c.bitwise_equal is True and c.nan_payload_changes == 0
    assert c.worst_index is None and c.compared_in == str(dtype).removeprefix("torch.")
    json_ok(c)


# (dtype, bits of 1.0): 1 ULP and 3 ULP above are the next bit patterns
ONES = [(torch.bfloat16, 0x3F80), (E4M3, 0x38), (E5M2, 0x3C)]


@pytest.mark.parametrize(("dtype", "one"), ONES, ids=lambda v: str(v))
@pytest.mark.parametrize("k", [1, 3])
def test_compare_k_ulp_perturbations(dtype: torch.dtype, one: int, k: int) -> None:
    a = from_bits([one, one + 8, one - 2], dtype)
    b = from_bits([one, one + 8 + k, one - 2 - k], dtype)  # also k below, and a smaller value
    c = dg.compare(a, b)
    assert c.max_ulp == k
    assert c.worst_index == (1,)
    assert c.nan_mismatches == c.inf_mismatches == 0


def test_compare_exact_ulp_tolerance_verdicts() -> None:
    bf = torch.bfloat16
    # 1.0 vs 1.0078125: rel 0.0078 <= 1.6e-2 -> ok; 1.0 vs 1.0234375 (3 ULP): rel 0.023 -> fails
    assert dg.compare(from_bits([0x3F80], bf), from_bits([0x3F81], bf)).ok
    three = dg.compare(from_bits([0x3F80], bf), from_bits([0x3F83], bf))
    assert not three.ok and three.mismatches == 1 and three.max_ulp == 3
    # e4m3fn 1.0 vs 1.125: rel 0.125 <= 0.125 + 2**-9 -> ok; 1.0 vs 1.375 -> fails
    assert dg.compare(from_bits([0x38], E4M3), from_bits([0x39], E4M3)).ok
    assert not dg.compare(from_bits([0x38], E4M3), from_bits([0x3B], E4M3)).ok
    # e5m2 1.0 vs 1.25 (1 ULP): rel 0.25 <= 0.25 + 2**-16 -> ok
    assert dg.compare(from_bits([0x3C], E5M2), from_bits([0x3D], E5M2)).ok
    strict = dg.compare(from_bits([0x3F80], bf), from_bits([0x3F81], bf), rtol=0, atol=0)
    assert not strict.ok and (strict.rtol, strict.atol) == (0.0, 0.0)


def test_compare_ulps_across_binades_zero_and_sign() -> None:
    bf = torch.bfloat16
    assert dg.compare(from_bits([0x3F7F], bf), from_bits([0x3F80], bf)).max_ulp == 1
    # +smallest subnormal vs -smallest subnormal: two steps through zero
    assert dg.compare(from_bits([0x0001], bf), from_bits([0x8001], bf)).max_ulp == 2
    assert dg.compare(from_bits([0x01], E4M3), from_bits([0x81], E4M3)).max_ulp == 2
    # -0.0 vs +0.0: 0 ULP and within tolerance, but not the same bits
    z = dg.compare(torch.tensor([-0.0]), torch.tensor([0.0]))
    assert z.ok and z.max_ulp == 0 and z.bitwise_equal is False
    assert dg.compare(torch.zeros(2), torch.zeros(3)).bitwise_equal is False
    # largest finite negative vs positive e4m3fn: 0x7E on each side of zero
    assert dg.compare(from_bits([0xFE], E4M3), from_bits([0x7E], E4M3)).max_ulp == 2 * 0x7E


def test_compare_mixed_dtypes_measures_in_the_coarser() -> None:
    # 1 + 2**-8 is the bfloat16 tie between 1.0 and 1.0078125: RNE -> 1.0 (0 ULP);
    # 1 + 1.5 * 2**-8 rounds up to 1.0078125 (1 ULP from 1.0)
    a = torch.tensor([1.0, 1 + 2**-8, 1 + 1.5 * 2**-8], dtype=torch.float32)
    b = torch.ones(3, dtype=torch.bfloat16)
    c = dg.compare(a, b)
    assert c.compared_in == "bfloat16" and c.dtype_mismatch
    assert c.max_ulp == 1 and c.worst_index == (2,)
    assert c.bitwise_equal is False and c.nan_payload_changes is None
    assert c.max_abs_err == 1.5 * 2**-8
    assert c.ok  # rel 0.0058 is within bfloat16's 1.6e-2
    assert dg.compare(b, a).compared_in == "bfloat16"
    # e4m3fn is coarser than e5m2? no: e5m2 has 2 mantissa bits to e4m3fn's 3
    assert dg.compare(from_bits([0x38], E4M3), from_bits([0x3C], E5M2)).compared_in == (
        "float8_e5m2"
    )


def test_compare_beyond_the_coarser_range_keeps_counting() -> None:
    # e4m3fn's top spacing is 32 (416 -> 448); past 448 the line goes on in steps of 32:
    # 464 is the tie (even 448 kept), 470 -> 1 step, 544 -> 3 steps
    a = torch.tensor([464.0, 470.0, 544.0], dtype=torch.bfloat16)
    b = torch.full((3,), 448.0).to(E4M3)
    c = dg.compare(a, b)
    assert c.compared_in == "float8_e4m3fn"
    assert c.max_ulp == 3 and c.worst_index == (2,)
    assert dg.compare(a[:2], b[:2]).max_ulp == 1
    assert dg.compare(a[:1], b[:1]).max_ulp == 0


def test_compare_nan_and_inf_mismatches() -> None:
    c = dg.compare(torch.tensor([1.0, NAN, 2.0]), torch.tensor([1.0, 1.0, NAN]))
    assert not c.ok and c.nan_mismatches == 2 and c.mismatches == 2 and c.max_ulp == 0
    bf_max = torch.finfo(torch.bfloat16).max
    i = dg.compare(
        torch.tensor([INF, -INF, INF], dtype=torch.bfloat16),
        torch.tensor([INF, -INF, bf_max], dtype=torch.bfloat16),
    )
    assert not i.ok and i.inf_mismatches == 1 and i.nan_mismatches == 0 and i.max_ulp == 0
    same = dg.compare(torch.tensor([NAN, INF]), torch.tensor([NAN, INF]))
    assert same.ok and same.mismatches == 0


def test_compare_nan_payload_changes_are_counted_not_failed() -> None:
    a = from_bits([0x7FC00000, 0x7FC00000, 0x3F800000], torch.float32)
    b = from_bits([0x7FC00000, 0x7FC00001, 0x3F800000], torch.float32)
    c = dg.compare(a, b)
    assert c.ok and c.nan_payload_changes == 1 and c.bitwise_equal is False
    # torch's f32 -> bf16 makes every NaN 0xFFFF: compared bf16 to bf16, that is a payload change
    bf = dg.compare(
        from_bits([0x7FC0, 0xFFFF], torch.bfloat16), from_bits([0xFFFF] * 2, torch.bfloat16)
    )
    assert bf.nan_payload_changes == 1


def test_compare_shape_mismatch_is_reported() -> None:
    c = dg.compare(torch.zeros(2, 3), torch.zeros(3, 2))
    assert not c.ok and c.shape_mismatch and c.max_ulp is None
    assert (c.shape_a, c.shape_b) == ((2, 3), (3, 2))
    assert c.problem == "shapes differ: (2, 3) vs (3, 2)"
    json_ok(c)


def test_compare_integers_exactly() -> None:
    c = dg.compare(np.array([-(2**63), 5]), np.array([2**63 - 1, 5]))
    assert c.max_ulp == 2**64 - 1 and c.mismatches == 1 and c.compared_in == "integers (exact)"
    mixed = dg.compare(np.array([2**64 - 1], np.uint64), np.array([-1], np.int64))
    assert mixed.max_ulp == 2**64
    assert dg.compare(torch.tensor([1, 2], dtype=torch.uint8), np.array([1, 2], np.int8)).ok
    assert dg.compare(torch.tensor([True]), torch.tensor([False])).max_ulp == 1
    loose = dg.compare(np.array([10]), np.array([11]), atol=1)
    assert loose.ok and loose.max_ulp == 1


def test_compare_complex_part_by_part() -> None:
    a = torch.tensor([1 + 1j, 2 + 0j], dtype=torch.complex64)
    b = a.clone()
    torch.view_as_real(b)[0, 1] = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0))
    c = dg.compare(a, b)
    assert c.ok and c.max_ulp == 1 and c.worst_index == (0,) and c.compared_in == "float32"
    assert dg.compare(torch.tensor([2.0]), torch.tensor([2 + 0j])).max_ulp == 0


def test_compare_trees_by_key_path() -> None:
    w = torch.ones(2, dtype=torch.bfloat16)
    w3 = from_bits([0x3F80, 0x3F83], torch.bfloat16)
    a = {"layer": {"weight": w, "bias": w}, "step": 3, "name": "run", "stack": [w, w]}
    b = {"layer": {"weight": w3}, "extra": w, "step": 3, "name": "run", "stack": [w]}
    c = dg.compare(a, b)
    assert not c.ok
    assert c.missing == ("['layer']['bias']", "['stack'][1]")
    assert c.extra == ("['extra']",)
    assert set(c.leaves) == {"['layer']['weight']", "['step']", "['name']", "['stack'][0]"}
    weight = c.leaves["['layer']['weight']"]
    assert weight.path == "['layer']['weight']" and weight.max_ulp == 3 and not weight.ok
    assert c.leaves["['name']"].ok and c.leaves["['step']"].ok
    assert c.max_ulp == 3 and c.numel == 2 + 1 + 2
    assert c.problem is not None and "only in a" in c.problem
    json_ok(c)
    same = dg.compare(a, {**a})
    assert same.ok and same.max_ulp == 0 and same.bitwise_equal is True
    assert not dg.compare({"name": "a"}, {"name": "b"}).ok
    assert dg.compare([w], [w, w]).bitwise_equal is False  # an extra leaf


def test_compare_chunked_matches_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((7, 5)).astype(ml_dtypes.bfloat16)
    bits = a.view(np.uint16).copy()
    bits[4, 3] += 2
    bits[1, 1] += 1
    b = bits.view(ml_dtypes.bfloat16)
    whole = dg.compare(a, b)
    monkeypatch.setattr(_values, "_CHUNK", 3)
    chunked = dg.compare(a, b)
    assert whole == chunked
    assert chunked.max_ulp == 2 and chunked.worst_index == (4, 3)


def test_compare_reads_awkward_arrays() -> None:
    x = np.arange(6, dtype=">f4")[::-1]
    x.flags.writeable = False
    c = dg.compare(x, torch.arange(5, -1, -1, dtype=torch.float32))
    assert c.ok and c.bitwise_equal is True
    bad = dg.compare(np.array(["a"]), np.array(["a"]))
    assert not bad.ok and bad.problem is not None and "string dtype" in bad.problem


def test_default_tolerances() -> None:
    assert dg.default_tolerances(torch.float16) == (1e-3, 1e-5)
    assert dg.default_tolerances("bf16") == (1.6e-2, 1e-5)
    assert dg.default_tolerances(np.float32) == (1.3e-6, 1e-5)
    assert dg.default_tolerances("float64") == (1e-7, 1e-7)
    assert dg.default_tolerances("complex64") == (1.3e-6, 1e-5)
    assert dg.default_tolerances(E4M3) == (0.125, 2.0**-9)
    assert dg.default_tolerances(E5M2) == (0.25, 2.0**-16)
    assert dg.default_tolerances("int32") == (0.0, 0.0)


# --- stats ------------------------------------------------------------------------------------


def test_stats_bfloat16_sum_does_not_stall() -> None:
    s = dg.stats(torch.ones(10_000, dtype=torch.bfloat16))
    assert (s.sum, s.mean, s.std, s.min, s.max) == (10_000.0, 1.0, 0.0, 1.0, 1.0)
    assert s.numel == s.finite == 10_000 and s.dtype == "bfloat16"


def test_stats_counts_nan_inf_zero() -> None:
    s = dg.stats(np.array([1.0, NAN, INF, -INF, -2.0, 0.0], np.float32))
    assert (s.nan_count, s.posinf_count, s.neginf_count, s.inf_count) == (1, 1, 1, 2)
    assert (s.finite, s.zeros, s.min, s.max, s.absmax, s.sum) == (3, 1, -2.0, 1.0, 2.0, -1.0)
    assert s.mean == pytest.approx(-1 / 3, rel=1e-15)
    assert s.std == pytest.approx(math.sqrt(14 / 9), rel=1e-15)  # ((4/3)² + (5/3)² + (1/3)²) / 3
    json_ok(s)
    empty = dg.stats(torch.zeros(0))
    assert empty.numel == 0 and empty.mean is None and empty.min is None


def test_stats_chunked_matches_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.random.default_rng(1).standard_normal((13, 11)) * 1e3 + 5
    monkeypatch.setattr(_values, "_CHUNK", 7)
    s = dg.stats(torch.from_numpy(x).T)
    assert s.mean == pytest.approx(x.mean(), rel=1e-12)
    assert s.std == pytest.approx(x.std(), rel=1e-12)
    assert (s.min, s.max) == (x.min(), x.max())


# --- cast_report ------------------------------------------------------------------------------

EDGE = torch.tensor([1.0, 1e6, INF, -INF, NAN, 1e-45, 3.0e38], dtype=torch.float32)


def test_cast_report_float8_e4m3fn_saturates() -> None:
    r = dg.cast_report(EDGE, E4M3)
    assert (r.kernel, r.source_dtype, r.target_dtype, r.numel) == (
        "torch", "float32", "float8_e4m3fn", 7,
    )  # fmt: skip
    if not torch_e4m3fn_saturates():  # torch < 2.13: 1e6, ±inf, 3e38 -> NaN, as in ml_dtypes
        assert (r.saturated, r.nan_created, r.ml_dtypes_nan, r.astype_differs) == (0, 4, 4, 0)
        assert (r.flushed_to_zero, r.nan_changed, r.exact, r.inexact) == (1, 1, 1, 3)
        assert (r.max_rel_err, r.mean_rel_err) == (1.0, 0.5)  # over 1.0 and 1e-45 only
        assert dict(r.ulp_histogram) == {"0": 1, "<=0.5": 1, "<=1": 0, "<=2": 0, ">2": 0}
        assert not r.safe and "overflow -> NaN" in r.semantics
        return
    # torch: [1, 448, 448, -448, NaN 0x7f, 0, 448]; ml_dtypes: 1e6, ±inf, 3e38 -> NaN
    assert r.saturated == 4 and r.overflow_inf == 0 and r.nan_created == 0
    assert r.ml_dtypes_nan == 4
    assert r.flushed_to_zero == 1 and r.subnormal == 0
    assert r.nan_changed == 1  # 0x7FC00000's top 3 mantissa bits are 100; e4m3fn's NaN has 111
    assert (r.exact, r.inexact) == (1, 3)
    # relative errors over 1, 1e6, 1e-45, 3e38: 0, 0.999552, 1, 1 - 448/3e38
    assert r.max_rel_err == 1.0
    assert r.mean_rel_err == pytest.approx((0.999552 + 2) / 4, rel=1e-12)
    assert dict(r.ulp_histogram) == {"0": 1, "<=0.5": 1, "<=1": 0, "<=2": 0, ">2": 2}
    assert not r.safe
    assert "saturates" in r.semantics and "448" in r.semantics
    json_ok(r)


def test_cast_report_bfloat16() -> None:
    r = dg.cast_report(EDGE, torch.bfloat16)
    # torch: [1, 999424, inf, -inf, 0xFFFF, 0, 3.004e38]: infs stay infs, nothing overflows
    assert (r.overflow_inf, r.saturated, r.nan_created, r.ml_dtypes_nan) == (0, 0, 0, 0)
    assert r.flushed_to_zero == 1  # 1e-45 is far below bf16's smallest subnormal 9.2e-41
    assert r.nan_changed == 1  # 0x7FC00000 -> 0xFFFF flips the sign
    assert (r.exact, r.inexact) == (1, 3)
    assert dict(r.ulp_histogram) == {"0": 1, "<=0.5": 3, "<=1": 0, "<=2": 0, ">2": 0}
    rel = [0.0, 576 / 1e6, 1.0, abs(float(torch.tensor(3.0e38).to(torch.bfloat16)) - 3e38) / 3e38]
    assert r.mean_rel_err == pytest.approx(sum(rel) / 4, rel=1e-6)
    assert not r.safe


def test_cast_report_float16() -> None:
    r = dg.cast_report(EDGE, "f16")
    assert r.overflow_inf == 2  # 1e6 and 3e38 are past 65520
    assert (r.saturated, r.nan_created, r.ml_dtypes_nan, r.astype_differs) == (0, 0, 0, 0)
    assert r.flushed_to_zero == 1 and r.nan_changed == 0  # 0x7FC00000 -> 0x7E00 keeps it
    assert (r.exact, r.inexact) == (1, 3)
    assert r.max_rel_err == 1.0 and r.mean_rel_err == 0.5  # over 1.0 and 1e-45 only
    assert not r.safe


def test_cast_report_float8_e5m2_overflows_to_inf() -> None:
    r = dg.cast_report(EDGE, E5M2)
    assert (r.overflow_inf, r.saturated, r.ml_dtypes_nan) == (2, 0, 0)


def test_cast_report_nan_payloads() -> None:
    nans = from_bits([0x7FC00000, 0xFFC00000, 0x7FC00001, 0x7F800001], torch.float32)
    bf = dg.cast_report(nans, torch.bfloat16)
    assert bits_of(nans.to(torch.bfloat16)) == [0xFFFF] * 4
    assert bf.nan_changed == 4 and bf.nan_created == 0 and not bf.safe
    # f16 keeps sign and the top 10 payload bits; only the signalling NaN is quieted
    half = dg.cast_report(nans, torch.float16)
    assert bits_of(nans.to(torch.float16)) == [0x7E00, 0xFE00, 0x7E00, 0x7E00]
    assert half.nan_changed == 1


def test_cast_report_subnormals_and_signed_zero() -> None:
    x = torch.tensor([1e-5, 6.0e-5, 1e-8, -0.0, 2.0**-24], dtype=torch.float32)
    r = dg.cast_report(x, torch.float16)
    # f16: smallest normal 6.1e-5, smallest subnormal 2**-24 = 5.96e-8
    assert r.subnormal == 3 and r.flushed_to_zero == 1
    assert r.exact == 2  # -0.0 and 2**-24
    assert not r.safe  # the flush


def test_cast_report_safe_widening_every_bfloat16_pattern() -> None:
    x = torch.from_numpy(all_patterns_u(2).view(np.int16)).view(torch.bfloat16)
    r = dg.cast_report(x, torch.float32)
    finite = int(torch.isfinite(x.float()).sum())
    assert r.safe and r.exact == finite and r.inexact == 0 and r.nan_changed == 0
    assert r.astype_differs == 0 and "widening" in r.semantics


def test_cast_report_complex_and_integer_sources() -> None:
    r = dg.cast_report(torch.tensor([1 + 1j, 2 + 0j]), torch.float32)
    assert r.imag_discarded == 1 and not r.safe and "imaginary" in r.semantics
    i = dg.cast_report(np.arange(70_000, dtype=np.int32), torch.float16)
    assert i.overflow_inf == 70_000 - 65_520  # 65520 is where float16 rounds to inf
    # exact: all of 0..2048, then 1024 per binade up to 32768, then multiples of 32 to 65504
    assert i.exact == 2049 + 1024 * 4 + 1023
    with pytest.raises(tb.UnsupportedDtypeError):
        dg.cast_report(torch.ones(2), torch.int32)


E8M0 = getattr(torch, "float8_e8m0fnu", None)
needs_e8m0 = pytest.mark.skipif(
    E8M0 is None or "float8_e8m0fnu" not in {r.name for r in tb.dtype_table()},
    reason="this torch or ml_dtypes has no float8_e8m0fnu",
)


@needs_e8m0
def test_cast_report_float8_e8m0fnu_has_no_zero_and_no_sign() -> None:
    x = torch.tensor([0.0, -0.0, -1.0, -2.0, 1.0, 4.0, NAN])
    # e8m0 is 2^(bits - 127): torch makes ±0 its smallest value 2^-127 (0x00) and a negative
    # value its magnitude; ml_dtypes makes all four NaN (0xff).
    assert bits_of(x.to(E8M0)) == [0x00, 0x00, 0x7F, 0x80, 0x7F, 0x81, 0xFF]
    ml = x.numpy().astype(ml_dtypes.float8_e8m0fnu).view(np.uint8).tolist()
    assert ml == [0xFF, 0xFF, 0xFF, 0xFF, 0x7F, 0x81, 0xFF]
    r = dg.cast_report(x, "e8m0")
    assert (r.zero_replaced, r.sign_dropped, r.ml_dtypes_nan, r.astype_differs) == (2, 2, 4, 4)
    assert (r.nan_created, r.nan_changed, r.saturated, r.flushed_to_zero) == (0, 0, 0, 0)
    assert (r.exact, r.inexact) == (2, 4) and not r.safe
    assert "; 0 -> 5.87747e-39 (0x00); -1 -> 1; NaN -> 0xff" in r.semantics
    json_ok(r)


@needs_e8m0
def test_cast_report_float8_e8m0fnu_powers_of_two_are_safe() -> None:
    r = dg.cast_report(torch.tensor([2.0**-127, 0.5, 1.0, 2.0**127], dtype=torch.float64), E8M0)
    assert r.safe and r.exact == 4 and (r.zero_replaced, r.sign_dropped) == (0, 0)
    i = dg.cast_report(np.arange(-2, 3, dtype=np.int32), E8M0)  # -2 -1 0 1 2
    assert (i.zero_replaced, i.sign_dropped, i.ml_dtypes_nan) == (1, 2, 3) and not i.safe
    assert "0 -> 5.87747e-39 (0x00); -1 -> 1" in i.semantics


@needs_e8m0
def test_cast_report_float8_e8m0fnu_counts_every_bfloat16_pattern_as_torch_casts() -> None:
    x = torch.from_numpy(all_patterns_u(2).view(np.int16)).view(torch.bfloat16)
    r = dg.cast_report(x, E8M0)
    v, got = x.double(), x.to(E8M0).double()
    assert r.zero_replaced == int(((v == 0) & ~got.isnan()).sum()) == 2  # +0 and -0
    # torch makes a negative value its magnitude, NaN only where that overflows (and -inf)
    assert r.sign_dropped == int(((v < 0) & (got > 0)).sum()) == 32_575
    assert r.nan_created == int((~v.isnan() & got.isnan()).sum()) == 2 * 65
    with np.errstate(invalid="ignore", over="ignore"):  # ml_dtypes 0.5 warns about its NaNs
        ml = tb.to_torch(tb.to_numpy(x).astype(ml_dtypes.float8_e8m0fnu)).double()
    assert r.ml_dtypes_nan == int((~v.isnan() & ml.isnan()).sum()) > 2 + 32_575


def test_cast_report_chunked_matches_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.from_numpy(np.random.default_rng(2).standard_normal((9, 4)) * 500).float()
    whole = dg.cast_report(x, E4M3)
    monkeypatch.setattr(_values, "_CHUNK", 5)
    chunked = dg.cast_report(x, E4M3)
    # chunks without overflow sum their relative errors as float32 quotients
    assert chunked.mean_rel_err == pytest.approx(whole.mean_rel_err, rel=1e-6)
    assert chunked.max_rel_err == pytest.approx(whole.max_rel_err, rel=1e-7)
    rounded = {"max_rel_err": None, "mean_rel_err": None}
    assert replace(chunked, **rounded) == replace(whole, **rounded)
    assert chunked.saturated + chunked.nan_created > 0 and chunked.flushed_to_zero == 0


def test_results_are_returned_not_printed(capsys: pytest.CaptureFixture[str]) -> None:
    x = torch.ones(3)
    dg.describe(x), dg.compare(x, x), dg.stats(x), dg.cast_report(x, "bf16")
    assert capsys.readouterr() == ("", "")


def test_every_row_compares_equal_to_itself_and_casts_safely_to_itself(
    row: tb.DTypeRow, patterns: np.ndarray
) -> None:
    """Every bit pattern (8/16-bit) or edge values + random bits: NaN payloads included."""
    t = tb.to_torch(patterns)
    c = dg.compare(patterns, tb.to_torch(t, copy=True))  # torch cannot clone int4
    assert c.ok and c.max_ulp == 0 and c.bitwise_equal is True and c.mismatches == 0
    assert c.nan_payload_changes == 0
    s = dg.stats(t)
    assert s.numel == patterns.size and s.dtype == row.name
    if row.category in ("float", "complex"):
        r = dg.cast_report(t, row)
        assert r.safe and r.inexact == 0 and r.astype_differs == 0
        values = torch.view_as_real(t) if t.is_complex() else t
        assert r.exact == int(torch.isfinite(values.to(torch.float64)).sum())


# --- the fast path for one float type agrees with the general one --------------------------------

FAST = ["bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz"]


@pytest.mark.parametrize("name", FAST)
@pytest.mark.parametrize("seed", range(4))
def test_fast_same_dtype_compare_matches_the_general_path(
    name: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random bit patterns (finite ones; some pairs across zero, some equal, some far apart)."""
    from tensorbridge.diagnostics import _compare

    row = tb.resolve_dtype(name)
    rng = np.random.default_rng(seed)
    width = row.itemsize
    raw = rng.integers(0, 256, 4096 * width, dtype=np.uint8).view(row.numpy)
    with np.errstate(invalid="ignore"):  # NaN bit patterns warn when widened
        a = raw[np.isfinite(raw.astype(np.float64))][:2000]
    b = a.copy()
    pick = rng.random(a.size) < 0.5
    nudge = rng.integers(-3, 4, a.size)
    bits = b.view(f"u{width}").astype(np.int64)
    bits[pick] = (bits[pick] + nudge[pick]) % (1 << (8 * width))
    b = bits.astype(f"u{width}").view(row.numpy)
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(b.astype(np.float64))
    b[~finite] = a[~finite]
    b[:7] = -a[:7]  # across zero
    fast = tb.compare(a, b, rtol=0.01, atol=1e-3)
    monkeypatch.setattr(
        _compare._LeafAccumulator, "_add_narrow", _compare._LeafAccumulator._add_general
    )
    general = tb.compare(a, b, rtol=0.01, atol=1e-3)
    assert (fast.max_ulp, fast.worst_index, fast.mismatches, fast.ok) == (
        general.max_ulp,
        general.worst_index,
        general.mismatches,
        general.ok,
    )
    assert fast.max_abs_err == pytest.approx(general.max_abs_err, rel=1e-6)
    assert fast.max_rel_err == pytest.approx(general.max_rel_err, rel=1e-6)
    assert fast.bitwise_equal is general.bitwise_equal is False


# (reference, coarser copy): float32 against each narrower type, and a finer 16-bit type
# against float8_e5m2, whose range is smaller than float16's (values past it take the
# general path, where the integer line continues)
CROSS = [
    ("float32", "bfloat16"),
    ("float32", "float16"),
    ("float32", "float8_e4m3fn"),
    ("float32", "float8_e5m2"),
    ("float16", "float8_e5m2"),
    ("float16", "bfloat16"),
]


@pytest.mark.parametrize(("fine", "coarse"), CROSS, ids=["/".join(p) for p in CROSS])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("flip", [False, True], ids=["a_fine", "b_fine"])
def test_fast_cross_dtype_compare_matches_the_general_path(
    fine: str, coarse: str, seed: int, flip: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finer tensor against its cast to a coarser type, perturbed by a few coarse ULPs,
    some pairs across zero, and (for e5m2) some values beyond the coarse range."""
    from tensorbridge.diagnostics import _compare

    rng = np.random.default_rng(seed)
    scale = 2.0 ** rng.integers(-12, 12, 3000)
    a = torch.from_numpy(rng.standard_normal(3000) * scale).to(getattr(torch, fine))
    c = a.to(getattr(torch, coarse))
    bits = _compare._raw(c).to(torch.int64)
    pick = torch.from_numpy(rng.random(3000) < 0.3)
    nudge = torch.from_numpy(rng.integers(-2, 3, 3000))
    width = 8 * c.element_size()
    bits[pick] += nudge[pick]
    bits = torch.where(bits >= 1 << (width - 1), bits - (1 << width), bits)
    b = bits.to(_compare._INT_OF_WIDTH[c.element_size()]).view(c.dtype)
    finite = b.to(torch.float64).isfinite()
    b[~finite] = c[~finite]
    b[:5] = (-b[:5].to(torch.float32)).to(b.dtype)  # across zero
    x, y = (b, a) if flip else (a, b)
    fast = tb.compare(x, y, rtol=0.01, atol=1e-3)
    monkeypatch.setattr(
        _compare._LeafAccumulator, "_add_narrow", _compare._LeafAccumulator._add_general
    )
    general = tb.compare(x, y, rtol=0.01, atol=1e-3)
    assert fast.compared_in == general.compared_in == coarse
    assert (fast.max_ulp, fast.worst_index, fast.mismatches, fast.ok) == (
        general.max_ulp,
        general.worst_index,
        general.mismatches,
        general.ok,
    )
    assert fast.max_abs_err == pytest.approx(general.max_abs_err, rel=1e-6)
    assert fast.max_rel_err == pytest.approx(general.max_rel_err, rel=1e-6)


def test_fast_cross_dtype_compare_chunked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path's buffers are reused across chunks and leaves of different sizes."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(1000, generator=g)
    b = a.to(torch.bfloat16)
    b[777] = b[777] * 1.5  # the worst, far from the rest
    whole = tb.compare({"x": a, "y": a[:10]}, {"x": b, "y": a[:10].to(torch.bfloat16)})
    monkeypatch.setattr(_values, "_CHUNK", 64)
    parts = tb.compare({"x": a, "y": a[:10]}, {"x": b, "y": a[:10].to(torch.bfloat16)})
    assert whole.leaves["['x']"].worst_index == parts.leaves["['x']"].worst_index == (777,)
    assert whole.to_dict() == parts.to_dict()


def test_cast_report_rtol_decides_ok_not_safe() -> None:
    x = torch.tensor([1.0, 0.3])  # 0.3 -> 0.3125 in float8_e4m3fn: 4.2 % off, nothing lost
    plain = dg.cast_report(x, "float8_e4m3fn")
    assert plain.safe and plain.ok and plain.rtol is None
    assert plain.max_rel_err == pytest.approx(0.0125 / 0.3)
    tight = dg.cast_report(x, "float8_e4m3fn", rtol=0.01)
    assert tight.safe and not tight.ok and tight.rtol == 0.01
    assert dg.cast_report(x, "float8_e4m3fn", rtol=0.05).ok
    assert not dg.cast_report(torch.tensor([1e6]), "float8_e4m3fn", rtol=10.0).ok  # not safe
    with pytest.raises(tb.InvalidArgumentError, match=r"rtol=-1\.0 is not a tolerance"):
        dg.cast_report(x, "bf16", rtol=-1.0)


QUICK_CASTS = [
    ("float32", "bfloat16"),
    ("float32", "float16"),
    ("float32", "float8_e4m3fn"),
    ("float32", "float8_e5m2"),
    ("float32", "float8_e4m3fnuz"),
    ("bfloat16", "float8_e4m3fn"),
    ("float16", "bfloat16"),
    ("bfloat16", "float32"),
]


@pytest.mark.parametrize(("src", "dst"), QUICK_CASTS, ids=["->".join(p) for p in QUICK_CASTS])
@pytest.mark.parametrize("seed", range(2))
def test_quick_cast_report_matches_the_general_path(
    src: str, dst: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finite values in range over many binades (subnormals, flushes, zeros, exact values),
    in chunks, one of which overflows (the general path) in the second seed."""
    from tensorbridge.diagnostics import _cast

    rng = np.random.default_rng(seed)
    scale = 2.0 ** rng.integers(-30, 9, 4000)
    x = torch.from_numpy(rng.standard_normal(4000) * scale).to(getattr(torch, src))
    x[:50] = 0.0
    x[50:100] = torch.tensor(0.5)
    if seed:
        x[3900] = 1e4  # beyond e4m3fn's range (not float16's, bfloat16's or e5m2's)
    monkeypatch.setattr(_values, "_CHUNK", 512)
    quick = dg.cast_report(x, dst)
    monkeypatch.setattr(_cast, "_quick_plan", lambda s, d: None)
    general = dg.cast_report(x, dst)
    # relative errors: float32 quotients (correctly rounded) against float64 ones
    assert quick.max_rel_err == pytest.approx(general.max_rel_err, rel=1e-7)
    assert quick.mean_rel_err == pytest.approx(general.mean_rel_err, rel=1e-6)
    rounded = {"max_rel_err": None, "mean_rel_err": None}
    assert replace(quick, **rounded) == replace(general, **rounded)
    assert quick.flushed_to_zero + quick.subnormal + quick.exact > 0


@pytest.mark.parametrize("dst", ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_quick_cast_report_counts_sparse_small_values_by_row(
    dst: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A few zeros, float32 subnormals, flushes and subnormal results among ordinary values:
    the quick path counts them on the rows holding them (and the ragged tail), and agrees
    with the general path; a chunk of values beyond the range falls back to it."""
    from tensorbridge.diagnostics import _cast

    rng = np.random.default_rng(7)
    x = torch.from_numpy(rng.standard_normal(4000).astype(np.float32) + 1.5)
    tiny = [0.0, -0.0, 1e-45, -3e-40, 1e-30, 2e-8, -3e-6, 6e-5, 1e-3, -5e-3, 0.0155]
    x[[5, 700, 1300, 2047, 2048, 2999, 3990, 3995, 3999, 1, 1000]] = torch.tensor(tiny)
    x[3001] = 3e-5  # subnormal in float16 and float8_e5m2
    x[2500] = 470.0  # e4m3fn saturates it (more than half a ULP): that chunk is general
    monkeypatch.setattr(_values, "_CHUNK", 1000)
    monkeypatch.setattr(_cast, "_ROW", 16)
    quick = dg.cast_report(x, dst)
    monkeypatch.setattr(_cast, "_quick_plan", lambda s, d: None)
    general = dg.cast_report(x, dst)
    assert quick.max_rel_err == pytest.approx(general.max_rel_err, rel=1e-7)
    assert quick.mean_rel_err == pytest.approx(general.mean_rel_err, rel=1e-6)
    rounded = {"max_rel_err": None, "mean_rel_err": None}
    assert replace(quick, **rounded) == replace(general, **rounded)
    assert quick.flushed_to_zero > 0 and quick.subnormal > 0
