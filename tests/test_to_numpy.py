"""``tb.to_numpy``: bit-exact, zero-copy by default, one copy only when it must, clear errors.

Every test asserts behaviour: bytes, dtype, shared addresses, strides, or the exact
exception class and its message. Parametrized over the dtype table through ``row``.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorbridge as tb
from _budget import examples
from conftest import ROWS, data_address, make_patterns, tensor_bytes, tensor_from_bytes
from tensorbridge._versions import torch_e4m3fn_saturates

COMPLEX_ROWS = [r for r in ROWS if r.category == "complex"]


def needs_row(dtype: torch.dtype) -> None:
    """Skip where the installed ml_dtypes has no NumPy dtype for ``dtype`` (complex32: 0.7)."""
    if dtype not in {r.torch for r in ROWS}:
        pytest.skip(reason=f"this ml_dtypes has no NumPy dtype for {dtype}")


SMALL_FLOAT_ROWS = [r for r in ROWS if r.category == "float" and r.itemsize <= 2]
FLOAT4_X2 = getattr(torch, "float4_e2m1fn_x2", None)
FLOAT4 = getattr(ml_dtypes, "float4_e2m1fn", None)

# torch 2.13 deprecates creating quantized tensors and says so once per process.
quantized_warning = pytest.mark.filterwarnings(
    "ignore:torch.quantize_per_tensor, torch.quantize_per_channel:UserWarning"
)


def _tensor(row: tb.DTypeRow, n: int = 24) -> torch.Tensor:
    """A 1-D tensor of ``row``'s dtype holding ``n`` of its test patterns (torch alone)."""
    return tensor_from_bytes(np.resize(make_patterns(row), n).tobytes(), row)


def _fill_bytes(t: torch.Tensor, value: int) -> None:
    t.view(torch.uint8).fill_(value)


# --- bits --------------------------------------------------------------------------------------


def test_every_pattern_round_trips_bit_exact_and_shared(
    row: tb.DTypeRow, patterns: np.ndarray
) -> None:
    raw = patterns.tobytes()
    t = tensor_from_bytes(raw, row)

    a = tb.to_numpy(t)

    assert type(a) is np.ndarray
    assert a.dtype == row.numpy
    assert a.shape == tuple(t.shape)
    assert a.tobytes() == raw  # NaN payloads included: bytes, not values
    assert data_address(a) == t.data_ptr()

    back = tb.to_torch(a)
    assert back.dtype is row.torch
    assert tensor_bytes(back) == raw
    assert back.data_ptr() == t.data_ptr()


def test_copy_true_round_trip_is_bit_exact_and_independent(
    row: tb.DTypeRow, patterns: np.ndarray
) -> None:
    raw = patterns.tobytes()
    t = tensor_from_bytes(raw, row)

    a = tb.to_numpy(t, copy=True)
    back = tb.to_torch(a, copy=True)

    assert a.dtype == row.numpy and a.tobytes() == raw
    assert back.dtype is row.torch and tensor_bytes(back) == raw
    assert not np.shares_memory(a, tb.to_numpy(t))
    assert back.data_ptr() not in (t.data_ptr(), data_address(a))


def test_two_dimensional_patterns_keep_layout(row: tb.DTypeRow, patterns: np.ndarray) -> None:
    t = tensor_from_bytes(np.resize(patterns, 4 * 64).tobytes(), row, (4, 64))

    a = tb.to_numpy(t)

    assert a.shape == (4, 64)
    assert a.strides == (64 * row.itemsize, row.itemsize)
    assert a.tobytes() == tensor_bytes(t)


# --- memory sharing and copy= ------------------------------------------------------------------


def test_shares_memory_by_default_both_ways_of_writing(row: tb.DTypeRow) -> None:
    t = _tensor(row)
    a = tb.to_numpy(t)

    _fill_bytes(t, 1)
    assert a.tobytes() == b"\x01" * a.nbytes  # a write to the tensor shows in the array

    a.view(np.uint8)[:] = 0
    assert tensor_bytes(t) == b"\x00" * a.nbytes  # and the other way round


def test_copy_false_shares_when_possible(row: tb.DTypeRow) -> None:
    t = _tensor(row)

    a = tb.to_numpy(t, copy=False)

    assert data_address(a) == t.data_ptr()
    assert a.tobytes() == tensor_bytes(t)


def test_dtype_equal_to_source_is_not_a_cast(row: tb.DTypeRow) -> None:
    t = _tensor(row)

    for spec in (row.numpy, row.torch, row.name):
        a = tb.to_numpy(t, dtype=spec, copy=False)
        assert data_address(a) == t.data_ptr()
        assert a.dtype == row.numpy


def test_copy_true_is_independent(row: tb.DTypeRow) -> None:
    t = _tensor(row)
    before = tensor_bytes(t)

    a = tb.to_numpy(t, copy=True)
    assert a.tobytes() == before

    a.view(np.uint8)[:] = 0
    assert tensor_bytes(t) == before  # writing the copy leaves the tensor alone

    _fill_bytes(t, 1)
    assert a.tobytes() == b"\x00" * a.nbytes  # and writing the tensor leaves the copy alone


@pytest.mark.parametrize("crow", COMPLEX_ROWS, ids=lambda r: r.name)
def test_conjugate_bit_is_resolved_by_a_copy(crow: tb.DTypeRow) -> None:
    z = torch.tensor([1 + 2j, -3.5 - 4j, 0.25j], dtype=torch.complex64).to(crow.torch)
    zc = z.conj()
    assert zc.is_conj()

    a = tb.to_numpy(zc)

    assert a.dtype == crow.numpy
    assert a.tobytes() == tensor_bytes(zc)  # tensor_bytes resolves the bit through torch
    np.testing.assert_array_equal(a.astype(np.complex128), [1 - 2j, -3.5 + 4j, -0.25j])
    assert data_address(a) != z.data_ptr()

    with pytest.raises(tb.CopyRequiredError, match=r"conjugate or negative bit") as info:
        tb.to_numpy(zc, copy=False)
    assert isinstance(info.value, ValueError)
    assert "to_numpy(copy=False) cannot share memory" in str(info.value)
    assert "pass copy=None" in str(info.value)


