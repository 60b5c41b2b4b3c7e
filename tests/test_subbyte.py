"""Issue 29's dtypes: torch's sub-byte integers and the ml_dtypes types torch lacks.

* **Paired, kernel-less rows** (int1, int2, int4, uint1, uint2, uint4): every one of the
  256 byte patterns crosses torch <-> NumPy zero-copy and bit-exact (bits above the
  type's width included: ml_dtypes reads the low N bits, tensorbridge never inspects
  values); copies are independent memory; casts to or from them are ml_dtypes'
  ``astype``, with the same ``copy=`` rules as every other row.
* **Shell dtypes** (torch's int3, int5-int7, uint3, uint5-uint7): refused, naming
  ``dtype=np.int8`` / ``np.uint8``, which is a zero-copy view of the bytes.
* **NumPy-only rows** (float8_e3m4, ..., bcomplex32): ``to_numpy(t, dtype=...)`` casts
  bit-identically to ml_dtypes' ``astype`` on every float32 class, the probes built from
  the target's own values (each tie between neighbours, just either side of it, past
  the largest value); ``to_torch`` of such an array needs a ``dtype=``.
* DLPack: a producer's int8 stays int8 (torch exports its sub-byte integers so), the
  consumer's two routes give the same arrays, and a capsule of a type torch lacks
  arrives as its ml_dtypes array.
"""

from __future__ import annotations

import ctypes
import itertools
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorbridge as tb
from _budget import examples
from conftest import NUMPY_ONLY_ROWS, ROWS, data_address, make_patterns, tensor_bytes
from tensorbridge import _dlpack as dlpack
from tensorbridge._plan import plan_numpy, plan_torch
from tensorbridge._versions import NUMPY, NUMPY_DLPACK_EXTENDED
from tensorbridge.diagnostics import describe
from test_dlpack import DTYPE_OFFSET, VERSIONED, _pointer, mark_read_only

SUBBYTE = [r for r in ROWS if not r.kernels]
SHELLS = [
    getattr(torch, f"{sign}{n}")
    for sign in ("int", "uint")
    for n in range(1, 8)
    if hasattr(torch, f"{sign}{n}") and not hasattr(ml_dtypes, f"{sign}{n}")
]
EVERY_BYTE = np.arange(256, dtype=np.uint16).astype(np.uint8)


def subbyte(param: Any) -> Any:
    return pytest.mark.parametrize("row", SUBBYTE, ids=lambda r: r.name)(param)


def bits(a: np.ndarray) -> bytes:
    return a.view(f"u{a.dtype.itemsize}").tobytes()


def every_byte_tensor(row: tb.DTypeRow) -> torch.Tensor:
    """A tensor of ``row`` holding the 256 byte patterns, built by torch alone."""
    return torch.from_numpy(EVERY_BYTE.copy()).view(row.torch)


def width(row: tb.DTypeRow) -> int:
    return int(row.name.removeprefix("u").removeprefix("int"))


def low_bits_value(byte: int, row: tb.DTypeRow) -> int:
    """The value of a byte as the N-bit integer in its low bits (two's complement if signed)."""
    n = width(row)
    low = byte & ((1 << n) - 1)
    return low - (1 << n) if row.category == "int" and low >> (n - 1) else low


# --- the table -----------------------------------------------------------------------------------


def test_the_table_has_every_new_row_and_says_what_torch_has() -> None:
    def known(names: set[str]) -> set[str]:  # those the installed ml_dtypes has
        return {n for n in names if hasattr(ml_dtypes, n)}

    assert {r.name for r in SUBBYTE} == known({"int1", "int2", "int4", "uint1", "uint2", "uint4"})
    assert {r.name for r in NUMPY_ONLY_ROWS} == known({
        "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e5m3fnu",
        "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn", "bcomplex32",
    })  # fmt: skip
    for row in SUBBYTE:
        assert (row.in_torch, row.kernels, row.carrier) == (True, False, torch.uint8)
        assert row.torch is getattr(torch, row.name) and row.numpy == getattr(ml_dtypes, row.name)
    for row in NUMPY_ONLY_ROWS:
        assert (row.in_torch, row.kernels) == (False, False)