@pytest.mark.parametrize("crow", COMPLEX_ROWS, ids=lambda r: r.name)
def test_negative_bit_gives_the_right_sign(crow: tb.DTypeRow) -> None:
    # np.from_dlpack(z.conj().imag) ignores the negative bit and returns +imag; we must not.
    z = torch.tensor([1 + 2j, 3 - 4j, -5 + 0.5j], dtype=torch.complex64).to(crow.torch)
    imag = z.conj().imag
    assert imag.is_neg()

    a = tb.to_numpy(imag)

    np.testing.assert_array_equal(a.astype(np.float64), [-2.0, 4.0, -0.5])
    assert a.tobytes() == tensor_bytes(imag)
    with pytest.raises(tb.CopyRequiredError, match=r"conjugate or negative bit"):
        tb.to_numpy(imag, copy=False)


def test_copy_false_refuses_a_cast() -> None:
    t = torch.tensor([1.0, 2.0])

    with pytest.raises(tb.CopyRequiredError) as info:
        tb.to_numpy(t, dtype="bf16", copy=False)

    msg = str(info.value)
    assert "is float32 and a cast to bfloat16 makes new values" in msg
    assert "pass copy=None" in msg


# --- owner lifetime ----------------------------------------------------------------------------


def _churn() -> list[object]:
    """Drop garbage and allocate enough to reuse freed blocks."""
    gc.collect()
    junk: list[object] = [torch.full((4096,), 0xAA, dtype=torch.uint8) for _ in range(64)]
    junk += [np.full(4096, 0x55, np.uint8) for _ in range(64)]
    return junk


def test_array_keeps_the_tensor_memory_alive(row: tb.DTypeRow, patterns: np.ndarray) -> None:
    raw = patterns.tobytes()
    t = tensor_from_bytes(raw, row)
    a = tb.to_numpy(t)
    ro = tb.to_numpy(t, readonly=True)
    step = tb.to_numpy(t[::2])

    del t
    junk = _churn()

    assert a.tobytes() == raw
    assert ro.tobytes() == raw
    assert step.tobytes() == patterns[::2].tobytes()
    assert len(junk) == 128


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.arange(64.0, requires_grad=True),
        lambda: torch.nn.Parameter(torch.arange(64.0).bfloat16()),
        lambda: torch.arange(64.0).reshape(8, 8).t(),
    ],
    ids=["requires_grad", "bf16_parameter", "transposed"],
)
def test_lifetime_of_detached_and_strided_sources(make: Callable[[], torch.Tensor]) -> None:
    t = make()
    expected = tensor_bytes(t)
    a = tb.to_numpy(t)

    del t
    junk = _churn()

    assert a.tobytes() == expected
    assert len(junk) == 128


# --- requires_grad and nn.Parameter ------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.arange(6.0, requires_grad=True),
        lambda: torch.arange(6.0, dtype=torch.bfloat16, requires_grad=True),
        lambda: torch.nn.Parameter(torch.arange(6.0)),
        lambda: torch.nn.Parameter(torch.arange(6.0, dtype=torch.bfloat16)),
        lambda: torch.nn.Buffer(torch.arange(6.0)),
        lambda: torch.arange(6.0).to(torch.complex64).requires_grad_() * 2,
    ],
    ids=["leaf", "bf16_leaf", "parameter", "bf16_parameter", "buffer", "non_leaf"],
)
def test_requires_grad_is_detached_and_shared(make: Callable[[], torch.Tensor]) -> None:
    t = make()
    grad_before = t.requires_grad

    a = tb.to_numpy(t)

    assert type(a) is np.ndarray
    assert a.dtype == tb.numpy_dtype(t.dtype)
    assert data_address(a) == t.data_ptr()
    assert t.requires_grad is grad_before  # the caller's tensor is not changed
    a[0] = 5
    assert t.detach()[0].item() == 5  # still the same memory


# --- strides: views are not materialised -------------------------------------------------------

VIEWS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "transpose": lambda t: t.reshape(4, 6).t(),
    "step_slice": lambda t: t.reshape(4, 6)[::2, 1::3],
    "offset_slice": lambda t: t.reshape(4, 6)[1:, 2:5],
    "permute_3d": lambda t: t.reshape(2, 3, 4).permute(2, 0, 1),
    "diagonal": lambda t: t.reshape(4, 6).diagonal(),
    "expanded": lambda t: t[:6].reshape(6, 1).expand(6, 5),
    "expanded_scalar": lambda t: t[3].expand(3, 4),
    "overlapping": lambda t: t.as_strided((5, 4), (3, 1)),
}


@pytest.mark.parametrize("view", VIEWS, ids=str)
def test_views_keep_their_strides(row: tb.DTypeRow, view: str) -> None:
    base = _tensor(row)
    v = VIEWS[view](base)

    a = tb.to_numpy(v)

    assert a.shape == tuple(v.shape)
    assert a.strides == tuple(s * row.itemsize for s in v.stride())
    assert data_address(a) == v.data_ptr()  # no materialisation
    assert a.tobytes() == tensor_bytes(v)
    if view.startswith("expanded"):
        assert 0 in a.strides

    back = tb.to_torch(a)
    assert back.stride() == v.stride()
    assert back.data_ptr() == v.data_ptr()


def test_copy_true_of_an_expanded_tensor_materialises_it() -> None:
    t = torch.arange(3.0).reshape(3, 1).expand(3, 4)

    a = tb.to_numpy(t, copy=True)

    assert 0 not in a.strides
    a[0, 0] = 9
    assert a[0, 1] == 0 and t[0, 0] == 0


# --- readonly= ---------------------------------------------------------------------------------


def test_readonly_view_cannot_be_written_and_still_shares(row: tb.DTypeRow) -> None:
    t = _tensor(row)

    a = tb.to_numpy(t, readonly=True)

    assert not a.flags.writeable
    assert data_address(a) == t.data_ptr()
    with pytest.raises(ValueError, match="read-only"):
        a[0] = a[1]
    _fill_bytes(t, 1)
    assert a.tobytes() == b"\x01" * a.nbytes  # a live view of the tensor
    assert tb.to_numpy(t).flags.writeable  # the tensor itself was not changed


@pytest.mark.parametrize(
    "kwargs", [{"copy": True}, {"dtype": np.float64}, {"copy": False}], ids=str
)
def test_readonly_combines_with_copy_and_dtype(kwargs: dict[str, object]) -> None:
    t = torch.arange(6.0).reshape(2, 3).t()

    a = tb.to_numpy(t, readonly=True, **kwargs)  # type: ignore[arg-type]

    assert not a.flags.writeable
    np.testing.assert_array_equal(a, t.numpy())
    with pytest.raises(ValueError, match="read-only"):
        a[0, 0] = 1


# --- out= --------------------------------------------------------------------------------------


def test_out_same_dtype_returns_out(row: tb.DTypeRow) -> None:
    t = _tensor(row).reshape(4, 6)
    out = np.empty((4, 6), row.numpy)

    r = tb.to_numpy(t, out=out)

    assert r is out
    assert out.tobytes() == tensor_bytes(t)
    assert data_address(out) != t.data_ptr()


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        (torch.bfloat16, np.float32),
        (torch.float32, ml_dtypes.bfloat16),
        (torch.float8_e4m3fn, np.float32),
        (torch.float16, np.float64),
        (torch.int32, np.float32),
        (torch.complex32, np.complex64),
    ],
    ids=lambda d: str(np.dtype(d)) if not isinstance(d, torch.dtype) else str(d),
)
def test_out_casts_with_torchs_kernel(src: torch.dtype, dst: object) -> None:
    needs_row(src)
    t = torch.tensor([[0.1, -2.5, 1e3], [448.0, 3.0, -0.0]]).to(src)
    out = np.zeros((2, 3), dst)
    expected = t.to(tb.torch_dtype(dst))

    r = tb.to_numpy(t, out=out)

    assert r is out
    assert out.tobytes() == tensor_bytes(expected)


@pytest.mark.parametrize("src", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
@pytest.mark.parametrize("dst", ["f64", "f32", "f16", "bf16"])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "negated"])
def test_float8_casts_give_torchs_bits_for_every_code(
    src: torch.dtype, dst: str, layout: str
) -> None:
    # 2^16 elements: large enough for the float8 fast kernels (table, float16 widening)
    t = torch.arange(256, dtype=torch.uint8).repeat(256).view(src).reshape(256, 256)
    if layout == "transposed":
        t = t.t()
    row = tb.resolve_dtype(dst)
    reference = t.to(row.torch)  # torch's own cast, NaN payloads as torch gives them
    if layout == "negated":
        t = torch._neg_view(t)
        reference = torch._neg_view(reference).resolve_neg()

    a = tb.to_numpy(t, dtype=dst)

    assert a.dtype == row.numpy and a.flags.c_contiguous
    assert a.tobytes() == tb.to_numpy(reference.contiguous()).tobytes()


def test_out_shape_mismatch_raises() -> None:
    with pytest.raises(tb.ShapeMismatchError) as info:
        tb.to_numpy(torch.zeros(4), out=np.empty(3, np.float32))

    assert isinstance(info.value, ValueError)
    assert str(info.value) == (
        "to_numpy: out= has shape (3,) but the source has shape (4,); "
        "pass an out of the source's shape"
    )


def test_out_read_only_raises() -> None:
    out = np.zeros(3, np.float32)
    out.flags.writeable = False

    with pytest.raises(tb.UnsupportedTensorError, match="out= is read-only; pass a writable"):
        tb.to_numpy(torch.ones(3), out=out)
    assert not out.any()


def test_out_non_contiguous_writes_only_its_elements() -> None:
    big = np.zeros((3, 8), np.float32)
    out = big[:, ::2]

    tb.to_numpy(torch.arange(12.0).reshape(3, 4), out=out)

    np.testing.assert_array_equal(big[:, ::2], np.arange(12.0).reshape(3, 4))
    assert not big[:, 1::2].any()


@pytest.mark.parametrize(
    "make_out",
    [lambda: np.zeros(4, np.float32)[::-1], lambda: np.zeros(4, ">f4")],
    ids=["negative_stride", "byte_swapped"],
)
def test_out_layouts_torch_cannot_view(make_out: Callable[[], np.ndarray]) -> None:
    out = make_out()

    r = tb.to_numpy(torch.arange(4.0, dtype=torch.bfloat16), out=out)

    assert r is out
    np.testing.assert_array_equal(out, [0.0, 1.0, 2.0, 3.0])


def test_out_resolves_conjugate_and_negative_bits() -> None:
    z = torch.tensor([1 + 2j, 3 - 4j])
    out_c = np.empty(2, np.complex64)
    out_i = np.empty(2, np.float32)

    tb.to_numpy(z.conj(), out=out_c)
    tb.to_numpy(z.conj().imag, out=out_i)

    np.testing.assert_array_equal(out_c, [1 - 2j, 3 + 4j])
    np.testing.assert_array_equal(out_i, [-2.0, 4.0])