def test_every_spelling_ml_dtypes_accepts_resolves(numpy_only_row: tb.DTypeRow) -> None:
    row = numpy_only_row
    kind = getattr(ml_dtypes, row.name)
    for spec in (row.name, row.name.upper(), kind, np.dtype(kind), np.dtype(row.name), row):
        assert tb.resolve_dtype(spec) is row, spec
    assert tb.numpy_dtype(row.name) == np.dtype(kind)
    with pytest.raises(tb.UnsupportedDtypeError, match="is not a dtype"):
        tb.resolve_dtype(f"torch.{row.name}")  # torch has no such dtype


@subbyte
def test_every_spelling_of_a_paired_row_resolves(row: tb.DTypeRow) -> None:
    kind = getattr(ml_dtypes, row.name)
    for spec in (row.name, f"torch.{row.name}", row.torch, kind, np.dtype(kind), row):
        assert tb.resolve_dtype(spec) is row, spec


@subbyte
def test_ml_dtypes_reads_the_low_bits_of_each_byte(row: tb.DTypeRow) -> None:
    # The reference behaviour tensorbridge documents: ml_dtypes stores a value in the low
    # N bits (upper bits zero) and reads only the low N bits (int4 reads 0x18 as -8).
    values = EVERY_BYTE.view(row.numpy).astype(np.int16)
    assert values.tolist() == [low_bits_value(b, row) for b in range(256)]
    lo, hi = int(ml_dtypes.iinfo(row.numpy).min), int(ml_dtypes.iinfo(row.numpy).max)
    stored = np.arange(lo, hi + 1, dtype=np.int16).astype(row.numpy).view(np.uint8)
    assert stored.tolist() == [v & ((1 << width(row)) - 1) for v in range(lo, hi + 1)]


# --- paired rows: zero-copy and bit-exact ------------------------------------------------------


@subbyte
def test_every_byte_pattern_crosses_zero_copy_both_ways(row: tb.DTypeRow) -> None:
    t = every_byte_tensor(row)

    a = tb.to_numpy(t)

    assert a.dtype == row.numpy and a.view(np.uint8).tolist() == list(range(256))
    assert data_address(a) == t.data_ptr()
    back = tb.to_torch(a)
    assert back.dtype is row.torch and back.data_ptr() == t.data_ptr()
    assert tensor_bytes(back) == EVERY_BYTE.tobytes()
    a.view(np.uint8)[0] = 0xF7  # one memory: the tensor sees the write, upper bits and all
    assert tensor_bytes(t)[0] == 0xF7


@subbyte
def test_strided_views_stay_zero_copy(row: tb.DTypeRow) -> None:
    t = every_byte_tensor(row).reshape(16, 16)
    for view in (t.t(), t[::2, 1::3], t[:, 5]):
        a = tb.to_numpy(view)
        assert np.shares_memory(a, tb.to_numpy(t)) and a.strides == tuple(view.stride())
        assert a.view(np.uint8).tobytes() == tensor_bytes(view)
        u = tb.to_torch(a)
        assert u.data_ptr() == view.data_ptr() and u.stride() == view.stride()


@subbyte
def test_copies_are_independent_memory(row: tb.DTypeRow) -> None:
    t = every_byte_tensor(row)
    a = tb.to_numpy(t, copy=True)
    u = tb.to_torch(a, copy=True)
    v = tb.to_torch(t, copy=True)
    assert a.dtype == row.numpy and a.tobytes() == bytes(range(256))
    assert u.dtype is v.dtype is row.torch
    assert tensor_bytes(u) == tensor_bytes(v) == bytes(range(256))
    assert len({u.data_ptr(), v.data_ptr(), t.data_ptr(), data_address(a)}) == 4
    a.view(np.uint8)[:] = 0  # writes to each copy reach no other
    u.view(torch.uint8).fill_(1)
    v.view(torch.uint8).fill_(2)
    assert tensor_bytes(t) == bytes(range(256)) and tensor_bytes(u) == bytes([1] * 256)

    ro = EVERY_BYTE.view(row.numpy)
    ro.flags.writeable = False  # a read-only array is copied, never aliased writably
    w = tb.to_torch(ro)
    assert w.data_ptr() != data_address(ro) and tensor_bytes(w) == bytes(range(256))
    with pytest.raises(tb.CopyRequiredError, match="is read-only"):
        tb.to_torch(ro, copy=False)
    flipped = tb.to_torch(EVERY_BYTE.view(row.numpy)[::-1])  # torch has no negative strides
    assert flipped.stride() == (1,) and tensor_bytes(flipped) == bytes(range(255, -1, -1))