def test_out_with_dtype_casts_to_dtype_first() -> None:
    t = torch.tensor([1.1, 3.3, 1e-3])
    out = np.zeros(3, np.float64)

    tb.to_numpy(t, dtype="bf16", out=out)

    assert out.tobytes() == tensor_bytes(t.to(torch.bfloat16).double())


# --- dtype= casts ------------------------------------------------------------------------------

SPELLINGS = [
    (np.float32, np.float32),
    (np.dtype("float32"), np.float32),
    (torch.float32, np.float32),
    ("float32", np.float32),
    ("f32", np.float32),
    ("fp32", np.float32),
    ("torch.float32", np.float32),
    ("F32", np.float32),
    (ml_dtypes.bfloat16, ml_dtypes.bfloat16),
    (np.dtype(ml_dtypes.bfloat16), ml_dtypes.bfloat16),
    (torch.bfloat16, ml_dtypes.bfloat16),
    ("bfloat16", ml_dtypes.bfloat16),
    ("bf16", ml_dtypes.bfloat16),
    ("BF16", ml_dtypes.bfloat16),
    ("torch.bfloat16", ml_dtypes.bfloat16),
    ("f16", np.float16),
    ("half", np.float16),
    (torch.float16, np.float16),
    ("f64", np.float64),
    ("double", np.float64),
    (torch.float64, np.float64),
    ("float8_e4m3fn", ml_dtypes.float8_e4m3fn),
    (torch.float8_e5m2, ml_dtypes.float8_e5m2),
]


@pytest.mark.parametrize(("spec", "expected"), SPELLINGS, ids=[repr(s) for s, _ in SPELLINGS])
def test_dtype_accepts_numpy_torch_and_names(spec: object, expected: object) -> None:
    t = torch.tensor([1.5, -2.5, 0.0], dtype=torch.float64)  # exact in every target

    a = tb.to_numpy(t, dtype=spec)

    assert a.dtype == np.dtype(expected)  # type: ignore[call-overload]
    np.testing.assert_array_equal(a.astype(np.float64), [1.5, -2.5, 0.0])


@pytest.mark.parametrize("srow", SMALL_FLOAT_ROWS, ids=lambda r: r.name)
def test_upcast_every_pattern_matches_torch(srow: tb.DTypeRow) -> None:
    raw = make_patterns(srow).tobytes()
    t = tensor_from_bytes(raw, srow)

    a = tb.to_numpy(t, dtype=np.float32)

    assert a.dtype == np.float32
    # every pattern, NaN payloads included, bit-identical to torch's own kernel
    assert a.tobytes() == tensor_bytes(t.to(torch.float32))


ONE_BYTE_FLOATS = [r for r in ROWS if r.category == "float" and r.itemsize == 1]
FLOAT_ROWS = [r for r in ROWS if r.category == "float"]


@pytest.mark.parametrize("srow", ONE_BYTE_FLOATS, ids=lambda r: r.name)
@pytest.mark.parametrize("drow", FLOAT_ROWS, ids=lambda r: r.name)
@pytest.mark.parametrize("n", [256, 1 << 20], ids=["small", "1M"])
def test_one_byte_float_casts_match_torch_both_ways(
    srow: tb.DTypeRow, drow: tb.DTypeRow, n: int
) -> None:
    # every pattern, many times over (torch's own bits, whichever kernel or table runs),
    # read strided as well as contiguous
    t = tensor_from_bytes(np.resize(make_patterns(srow), n).tobytes(), srow)
    for x in (t, t.reshape(-1, 16).t()):
        expected = tensor_bytes(x.to(drow.torch).contiguous())

        a = tb.to_numpy(x, dtype=drow.numpy)
        b = tb.to_torch(tb.to_numpy(x), dtype=drow.torch)

        assert a.dtype == drow.numpy
        assert a.flags.c_contiguous or drow is srow  # a cast writes C order; no cast is a view
        assert a.tobytes() == expected
        assert b.dtype == drow.torch and tensor_bytes(b.contiguous()) == expected


def test_complex32_upcast_matches_torch() -> None:
    needs_row(torch.complex32)
    row = tb.resolve_dtype("complex32")
    t = tensor_from_bytes(make_patterns(row).tobytes(), row)

    a = tb.to_numpy(t, dtype=np.complex64)

    assert a.tobytes() == tensor_bytes(t.to(torch.complex64))


def _f32_sources() -> torch.Tensor:
    rng = np.random.default_rng(2)
    bits = rng.integers(0, 1 << 32, 1 << 16, dtype=np.uint64).astype(np.uint32)
    edges = make_patterns(tb.resolve_dtype("float32"))[:19].view(np.uint32)
    near = np.array([448, 464, 480, 57344, 61440, 1e6, 3.4e38, 1e-8, 2**-10], np.float32)
    return torch.from_numpy(np.concatenate([edges, bits, near.view(np.uint32)]).view(np.float32))


NARROW = [r for r in ROWS if r.category == "float" and r.itemsize < 4]


@pytest.mark.parametrize("dst", NARROW, ids=lambda r: r.name)
def test_downcast_is_bit_identical_to_torch(dst: tb.DTypeRow) -> None:
    src = _f32_sources()
    expected = tensor_bytes(src.to(dst.torch))

    a = tb.to_numpy(src, dtype=dst.numpy)
    b = tb.to_numpy(src.numpy(), dtype=dst.name)  # an array given to to_numpy casts the same

    assert a.dtype == dst.numpy and b.dtype == dst.numpy
    # torch's kernel: round-to-nearest-even for every value, NaN included
    assert a.tobytes() == expected
    assert b.tobytes() == expected


def test_nan_and_overflow_follow_torch() -> None:
    # The chosen semantics (torch's kernels, documented in convert.py):
    # * float32 -> bfloat16 turns every NaN, whatever its sign or payload, into 0xFFFF
    #   (ml_dtypes' astype would keep the sign: 0x7FC0 / 0xFFC0);
    # * float8_e4m3fn saturates inf and overflow to ±448 (ml_dtypes gives NaN; so does
    #   torch before 2.13);
    # * float8_e5m2 overflows to ±inf.
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFC00001], np.uint32).view(np.float32)
    big = np.array([np.inf, -np.inf, 1e6, -1e6, 464.0], np.float32)

    bf = tb.to_numpy(torch.from_numpy(nans), dtype="bf16")
    e4 = tb.to_numpy(torch.from_numpy(big), dtype="float8_e4m3fn")
    e5 = tb.to_numpy(torch.from_numpy(big), dtype="float8_e5m2")

    assert bf.view(np.uint16).tolist() == [0xFFFF] * 4
    top = 448.0 if torch_e4m3fn_saturates() else np.nan
    # 464 is half-way between 448 and 480 (the NaN pattern): ties to even give 448 either way
    np.testing.assert_array_equal(e4.astype(np.float32), [top, -top, top, -top, 448.0])
    assert e4.tobytes() == tensor_bytes(torch.from_numpy(big).to(torch.float8_e4m3fn))
    assert e5.astype(np.float32).tolist() == [np.inf, -np.inf, np.inf, -np.inf, 448.0]


def test_unknown_dtype_name_lists_the_known_ones() -> None:
    with pytest.raises(tb.UnsupportedDtypeError) as info:
        tb.to_numpy(torch.ones(2), dtype="bfloat17")

    msg = str(info.value)
    assert msg.startswith("'bfloat17' is not a dtype; pass a torch dtype, a NumPy dtype or a name")
    assert "bfloat16" in msg and "float8_e4m3fn" in msg


# --- packed fp4 --------------------------------------------------------------------------------


@pytest.fixture
def fp4() -> None:
    if FLOAT4_X2 is None or FLOAT4 is None:
        pytest.skip(reason="needs torch.float4_e2m1fn_x2 and ml_dtypes.float4_e2m1fn")


@pytest.mark.usefixtures("fp4")
def test_fp4_unpacks_every_byte_low_nibble_first() -> None:
    packed = np.arange(256, dtype=np.uint8).reshape(2, 128)
    t = torch.from_numpy(packed.copy()).view(FLOAT4_X2)  # type: ignore[arg-type]

    u = tb.to_numpy(t, dtype=FLOAT4)

    assert u.dtype == np.dtype(FLOAT4) and u.shape == (2, 256)
    nibbles = u.view(np.uint8)
    np.testing.assert_array_equal(nibbles[:, 0::2], packed & 0x0F)  # element 2i: low nibble
    np.testing.assert_array_equal(nibbles[:, 1::2], packed >> 4)  # element 2i+1: high nibble

    repacked = tb.to_torch(u, dtype=FLOAT4_X2)
    assert repacked.dtype is FLOAT4_X2 and tuple(repacked.shape) == (2, 128)
    assert tensor_bytes(repacked) == packed.tobytes()


@pytest.mark.usefixtures("fp4")
def test_fp4_golden_values() -> None:
    # 0x21: low nibble 0b0001 = 0.5, high nibble 0b0010 = 1.0;
    # 0xF7: low 0b0111 = 6.0, high 0b1111 = -6.0
    t = torch.tensor([[0x21, 0xF7]], dtype=torch.uint8).view(FLOAT4_X2)  # type: ignore[arg-type]

    unpacked = tb.to_numpy(t, dtype=FLOAT4)
    widened = tb.to_numpy(t, dtype=np.float32)

    assert unpacked.astype(np.float32).tolist() == [[0.5, 1.0, 6.0, -6.0]]
    assert widened.dtype == np.float32 and widened.tolist() == [[0.5, 1.0, 6.0, -6.0]]


@pytest.mark.usefixtures("fp4")
def test_fp4_without_dtype_names_the_fix() -> None:
    t = torch.zeros(2, 2, dtype=torch.uint8).view(FLOAT4_X2)  # type: ignore[arg-type]

    with pytest.raises(tb.UnsupportedDtypeError) as info:
        tb.to_numpy(t)

    msg = str(info.value)
    assert isinstance(info.value, TypeError)
    assert "torch.float4_e2m1fn_x2 packs two values a byte and has no NumPy dtype" in msg
    assert "dtype=ml_dtypes.float4_e2m1fn" in msg
    assert "tensor.view(torch.uint8)" in msg


@pytest.mark.usefixtures("fp4")
def test_fp4_unpacking_is_a_copy() -> None:
    t = torch.zeros(2, 2, dtype=torch.uint8).view(FLOAT4_X2)  # type: ignore[arg-type]

    with pytest.raises(
        tb.CopyRequiredError, match=r"is packed float4_e2m1fn_x2 \(unpacking makes a new"
    ):
        tb.to_numpy(t, dtype=FLOAT4, copy=False)


@pytest.mark.usefixtures("fp4")
def test_fp4_zero_dimensional_and_empty() -> None:
    scalar = torch.tensor(0x21, dtype=torch.uint8).view(FLOAT4_X2)  # type: ignore[arg-type]
    empty = torch.empty(3, 0, dtype=torch.uint8).view(FLOAT4_X2)  # type: ignore[arg-type]

    with pytest.raises(tb.ShapeMismatchError) as info:
        tb.to_numpy(scalar, dtype=FLOAT4)
    assert str(info.value) == (
        "unpacking float4_e2m1fn_x2 doubles the last dimension, but the tensor is 0-d; "
        "pass t.reshape(1)"
    )
    assert tb.to_numpy(scalar.reshape(1), dtype=np.float32).tolist() == [0.5, 1.0]
    assert tb.to_numpy(empty, dtype=FLOAT4).shape == (3, 0)