@subbyte
def test_casts_are_ml_dtypes_astype_both_ways(row: tb.DTypeRow) -> None:
    t = every_byte_tensor(row)
    a = EVERY_BYTE.view(row.numpy)
    for dt in (np.int8, np.int16, np.float32, ml_dtypes.bfloat16):
        want = ml_astype(a, np.dtype(dt))
        got = tb.to_numpy(t, dtype=dt)
        assert got.dtype == dt and np.array_equal(got, want)
        assert not np.shares_memory(got, a)
        made = tb.to_torch(a, dtype=tb.torch_dtype(dt))
        assert np.array_equal(tb.to_numpy(made), want)
        assert np.array_equal(tb.to_numpy(tb.to_torch(t, dtype=tb.torch_dtype(dt))), want)


def ml_astype(a: np.ndarray, dt: np.dtype) -> np.ndarray:
    """ml_dtypes' cast; before 0.7 (no cast between its own integers and floats) through
    float32, which :func:`test_float32_is_the_direct_casts_route` shows is the same."""
    try:
        return a.astype(dt)
    except TypeError:
        return a.astype(np.float32).astype(dt)


_ML_FLOATS = [
    r for r in tb.dtype_table() if r.category == "float" and r.carried and r.itemsize <= 2
]


@subbyte
def test_float32_is_the_direct_casts_route(row: tb.DTypeRow) -> None:
    """Where ml_dtypes casts its sub-byte integers and its floats into each other directly
    (0.7), the route tensorbridge takes on older ml_dtypes, through float32, gives the same
    bits for every value both ways."""
    ints = EVERY_BYTE.view(row.numpy)
    for f in _ML_FLOATS:
        try:
            direct = ints.astype(f.numpy)
        except TypeError:
            pytest.skip(reason="this ml_dtypes casts through float32 only: nothing to compare")
        assert bits(direct) == bits(ints.astype(np.float32).astype(f.numpy)), f.name
        every = np.arange(1 << (8 * f.itemsize), dtype=np.uint32).astype(f"u{f.itemsize}")
        floats = every.view(f.numpy)
        with np.errstate(all="ignore"):
            back = floats.astype(row.numpy)
            via = floats.astype(np.float32).astype(row.numpy)
        assert bits(back) == bits(via), f.name

    wide = np.array([200, -9, 7, -8, 15, 16, -1, 0], np.int32)  # ml_dtypes wraps
    floats = np.array([7.9, -8.6, 1.5, -0.5, 3.0, 100.0, np.nan, np.inf], np.float32)  # truncates
    for src in (wide, floats):
        with np.errstate(all="ignore"):
            want = src.astype(row.numpy).view(np.uint8).tobytes()
        assert tb.to_numpy(torch.from_numpy(src), dtype=row.torch).tobytes() == want
        assert tensor_bytes(tb.to_torch(src, dtype=row.torch)) == want
        assert tensor_bytes(tb.to_torch(torch.from_numpy(src), dtype=row.torch)) == want
        assert tb.to_numpy(src, dtype=row.numpy).tobytes() == want


def test_casts_wrap_and_truncate_as_ml_dtypes_does() -> None:
    t = tb.to_torch(np.array([200, -9, 7], np.int32), dtype=torch.int4)
    assert tb.to_numpy(t, dtype=np.int8).tolist() == [-8, 7, 7]
    f = tb.to_torch(np.array([7.9, -7.9, 0.5], np.float32), dtype=torch.int4)
    assert tb.to_numpy(f, dtype=np.int8).tolist() == [7, -7, 0]


@subbyte
def test_copy_false_refuses_a_cast_and_allows_the_view(row: tb.DTypeRow) -> None:
    t = every_byte_tensor(row)
    assert data_address(tb.to_numpy(t, copy=False)) == t.data_ptr()
    assert tb.to_torch(tb.to_numpy(t), copy=False).data_ptr() == t.data_ptr()
    fix = "pass copy=None to allow the copy"
    with pytest.raises(tb.CopyRequiredError, match=f"a cast to int8 makes new values; {fix}"):
        tb.to_numpy(t, dtype=np.int8, copy=False)
    with pytest.raises(tb.CopyRequiredError, match=f"to_torch\\(copy=False\\).*; {fix}"):
        tb.to_torch(np.zeros(3, np.float32), dtype=row.torch, copy=False)
    with pytest.raises(tb.CopyRequiredError, match=fix):
        tb.to_torch(t, dtype=torch.float32, copy=False)


@subbyte
def test_out_is_filled_through_the_carrier_or_ml_dtypes(row: tb.DTypeRow) -> None:
    t = every_byte_tensor(row)
    a = EVERY_BYTE.view(row.numpy)
    out = np.empty(256, np.int8)
    assert tb.to_numpy(t, out=out) is out and np.array_equal(out, a.astype(np.int8))
    same = torch.zeros(256, dtype=torch.uint8).view(row.torch)
    assert tb.to_torch(a, out=same) is same and tensor_bytes(same) == EVERY_BYTE.tobytes()
    floats = torch.empty(256)
    tb.to_torch(t, out=floats)
    assert np.array_equal(floats.numpy(), a.astype(np.float32))
    into = torch.zeros(256, dtype=torch.uint8).view(row.torch)
    tb.to_torch(np.arange(256, dtype=np.int32), out=into)  # a cast into it: ml_dtypes'
    assert tensor_bytes(into) == np.arange(256, dtype=np.int32).astype(row.numpy).tobytes()


@subbyte
def test_plans_say_what_they_do(row: tb.DTypeRow) -> None:
    t = every_byte_tensor(row)
    assert plan_numpy(t).steps == ("view",)
    assert plan_numpy(t, copy=True).steps == ("copy",)
    cast = plan_numpy(t, np.float32)
    assert (
        cast.steps == ("cast",)
        and cast.reason == f"is {row.name} and a cast to float32 makes new values"
    )
    assert plan_torch(tb.to_numpy(t)).steps == ("view",)
    assert plan_torch(np.zeros(2, np.float32), row.torch).steps == ("cast",)
    d = describe(t)
    assert (d.torch_dtype, d.numpy_dtype, d.to_numpy.verdict) == (str(row.torch), row.name, "share")


@subbyte
def test_trees_share_copy_and_keep_ties(row: tb.DTypeRow) -> None:
    base = every_byte_tensor(row).reshape(16, 16)
    tree = {"w": base, "rows": base[2:5], "t": base.t()}

    shared = tb.tree_to_numpy(tree)
    assert all(np.shares_memory(v, tb.to_numpy(base)) for v in shared.values())
    copied = tb.tree_to_numpy(tree, copy=True)
    assert not any(np.shares_memory(v, tb.to_numpy(base)) for v in copied.values())
    assert np.shares_memory(copied["w"], copied["rows"])  # the ties survive the copy
    assert np.shares_memory(copied["w"], copied["t"])
    for k, v in copied.items():
        assert v.dtype == row.numpy and v.view(np.uint8).tobytes() == tensor_bytes(tree[k])
    back = tb.tree_to_torch(copied, copy=True)
    assert all(back[k].dtype is row.torch for k in back)
    assert tensor_bytes(back["t"]) == tensor_bytes(base.t())
    cast = tb.tree_to_numpy(tree, dtype=np.int8)
    assert np.array_equal(cast["rows"], copied["rows"].astype(np.int8))


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(SUBBYTE),
    st.lists(st.integers(1, 6), min_size=1, max_size=3),
    st.integers(0, 2**32 - 1),
    st.booleans(),
)
def test_random_views_round_trip_bit_exact(
    row: tb.DTypeRow, shape: list[int], seed: int, transpose: bool
) -> None:
    raw = np.random.default_rng(seed).integers(0, 256, int(np.prod(shape)) * 2, np.uint8)
    t = torch.from_numpy(raw).view(row.torch)[::2].reshape(shape)
    if transpose:
        t = t.mT if t.ndim > 1 else t
    a = tb.to_numpy(t)
    assert data_address(a) == t.data_ptr() and a.view(np.uint8).tobytes() == tensor_bytes(t)
    c = tb.to_numpy(t, copy=True)
    assert c.tobytes() == tensor_bytes(t) and tensor_bytes(tb.to_torch(c)) == tensor_bytes(t)


# --- shell dtypes: no NumPy type --------------------------------------------------------------