# --- quantized ---------------------------------------------------------------------------------


@quantized_warning
@pytest.mark.parametrize("qdtype", [torch.qint8, torch.quint8, torch.qint32], ids=str)
def test_quantized_dequantizes_with_dtype_float32(qdtype: torch.dtype) -> None:
    q = torch.quantize_per_tensor(torch.tensor([0.0, 1.0, 2.5, 12.0]), 0.1, 3, qdtype)

    a = tb.to_numpy(q, dtype=np.float32)

    assert a.dtype == np.float32
    assert a.tobytes() == tensor_bytes(q.dequantize())
    np.testing.assert_allclose(a, [0.0, 1.0, 2.5, 12.0], rtol=1e-6)


@quantized_warning
def test_quantized_per_channel_dequantizes() -> None:
    x = torch.tensor([[1.0, -2.0], [3.0, 4.0]])
    q = torch.quantize_per_channel(
        x, torch.tensor([0.5, 0.25]), torch.tensor([0, 1]), 0, torch.qint8
    )

    a = tb.to_numpy(q, dtype=np.float32)

    assert a.tobytes() == tensor_bytes(q.dequantize())


@quantized_warning
def test_quantized_without_dtype_names_both_fixes() -> None:
    q = torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8)

    with pytest.raises(tb.UnsupportedDtypeError) as info:
        tb.to_numpy(q)

    assert isinstance(info.value, TypeError)
    assert str(info.value) == (
        "quantized torch.qint8 has no NumPy dtype; pass dtype=np.float32 to dequantize, "
        "or convert tensor.int_repr() for the raw integers"
    )
    with pytest.raises(tb.CopyRequiredError, match=r"is quantized \(dequantizing makes new"):
        tb.to_numpy(q, dtype=np.float32, copy=False)


# --- tensors with no data, subclasses, other inputs --------------------------------------------


def test_meta_tensor_has_no_data() -> None:
    t = torch.empty(2, 3, device="meta", dtype=torch.bfloat16)

    with pytest.raises(tb.NoDataError) as info:
        tb.to_numpy(t)

    assert isinstance(info.value, tb.UnsupportedTensorError)
    assert isinstance(info.value, TypeError)
    assert str(info.value).startswith(
        "a meta tensor (torch.bfloat16, shape (2, 3)) holds no data; materialise it first"
    )


def test_fake_tensor_has_no_data() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        t = torch.empty(4)

    with pytest.raises(tb.NoDataError) as info:
        tb.to_numpy(t)
    assert str(info.value) == (
        "a FakeTensor (torch.float32, shape (4,)) holds no data; "
        "convert the real tensor it stands for"
    )


class _Unknown(torch.Tensor):
    pass


def test_unknown_subclass_is_refused() -> None:
    t = torch.ones(3).as_subclass(_Unknown)

    with pytest.raises(tb.UnsupportedTensorError) as info:
        tb.to_numpy(t)

    msg = str(info.value)
    assert "tensor subclass test_to_numpy._Unknown may not keep its values in its storage" in msg
    assert "x.as_subclass(torch.Tensor)" in msg
    assert tb.to_numpy(t.as_subclass(torch.Tensor)).tolist() == [1.0, 1.0, 1.0]


def test_non_tensor_input_is_refused() -> None:
    with pytest.raises(tb.UnsupportedTensorError) as info:
        tb.to_numpy([1.0, 2.0])
    assert str(info.value) == (
        "to_numpy expects a torch.Tensor, got list; pass tb.tree_to_numpy(x) for a dict or "
        "list of tensors, torch.as_tensor(x) for other array-likes"
    )


@pytest.mark.parametrize(
    ("dtype", "fix"),
    [
        ("bits8", "tensor.view(torch.uint8)"),
        ("bits16", "tensor.view(torch.uint8)"),
        ("uint3", "pass dtype=np.uint8 for its bytes as torch holds them"),
        ("int3", "pass dtype=np.int8 for its bytes as torch holds them"),
    ],
)
def test_tensor_of_an_unsupported_dtype_is_refused(dtype: str, fix: str) -> None:
    tdt = getattr(torch, dtype, None)
    if tdt is None:
        pytest.skip(reason=f"this torch has no torch.{dtype}")
    t = torch.empty(4, dtype=tdt)

    with pytest.raises(tb.UnsupportedDtypeError) as info:
        tb.to_numpy(t)

    assert f"torch.{dtype} has no NumPy dtype" in str(info.value)
    assert fix in str(info.value)


def test_numpy_input_follows_the_same_contract() -> None:
    a = np.arange(6.0, dtype=np.float32)

    assert tb.to_numpy(a) is a
    copied = tb.to_numpy(a, copy=True)
    assert not np.shares_memory(copied, a)
    ro = tb.to_numpy(a, readonly=True)
    assert np.shares_memory(ro, a) and not ro.flags.writeable
    with pytest.raises(tb.CopyRequiredError, match="is float32 and a cast to bfloat16"):
        tb.to_numpy(a, dtype="bf16", copy=False)


# --- sparse ------------------------------------------------------------------------------------

DENSE = torch.tensor(
    [[0.0, 1.5, 0.0, 0.0], [-2.0, 0.0, 0.0, 3.25], [0.0, 0.0, 0.0, 0.0], [4.0, 0.0, 5.0, 0.0]],
    dtype=torch.float64,
)


def _coo(dense: torch.Tensor) -> torch.Tensor:
    idx = dense.nonzero().t().contiguous()
    vals = dense[idx[0], idx[1]]
    return torch.sparse_coo_tensor(idx, vals, dense.shape, check_invariants=True).coalesce()