@pytest.mark.parametrize("tdt", SHELLS, ids=str)
def test_shell_dtypes_are_refused_naming_the_byte_view(tdt: torch.dtype) -> None:
    byte = "uint8" if str(tdt).startswith("torch.u") else "int8"
    t = torch.from_numpy(EVERY_BYTE.copy()).view(tdt)

    for call in (lambda: tb.to_numpy(t), lambda: tb.to_numpy(t, dtype=np.float32)):
        with pytest.raises(tb.UnsupportedDtypeError) as info:
            call()
        assert str(info.value) == (
            f"sub-byte {tdt} has no NumPy dtype (ml_dtypes has no "
            f"{str(tdt).removeprefix('torch.')}) and torch has no kernels for it; pass "
            f"dtype=np.{byte} for its bytes as torch holds them, one value a byte (a zero-copy "
            "view)"
        )
    with pytest.raises(tb.UnsupportedDtypeError, match=f"pass dtype=np.{byte}"):
        tb.to_torch(t, dtype=torch.float32)

    a = tb.to_numpy(t, dtype=getattr(np, byte))  # the bytes as torch holds them
    assert a.dtype == getattr(np, byte) and data_address(a) == t.data_ptr()
    assert a.view(np.uint8).tolist() == list(range(256))
    u = tb.to_torch(t, dtype=getattr(torch, byte))
    assert u.dtype is getattr(torch, byte) and u.data_ptr() == t.data_ptr()
    c = tb.to_numpy(t, dtype=getattr(np, byte), copy=True)
    assert not np.shares_memory(c, a) and c.tobytes() == a.tobytes()
    assert tb.to_torch(t).data_ptr() == t.data_ptr()  # already a tensor: returned as is
    d = describe(t)
    assert d.numpy_dtype is None and d.to_numpy.verdict == "error" and byte in d.to_numpy.reason


# --- NumPy-only rows: casts into them ----------------------------------------------------------

F32_CLASSES = np.array(
    [
        0x00000000, 0x80000000, 0x7F800000, 0xFF800000,  # ±0, ±inf
        0x7FC00000, 0xFFC00000, 0x7FC00001, 0x7F800001, 0xFFBFFFFF,  # NaNs, payloads
        0x00000001, 0x807FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF,  # subnormal, normal, max
        0x3F800000, 0xBF800000, 0x3EAAAAAB,  # ±1, 1/3
    ],
    np.uint32,
).view(np.float32)  # fmt: skip


def probes(row: tb.DTypeRow) -> np.ndarray:
    """float32 values that exercise every rounding decision of a cast into ``row``.

    From the target's own values: each value, each tie between neighbours and the float32
    values either side of it, the tie past the largest value (saturation or overflow),
    twice the largest; their negatives; and every float32 class.
    """
    codes = EVERY_BYTE.view(row.numpy)
    values = np.unique(codes.astype(np.float64)[np.isfinite(codes.astype(np.float64))])
    top = values[-1] + (values[-1] - values[-2]) / 2  # half a step past the largest
    ties = np.concatenate([(values[:-1] + values[1:]) / 2, [top, 2 * values[-1]]])
    ties32 = ties.astype(np.float32)
    assert np.array_equal(ties32.astype(np.float64), ties)  # every tie is a float32
    either = [np.nextafter(ties32, np.float32(np.inf)), np.nextafter(ties32, np.float32(-np.inf))]
    positive = np.concatenate([values.astype(np.float32), ties32, *either])
    return np.concatenate([positive, -positive, F32_CLASSES])


def bytes_of(a: np.ndarray) -> bytes:
    return bytes(np.ascontiguousarray(a).view(np.uint8).tobytes())


FLOAT_ONLY = [r for r in NUMPY_ONLY_ROWS if r.category == "float"]


@pytest.mark.parametrize("row", FLOAT_ONLY, ids=lambda r: r.name)
def test_casts_into_numpy_only_types_are_ml_dtypes_astype(row: tb.DTypeRow) -> None:
    x = probes(row)
    with np.errstate(all="ignore"):
        want = x.astype(row.numpy)
    for spec in (row.numpy, row.name, row, getattr(ml_dtypes, row.name)):
        got = tb.to_numpy(torch.from_numpy(x), dtype=spec)
        assert got.dtype == row.numpy and bytes_of(got) == bytes_of(want), spec
    assert bytes_of(tb.to_numpy(x, dtype=row.numpy)) == bytes_of(want)  # an array too
    for narrow in (torch.bfloat16, torch.float16, torch.float64):  # from the tensor's values
        t = torch.from_numpy(x).to(narrow)
        with np.errstate(all="ignore"):
            ref = tb.to_numpy(t).astype(row.numpy)
        assert bytes_of(tb.to_numpy(t, dtype=row.numpy)) == bytes_of(ref), narrow
    with pytest.raises(tb.CopyRequiredError, match="makes new values"):
        tb.to_numpy(torch.from_numpy(x), dtype=row.numpy, copy=False)