SPARSE: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], str, Callable]] = {  # type: ignore[type-arg]
    "coo": (_coo, "coo_array", lambda t: [t.values(), t.indices()]),
    "csr": (
        lambda d: d.to_sparse_csr(),
        "csr_array",
        lambda t: [t.values(), t.col_indices(), t.crow_indices()],
    ),
    "csc": (
        lambda d: d.to_sparse_csc(),
        "csc_array",
        lambda t: [t.values(), t.row_indices(), t.ccol_indices()],
    ),
    "bsr": (
        lambda d: d.to_sparse_bsr((2, 2)),
        "bsr_array",
        lambda t: [t.values(), t.col_indices(), t.crow_indices()],
    ),
}


def _scipy_parts(s: object) -> list[np.ndarray]:
    if hasattr(s, "coords"):
        return [s.data, *s.coords]  # type: ignore[attr-defined]
    if hasattr(s, "row"):  # scipy < 1.13's coo_array
        return [s.data, s.row, s.col]  # type: ignore[attr-defined]
    return [s.data, s.indices, s.indptr]  # type: ignore[attr-defined]


@pytest.mark.parametrize("layout", SPARSE, ids=str)
@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.complex64], ids=str)
def test_sparse_to_matching_scipy_array_sharing_memory(layout: str, dtype: torch.dtype) -> None:
    sp = pytest.importorskip("scipy.sparse", reason="sparse conversion needs scipy")
    make, cls_name, parts = SPARSE[layout]
    t = make(DENSE.to(dtype))

    s = tb.to_numpy(t)

    assert type(s) is getattr(sp, cls_name)
    assert s.dtype == tb.numpy_dtype(dtype)
    assert s.shape == (4, 4)
    assert s.toarray().tobytes() == tensor_bytes(DENSE.to(dtype))
    pairs = list(zip(_scipy_parts(s), parts(t), strict=False))  # COO: 2 coords, 1 index tensor
    shared = [np.shares_memory(a, tb.to_numpy(p)) for a, p in pairs]
    # values always; indices whenever scipy keeps torch's int64 indices (it does here)
    assert shared[0]
    assert any(shared[1:])

    c = tb.to_numpy(t, copy=True)
    pairs = list(zip(_scipy_parts(c), parts(t), strict=False))
    assert not any(np.shares_memory(a, tb.to_numpy(p)) for a, p in pairs)
    assert (c != s).nnz == 0


def test_uncoalesced_coo_sums_duplicates_like_torch() -> None:
    pytest.importorskip("scipy.sparse", reason="sparse conversion needs scipy")
    idx = torch.tensor([[0, 0, 1], [1, 1, 0]])
    t = torch.sparse_coo_tensor(idx, torch.tensor([1.0, 2.0, 4.0]), (2, 2), check_invariants=True)

    s = tb.to_numpy(t)

    np.testing.assert_array_equal(s.toarray(), t.to_dense().numpy())


@pytest.mark.parametrize(
    ("dtype", "wide"),
    [
        (torch.bfloat16, np.float32),
        (torch.float8_e4m3fn, np.float32),
        (torch.complex32, np.complex64),
    ],
    ids=["bfloat16", "float8_e4m3fn", "complex32"],
)
def test_sparse_extended_dtype_needs_a_wider_dtype(dtype: torch.dtype, wide: type) -> None:
    pytest.importorskip("scipy.sparse", reason="sparse conversion needs scipy")
    needs_row(dtype)
    dense = DENSE.to(dtype)
    coo = _coo(DENSE)  # built in float64: torch cannot find nonzeros of float8
    t = torch.sparse_coo_tensor(
        coo.indices(), coo.values().to(dtype), coo.shape, check_invariants=True
    )

    with pytest.raises(tb.UnsupportedDtypeError) as info:
        tb.to_numpy(t)
    assert str(info.value) == (
        f"scipy.sparse cannot hold {dtype} values; pass dtype=np.{wide.__name__} "
        f"(lossless for {str(dtype).removeprefix('torch.')})"
    )

    s = tb.to_numpy(t, dtype=wide)
    assert s.dtype == wide
    assert s.toarray().tobytes() == tensor_bytes(dense.to(tb.torch_dtype(wide)))


def test_sparse_with_dense_dimensions_is_refused() -> None:
    pytest.importorskip("scipy.sparse", reason="sparse conversion needs scipy")
    t = torch.ones(3, 2).to_sparse(sparse_dim=1)

    with pytest.raises(tb.UnsupportedTensorError, match=r"1 dense dimension\(s\); pass x.to_dense"):
        tb.to_numpy(t)


# --- nested ------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", [torch.jagged, torch.strided], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_nested_tensor_becomes_a_list_of_arrays(layout: torch.layout, dtype: torch.dtype) -> None:
    parts = [torch.arange(3.0).to(dtype), torch.arange(5.0).to(dtype) - 7]
    nt = torch.nested.nested_tensor(parts, layout=layout)

    arrays = tb.to_numpy(nt)

    assert isinstance(arrays, list) and len(arrays) == 2
    for a, p, c in zip(arrays, parts, nt.unbind(), strict=True):
        assert a.dtype == tb.numpy_dtype(dtype)
        assert a.tobytes() == tensor_bytes(p)
        assert data_address(a) == c.data_ptr()  # a view of the nested tensor's buffer

    copies = tb.to_numpy(nt, copy=True)
    assert all(data_address(a) != c.data_ptr() for a, c in zip(copies, nt.unbind(), strict=True))


def test_nested_tensor_requiring_grad() -> None:
    nt = torch.nested.nested_tensor(
        [torch.arange(2.0), torch.arange(4.0)], layout=torch.jagged, requires_grad=True
    )

    arrays = tb.to_numpy(nt)

    assert [a.tolist() for a in arrays] == [[0.0, 1.0], [0.0, 1.0, 2.0, 3.0]]
    assert nt.requires_grad


# --- 0-d and empty -----------------------------------------------------------------------------


def test_zero_dimensional(row: tb.DTypeRow, patterns: np.ndarray) -> None:
    t = tensor_from_bytes(patterns[1:2].tobytes(), row, ())

    a = tb.to_numpy(t)

    assert type(a) is np.ndarray and a.shape == () and a.dtype == row.numpy
    assert a.tobytes() == patterns[1:2].tobytes()
    assert data_address(a) == t.data_ptr()
    back = tb.to_torch(a)
    assert back.shape == () and tensor_bytes(back) == a.tobytes()


@pytest.mark.parametrize("shape", [(0,), (2, 0, 3)], ids=str)
def test_empty(row: tb.DTypeRow, shape: tuple[int, ...]) -> None:
    t = torch.empty(shape, dtype=row.torch)

    a = tb.to_numpy(t)
    c = tb.to_numpy(t, copy=True)

    assert a.shape == shape and a.dtype == row.numpy and a.size == 0
    assert c.shape == shape and c.dtype == row.numpy
    back = tb.to_torch(a)
    assert tuple(back.shape) == shape and back.dtype is row.torch


# --- accelerators ------------------------------------------------------------------------------


@pytest.fixture
def cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip(reason="needs a CUDA device")
    return torch.device("cuda")


def test_cuda_tensor_is_copied_bit_exact(
    row: tb.DTypeRow, patterns: np.ndarray, cuda: torch.device
) -> None:
    raw = patterns.tobytes()
    t = tensor_from_bytes(raw, row).to(cuda)

    a = tb.to_numpy(t)

    assert a.dtype == row.numpy and a.tobytes() == raw
    with pytest.raises(tb.CopyRequiredError, match=r"the input is on cuda"):
        tb.to_numpy(t, copy=False)


def test_cuda_cast_and_out(cuda: torch.device) -> None:
    t = torch.linspace(-3, 3, 1000, device=cuda).to(torch.bfloat16)
    out = np.empty(1000, np.float32)

    a = tb.to_numpy(t, dtype=np.float32)
    r = tb.to_numpy(t, out=out)

    assert a.tobytes() == tensor_bytes(t.float())
    assert r is out and out.tobytes() == a.tobytes()


# --- properties over shapes and strides --------------------------------------------------------


@st.composite
def strided_views(draw: st.DrawFn) -> tuple[tb.DTypeRow, torch.Tensor, torch.Tensor]:
    row = draw(st.sampled_from(ROWS))
    shape = draw(st.lists(st.integers(0, 5), max_size=4))
    n = int(np.prod(shape)) if shape else 1
    raw = np.resize(make_patterns(row), max(n, 1))[:n].tobytes()
    base = tensor_from_bytes(raw, row, tuple(shape))
    v = base
    for dim, size in enumerate(shape):
        start = draw(st.integers(0, size))
        step = draw(st.integers(1, 3))
        v = v.narrow(dim, start, size - start)[(slice(None),) * dim + (slice(None, None, step),)]
    if len(shape) >= 2:
        perm = draw(st.permutations(range(len(shape))))
        v = v.permute(*perm)
    if draw(st.booleans()):
        v = v.unsqueeze(0).expand(draw(st.integers(0, 3)), *v.shape)
    return row, base, v


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strided_views())
def test_property_views_round_trip_shared(
    case: tuple[tb.DTypeRow, torch.Tensor, torch.Tensor],
) -> None:
    row, _base, v = case

    a = tb.to_numpy(v)

    assert a.dtype == row.numpy
    assert a.shape == tuple(v.shape)
    assert a.tobytes() == tensor_bytes(v)
    if v.numel():  # an empty tensor's strides and address mean nothing
        assert a.strides == tuple(s * row.itemsize for s in v.stride())
        assert data_address(a) == v.data_ptr()
    back = tb.to_torch(a)
    assert back.dtype is row.torch and tensor_bytes(back) == a.tobytes()
    if v.numel():
        assert back.data_ptr() == v.data_ptr() and back.stride() == v.stride()


# --- casts that would lose a part ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, "f64", torch.float16])
def test_complex_to_real_cast_is_refused_not_silent(dtype: object) -> None:
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    with pytest.raises(tb.UnsupportedDtypeError, match=r"discard the imaginary part.*x\.real"):
        tb.to_numpy(z, dtype=dtype)
    with pytest.raises(tb.UnsupportedDtypeError, match=r"discard the imaginary part"):
        tb.to_torch(z.numpy(), dtype=dtype)
    with pytest.raises(tb.UnsupportedDtypeError, match=r"discard the imaginary part"):
        tb.to_numpy(z.numpy(), dtype=dtype)
    np.testing.assert_array_equal(tb.to_numpy(z.real, dtype=dtype), np.array([1, 3]))


def test_fast_cast_and_copy_paths_give_fresh_independent_memory() -> None:
    t = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3).T  # non-contiguous
    cast = tb.to_numpy(t, dtype=np.float32)
    copied = tb.to_numpy(t, copy=True)
    assert cast.dtype == np.float32 and cast.flags.c_contiguous
    assert copied.strides == tb.to_numpy(t).strides  # memory order kept, like copy(order="K")
    t.add_(1)
    np.testing.assert_array_equal(cast, np.arange(6, dtype=np.float32).reshape(2, 3).T)
    assert not np.shares_memory(copied, tb.to_numpy(t))
    assert copied.astype(np.float32).tolist() == cast.tolist()