@pytest.mark.parametrize("row", FLOAT_ONLY, ids=lambda r: r.name)
def test_each_tie_rounds_to_the_even_code(row: tb.DTypeRow) -> None:
    # ml_dtypes' rounding, seen through tensorbridge: a tie between two neighbouring
    # positive values goes to the one whose code is even (its last bit clear).
    codes = EVERY_BYTE.view(row.numpy)
    wide = codes.astype(np.float64)
    canonical = codes.astype(row.numpy).view(np.uint8)  # ml_dtypes' own code of each value
    positive = [c for c in range(256) if canonical[c] == c and np.isfinite(wide[c]) and wide[c] > 0]
    positive.sort(key=lambda c: wide[c])
    pairs = list(itertools.pairwise(positive))
    assert all(hi == lo + 1 for lo, hi in pairs)  # neighbouring values, neighbouring codes
    ties = np.array([(wide[lo] + wide[hi]) / 2 for lo, hi in pairs], np.float32)

    got = tb.to_numpy(torch.from_numpy(ties), dtype=row.numpy).view(np.uint8)

    assert got.tolist() == [lo if lo % 2 == 0 else hi for lo, hi in pairs]


needs_bcomplex32 = pytest.mark.skipif(
    not hasattr(ml_dtypes, "bcomplex32"), reason="this ml_dtypes has no bcomplex32 (0.7 has)"
)


@needs_bcomplex32
def test_casts_into_bcomplex32_are_ml_dtypes_astype() -> None:
    row = tb.resolve_dtype("bcomplex32")
    parts = np.concatenate([probes(tb.resolve_dtype("float8_e4m3")), F32_CLASSES])
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16)
    with np.errstate(invalid="ignore"):  # NaN halves: NumPy's cast warns, and keeps them
        wide = halves.astype(np.float64)
    bf16 = np.unique(wide[np.isfinite(wide)])
    ties = ((bf16[:-1] + bf16[1:]) / 2).astype(np.float32)  # bfloat16's own ties
    re = np.concatenate([parts, ties])
    x = np.empty(re.size, np.complex64)
    x.real, x.imag = re, re[::-1]  # every class in each part, and mixed pairs
    with np.errstate(all="ignore"):
        want = x.astype(row.numpy)

    got = tb.to_numpy(torch.from_numpy(x), dtype="bcomplex32")

    assert got.dtype == row.numpy and bytes_of(got) == bytes_of(want)
    back = tb.to_torch(got, dtype=torch.complex64)  # complex64 holds it exactly
    with np.errstate(all="ignore"):
        assert bytes_of(back.numpy()) == bytes_of(got.astype(np.complex64))
    with pytest.raises(tb.UnsupportedDtypeError, match="would discard the imaginary part"):
        tb.to_numpy(torch.from_numpy(x), dtype="float8_e4m3")


def test_numpy_only_arrays_need_dtype_and_cast_with_ml_dtypes(
    numpy_only_row: tb.DTypeRow,
) -> None:
    row = numpy_only_row
    a = (
        np.arange(64, dtype=np.uint8).view(row.numpy)
        if row.itemsize == 1
        else np.ones(4, row.numpy)
    )
    wide = torch.complex64 if row.category == "complex" else torch.float32
    with pytest.raises(tb.UnsupportedDtypeError, match=f"ml_dtypes {row.name} has no torch dtype"):
        tb.to_torch(a)

    t = tb.to_torch(a, dtype=wide)

    with np.errstate(all="ignore"):
        assert bytes_of(t.numpy()) == bytes_of(a.astype(tb.numpy_dtype(wide)))
    assert not np.shares_memory(t.numpy(), a)
    with pytest.raises(tb.CopyRequiredError, match=f"is {row.name} and a cast to"):
        tb.to_torch(a, dtype=wide, copy=False)
    other = next(r for r in NUMPY_ONLY_ROWS if r is not row)
    with pytest.raises(tb.UnsupportedDtypeError, match=f"ml_dtypes {other.name} has no torch"):
        tb.to_torch(a, dtype=other.numpy)  # no torch tensor can hold the target
    assert tb.to_numpy(a) is a  # NumPy's own business: a view
    assert not np.shares_memory(tb.to_numpy(a, copy=True), a)
    d = describe(a)
    assert d.torch_dtype is None and d.numpy_dtype == row.name and d.to_torch.verdict == "error"
    assert d.dtype_note is not None and "has no torch dtype; pass dtype=torch." in d.dtype_note
    tree = tb.tree_to_torch({"x": a}, float_dtype=torch.float32) if row.is_floating else None
    if tree is not None:
        assert tree["x"].dtype is torch.float32
        with pytest.raises(tb.UnsupportedDtypeError, match=r"at \['x'\]: ml_dtypes"):
            tb.tree_to_torch({"x": a})


def test_float4_keeps_its_packing_and_widens_like_the_others() -> None:
    a = np.array([0.5, -6.0, 3.0, 0.0], ml_dtypes.float4_e2m1fn)
    packed = tb.to_torch(a, dtype=torch.float4_e2m1fn_x2)
    assert packed.dtype is torch.float4_e2m1fn_x2 and tensor_bytes(packed) == bytes([0xF1, 0x05])
    assert tb.to_numpy(packed, dtype=ml_dtypes.float4_e2m1fn).tobytes() == a.tobytes()
    assert tb.to_torch(a, dtype=torch.bfloat16).tolist() == [0.5, -6.0, 3.0, 0.0]
    back = tb.to_numpy(torch.tensor([0.5, -6.0, 3.0, 0.0]), dtype=ml_dtypes.float4_e2m1fn)
    assert back.tobytes() == a.tobytes()


# --- DLPack -----------------------------------------------------------------------------------


class Producer:
    """A foreign array: its memory through ``__dlpack__`` only (forwarded from ``inner``)."""

    def __init__(self, inner: Any, read_only: bool = False, versioned: bool = True) -> None:
        self.inner, self.read_only, self.versioned = inner, read_only, versioned

    def __dlpack__(self, *, max_version: Any = None, **kwargs: Any) -> Any:
        if not self.versioned:
            return self.inner.__dlpack__()
        capsule = self.inner.__dlpack__(max_version=max_version)
        return mark_read_only(capsule) if self.read_only else capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return tuple(self.inner.__dlpack_device__())  # type: ignore[return-value]


@subbyte
def test_a_producers_int8_stays_int8_and_the_tensor_keeps_its_dtype(row: tb.DTypeRow) -> None:
    t = every_byte_tensor(row)
    byte = np.int8 if row.category == "int" else np.uint8

    foreign = tb.to_numpy(Producer(t))  # DLPack says int8 / uint8: nothing more is known

    assert foreign.dtype == byte and data_address(foreign) == t.data_ptr()
    assert tb.to_torch(Producer(t)).dtype is tb.torch_dtype(byte)
    assert tb.to_numpy(t).dtype == row.numpy  # handed the tensor, tensorbridge knows it


def converted(make: Any, numpy_route: bool, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> Any:
    """``to_numpy`` of a producer over ``make()``'s memory, by one route; what can differ."""
    copy = kw.pop("copy", None)
    monkeypatch.setattr(dlpack, "NUMPY_ROUTE", numpy_route)
    through_torch = []
    importer = torch.utils.dlpack.from_dlpack
    monkeypatch.setattr(
        torch.utils.dlpack, "from_dlpack", lambda c: through_torch.append(1) or importer(c)
    )
    t = make()
    got = tb.to_numpy(Producer(t, **kw), copy=copy)
    assert through_torch == ([] if numpy_route else [1])  # the route asked for was taken
    shared = data_address(got) == t.data_ptr()
    return got.dtype, got.tobytes(), got.strides, got.flags.writeable, shared


ROUTE_ROWS = [r for r in ROWS if not r.carried]  # NumPy's own types: every NumPy 2 imports
ROUTE_CASES = [{}, {"read_only": True}, {"versioned": False}, {"copy": True}]


@pytest.mark.skipif(
    NUMPY < (2, 1), reason="np.from_dlpack reads DLPack 1.0 capsules from NumPy 2.1"
)
@pytest.mark.parametrize("row", ROUTE_ROWS, ids=lambda r: r.name)
@pytest.mark.parametrize("kw", ROUTE_CASES, ids=str)
def test_numpys_route_and_the_own_route_give_the_same_array(
    row: tb.DTypeRow, kw: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = make_patterns(row)[:300]
    own = converted(lambda: torch.from_numpy(source.copy()), False, monkeypatch, **kw)
    numpys = converted(lambda: torch.from_numpy(source.copy()), True, monkeypatch, **kw)
    assert own == numpys and own[0] == row.numpy and own[1] == source.tobytes()


@pytest.mark.skipif(
    not NUMPY_DLPACK_EXTENDED,
    reason="np.from_dlpack imports bfloat16, float8 and complex32 from NumPy 2.5 with "
    f"ml_dtypes 0.7; this stack has NumPy {np.__version__}, so only the own route runs",
)
@pytest.mark.parametrize("row", [r for r in ROWS if r.carried and r.kernels], ids=lambda r: r.name)
@pytest.mark.parametrize("kw", ROUTE_CASES, ids=str)
def test_the_routes_agree_on_the_ml_dtypes_types_where_numpy_imports_them(
    row: tb.DTypeRow, kw: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = make_patterns(row)[:300]
    own = converted(lambda: tb.to_torch(source.copy()), False, monkeypatch, **kw)
    numpys = converted(lambda: tb.to_torch(source.copy()), True, monkeypatch, **kw)
    assert own == numpys and own[0] == row.numpy and own[1] == source.tobytes()


class Relabelled:
    """Exports ``inner`` with its DLPack type code replaced by ``code`` (a foreign type)."""

    def __init__(self, inner: torch.Tensor, code: int, read_only: bool = False) -> None:
        self.inner, self.code, self.read_only = inner, code, read_only

    def __dlpack__(self, *, max_version: Any = None, **kwargs: Any) -> Any:
        capsule = self.inner.__dlpack__(max_version=(1, 0))
        ctypes.c_uint8.from_address(_pointer(capsule, VERSIONED) + DTYPE_OFFSET).value = self.code
        return mark_read_only(capsule) if self.read_only else capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return tuple(self.inner.__dlpack_device__())  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("name", "code", "carrier"),
    [("float8_e3m4", 7, torch.uint8), ("float8_e4m3", 8, torch.uint8),
     ("float8_e4m3b11fnuz", 9, torch.uint8), ("bcomplex32", 18, torch.int32)],
)  # fmt: skip
def test_a_capsule_of_a_type_torch_lacks_arrives_as_its_ml_dtypes_array(
    name: str, code: int, carrier: torch.dtype
) -> None:
    # the (code, bits) ml_dtypes registers with NumPy 2.5's importer, read on every stack
    if not hasattr(ml_dtypes, name):
        pytest.skip(reason=f"this ml_dtypes has no {name}")
    row = tb.resolve_dtype(name)
    t = torch.arange(64 // row.itemsize, dtype=carrier)

    a = tb.to_numpy(Relabelled(t, code))

    assert a.dtype == row.numpy and data_address(a) == t.data_ptr() and a.flags.writeable
    assert a.tobytes() == tensor_bytes(t)
    ro = tb.to_numpy(Relabelled(t, code, read_only=True))
    assert data_address(ro) == t.data_ptr() and not ro.flags.writeable
    wide = tb.to_numpy(Relabelled(t, code), dtype=np.complex64 if row.itemsize == 4 else np.float32)
    with np.errstate(all="ignore"):
        assert bytes_of(wide) == bytes_of(a.astype(wide.dtype))
    with pytest.raises(tb.UnsupportedDtypeError, match=f"ml_dtypes {name} has no torch dtype"):
        tb.to_torch(Relabelled(t, code))


@pytest.mark.parametrize("tdt", SHELLS, ids=str)
def test_a_shell_tensor_is_copied_and_moved_as_its_bytes(tdt: torch.dtype) -> None:
    t = torch.from_numpy(EVERY_BYTE.copy()).view(tdt)
    c = tb.to_torch(t, copy=True)
    assert c.dtype is tdt and c.data_ptr() != t.data_ptr() and tensor_bytes(c) == bytes(range(256))
    moved = tb.to_torch(t, device="meta")
    assert moved.dtype is tdt and moved.device.type == "meta"


def test_a_capsule_numpy_refuses_falls_back_to_the_own_route(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(x: Any) -> Any:
        raise BufferError("maxdims of DLPack tensor is higher than the supported maxdims.")

    monkeypatch.setattr(dlpack, "NUMPY_ROUTE", True)
    monkeypatch.setattr(np, "from_dlpack", refuse)  # np.from_dlpack leaves the capsule unused
    t = torch.arange(6.0)

    a = tb.to_numpy(Producer(t))

    assert a.tolist() == t.tolist() and data_address(a) == t.data_ptr()
