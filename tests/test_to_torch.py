"""``tb.to_torch``: bit-exact, zero-copy for writable arrays, a safe copy for everything else.

Every test asserts behaviour: bytes, dtype, shared addresses, strides, or the exact
exception class and its message. Parametrized over the dtype table through ``row``.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorbridge as tb
from _budget import examples
from conftest import ROWS, data_address, make_patterns, tensor_bytes
from tensorbridge._versions import torch_e4m3fn_saturates

FLOAT4_X2 = getattr(torch, "float4_e2m1fn_x2", None)
FLOAT4 = getattr(ml_dtypes, "float4_e2m1fn", None)
NATIVE_MULTIBYTE = [r for r in ROWS if r.carrier is None and r.itemsize > 1]


def _array(row: tb.DTypeRow, n: int = 24) -> np.ndarray:
    """A fresh writable 1-D array of ``row``'s dtype holding ``n`` of its test patterns."""
    return np.resize(make_patterns(row), n)


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


# --- bits --------------------------------------------------------------------------------------


def test_every_pattern_round_trips_bit_exact_and_shared(
    row: tb.DTypeRow, patterns: np.ndarray
) -> None:
    raw = patterns.tobytes()

    t = tb.to_torch(patterns)

    assert type(t) is torch.Tensor
    assert t.dtype is row.torch
    assert tuple(t.shape) == patterns.shape
    assert tensor_bytes(t) == raw  # NaN payloads included: bytes, not values
    assert t.data_ptr() == data_address(patterns)

    back = tb.to_numpy(t)
    assert back.dtype == row.numpy and back.tobytes() == raw
    assert data_address(back) == data_address(patterns)


def test_copy_true_round_trip_is_bit_exact_and_independent(
    row: tb.DTypeRow, patterns: np.ndarray
) -> None:
    raw = patterns.tobytes()

    t = tb.to_torch(patterns, copy=True)

    assert t.dtype is row.torch and tensor_bytes(t) == raw
    assert t.data_ptr() != data_address(patterns)
    t.view(torch.uint8).fill_(1)
    assert patterns.tobytes() == raw  # writing the tensor leaves the array alone
    patterns.view(np.uint8)[:] = 0
    assert tensor_bytes(t) == b"\x01" * len(raw)  # and the other way round


def test_shares_memory_by_default_both_ways_of_writing(row: tb.DTypeRow) -> None:
    a = _array(row)
    t = tb.to_torch(a)

    a.view(np.uint8)[:] = 1
    assert tensor_bytes(t) == b"\x01" * a.nbytes

    t.view(torch.uint8).fill_(0)
    assert a.tobytes() == b"\x00" * a.nbytes


def test_copy_false_and_device_cpu_share(row: tb.DTypeRow) -> None:
    a = _array(row)

    for t in (tb.to_torch(a, copy=False), tb.to_torch(a, device="cpu", copy=False)):
        assert t.data_ptr() == data_address(a)
        assert tensor_bytes(t) == a.tobytes()


# --- arrays that must be copied ----------------------------------------------------------------


def test_read_only_array_is_copied_bit_exact(row: tb.DTypeRow, patterns: np.ndarray) -> None:
    raw = patterns.tobytes()
    a = _read_only(patterns)

    t = tb.to_torch(a)

    assert t.dtype is row.torch and tensor_bytes(t) == raw
    assert t.data_ptr() != data_address(a)  # never a writable alias of read-only memory
    t.view(torch.uint8).fill_(7)
    assert a.tobytes() == raw

    with pytest.raises(tb.CopyRequiredError) as info:
        tb.to_torch(a, copy=False)
    msg = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "to_torch(copy=False) cannot share memory: the input is read-only" in msg
    assert "np.load(path, mmap_mode='c')" in msg
    assert "pass copy=None to allow the copy" in msg


def test_negative_strides_are_copied_bit_exact(row: tb.DTypeRow, patterns: np.ndarray) -> None:
    a = patterns[::-1]

    t = tb.to_torch(a)

    assert t.dtype is row.torch
    assert tensor_bytes(t) == a.tobytes()
    assert all(s >= 0 for s in t.stride())
    with pytest.raises(tb.CopyRequiredError, match=r"the input has negative strides"):
        tb.to_torch(a, copy=False)


def test_negative_strides_in_2d_keep_values() -> None:
    a = np.arange(12.0).reshape(3, 4)[::-1, ::2]

    t = tb.to_torch(a)

    np.testing.assert_array_equal(t.numpy(), a)


@pytest.mark.parametrize("nrow", NATIVE_MULTIBYTE, ids=lambda r: r.name)
def test_byte_swapped_array_is_copied_into_native_order(nrow: tb.DTypeRow) -> None:
    native = make_patterns(nrow)
    swapped = native.astype(native.dtype.newbyteorder(">"))
    assert swapped.tobytes() != native.tobytes() or native.itemsize == 1

    t = tb.to_torch(swapped)

    assert t.dtype is nrow.torch
    assert tensor_bytes(t) == native.tobytes()
    with pytest.raises(tb.CopyRequiredError) as info:
        tb.to_torch(swapped, copy=False)
    assert f"the input is byte-swapped ({swapped.dtype.str})" in str(info.value)


def test_strides_not_a_multiple_of_the_itemsize_are_copied() -> None:
    rec = np.zeros(5, dtype=[("x", "<f4"), ("flag", "u1")])
    rec["x"] = [1.5, -2.0, 3.25, np.inf, -0.0]
    field = rec["x"]
    assert field.strides == (5,)

    t = tb.to_torch(field)

    assert tensor_bytes(t) == field.tobytes()
    with pytest.raises(tb.CopyRequiredError, match=r"strides \(5,\) that are not a multiple"):
        tb.to_torch(field, copy=False)


def test_copy_false_refuses_a_cast() -> None:
    with pytest.raises(tb.CopyRequiredError) as info:
        tb.to_torch(np.ones(3), dtype=torch.float32, copy=False)

    assert "the input is float64 and a cast to float32 makes new values" in str(info.value)


def test_read_only_arrays_copy_without_any_warning(tmp_path: Path) -> None:
    # torch.from_numpy warns once per process about read-only arrays, so only a fresh
    # interpreter can prove that tensorbridge never triggers it.
    script = textwrap.dedent(
        f"""
        import warnings
        warnings.simplefilter("error")
        import ml_dtypes, numpy as np, torch
        import tensorbridge as tb

        a = np.arange(6.0)
        a.flags.writeable = False
        t = tb.to_torch(a)
        t[0] = 5
        assert a[0] == 0
        tb.to_torch(a, dtype="bf16")
        tb.to_torch(a[::-1])
        tb.to_torch(a, out=torch.empty(6))
        b = np.arange(6.0).astype(ml_dtypes.bfloat16)
        b.flags.writeable = False
        tb.to_torch(b)
        tb.to_torch(b, dtype=np.float32)
        np.save({str(tmp_path / "x.npy")!r}, np.arange(4, dtype=np.float32))
        m = np.load({str(tmp_path / "x.npy")!r}, mmap_mode="r")
        tm = tb.to_torch(m)
        tm += 1
        assert m.tolist() == [0.0, 1.0, 2.0, 3.0]
        print("ok")
        """
    )

    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", script], capture_output=True, text=True, timeout=120
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert "Warning" not in done.stderr


# --- memory maps -------------------------------------------------------------------------------


def test_mmap_read_only_is_copied_and_copy_false_names_mmap_mode_c(tmp_path: Path) -> None:
    path = tmp_path / "w.npy"
    np.save(path, np.arange(8, dtype=np.float32))
    m = np.load(path, mmap_mode="r")

    t = tb.to_torch(m)

    assert t.tolist() == list(range(8))
    assert t.data_ptr() != data_address(m)
    with pytest.raises(tb.CopyRequiredError, match=r"mmap_mode='c'"):
        tb.to_torch(m, copy=False)


def test_mmap_copy_on_write_is_shared_and_leaves_the_file_alone(tmp_path: Path) -> None:
    path = tmp_path / "w.npy"
    np.save(path, np.arange(8, dtype=np.float32))
    m = np.load(path, mmap_mode="c")

    t = tb.to_torch(m, copy=False)

    assert t.data_ptr() == data_address(m)
    t[0] = 42
    assert m[0] == 42
    assert np.load(path).tolist() == list(range(8))


def test_writable_memmap_is_shared_and_writes_reach_the_file(tmp_path: Path) -> None:
    path = tmp_path / "w.bin"
    mm = np.memmap(path, dtype=ml_dtypes.bfloat16, mode="w+", shape=(4,))

    t = tb.to_torch(mm)

    assert t.dtype is torch.bfloat16
    assert t.data_ptr() == data_address(mm)
    t.copy_(torch.tensor([1.0, -2.0, 0.5, 3.0]))
    mm.flush()
    del mm
    gc.collect()
    assert np.fromfile(path, ml_dtypes.bfloat16).astype(np.float32).tolist() == [1, -2, 0.5, 3]
    assert t.tolist() == [1.0, -2.0, 0.5, 3.0]  # the tensor keeps the mapping alive


# --- strides: views are not materialised -------------------------------------------------------


def _as_strided(a: np.ndarray, shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    """``as_strided`` through a void carrier: NumPy cannot rebuild some ml_dtypes by typestr."""
    v = np.lib.stride_tricks.as_strided(a.view(f"V{a.itemsize}"), shape, strides, writeable=True)
    return v.view(a.dtype)


VIEWS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "transpose": lambda a: a.reshape(4, 6).T,
    "step_slice": lambda a: a.reshape(4, 6)[::2, 1::3],
    "offset_slice": lambda a: a.reshape(4, 6)[1:, 2:5],
    "transpose_3d": lambda a: a.reshape(2, 3, 4).transpose(2, 0, 1),
    "diagonal_view": lambda a: _as_strided(a, (4,), (7 * a.itemsize,)),
    "writable_zero_stride": lambda a: _as_strided(a, (3, 5), (a.itemsize, 0)),
}


@pytest.mark.parametrize("view", VIEWS, ids=str)
def test_views_keep_their_strides(row: tb.DTypeRow, view: str) -> None:
    v = VIEWS[view](_array(row))

    t = tb.to_torch(v)

    assert tuple(t.shape) == v.shape
    assert v.strides == tuple(s * row.itemsize for s in t.stride())
    assert t.data_ptr() == data_address(v)  # no materialisation
    assert tensor_bytes(t) == v.tobytes()


def test_read_only_broadcast_is_copied_not_aliased() -> None:
    b = np.broadcast_to(np.arange(3.0), (4, 3))  # NumPy marks broadcasts read-only

    t = tb.to_torch(b)

    assert t.tolist() == [[0.0, 1.0, 2.0]] * 4
    t[0, 0] = 9
    assert t[1, 0] == 0  # independent elements: the copy is materialised


# --- owner lifetime ----------------------------------------------------------------------------


def _churn() -> list[object]:
    gc.collect()
    junk: list[object] = [np.full(4096, 0x55, np.uint8) for _ in range(64)]
    junk += [torch.full((4096,), 0xAA, dtype=torch.uint8) for _ in range(64)]
    return junk


def test_tensor_keeps_the_array_memory_alive(row: tb.DTypeRow, patterns: np.ndarray) -> None:
    raw = patterns.tobytes()
    t = tb.to_torch(patterns)
    step = tb.to_torch(patterns[::2])
    grad = (
        tb.to_torch(patterns.copy(), requires_grad=True)
        if row.category in ("float", "complex")
        else None
    )

    del patterns
    junk = _churn()

    assert tensor_bytes(t) == raw
    assert tensor_bytes(step) == np.frombuffer(raw, row.numpy)[::2].tobytes()
    if grad is not None:
        assert tensor_bytes(grad) == raw
    assert len(junk) == 128


# --- requires_grad -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.complex64], ids=str)
def test_requires_grad_gives_a_shared_leaf(dtype: object) -> None:
    a = np.arange(4.0).astype(dtype)

    t = tb.to_torch(a, requires_grad=True)

    assert t.requires_grad and t.is_leaf and t.grad_fn is None
    assert t.data_ptr() == data_address(a)
    (t.abs() * 3).sum().backward()
    assert t.grad is not None and t.grad.dtype is t.dtype


def test_requires_grad_on_integers_names_the_fix() -> None:
    with pytest.raises(tb.UnsupportedDtypeError) as info:
        tb.to_torch(np.arange(3, dtype=np.int32), requires_grad=True)

    assert isinstance(info.value, TypeError)
    assert str(info.value) == (
        "a torch.int32 tensor cannot require grad; pass dtype=torch.float32 as well"
    )
    t = tb.to_torch(np.arange(3, dtype=np.int32), dtype=torch.float32, requires_grad=True)
    assert t.is_leaf and t.requires_grad and t.tolist() == [0.0, 1.0, 2.0]


def test_requires_grad_with_out_returns_out_itself() -> None:
    out = torch.zeros(3)

    r = tb.to_torch(np.array([1.0, 2.0, 3.0]), out=out, requires_grad=True)

    assert r is out
    assert out.requires_grad and out.is_leaf
    assert out.tolist() == [1.0, 2.0, 3.0]


# --- out= --------------------------------------------------------------------------------------


def test_out_same_dtype_returns_out(row: tb.DTypeRow) -> None:
    a = _array(row).reshape(4, 6)
    out = torch.empty(4, 6, dtype=row.torch)

    r = tb.to_torch(a, out=out)

    assert r is out
    assert tensor_bytes(out) == a.tobytes()
    assert out.data_ptr() != data_address(a)


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        (np.float64, torch.bfloat16),
        (ml_dtypes.bfloat16, torch.float32),
        (np.float32, torch.float8_e4m3fn),
        (np.int16, torch.float16),
        (np.float16, torch.complex64),
    ],
    ids=lambda d: str(d) if isinstance(d, torch.dtype) else np.dtype(d).name,
)
def test_out_casts_with_torchs_kernel(src: object, dst: torch.dtype) -> None:
    a = np.array([[0.1, -2.5, 1e3], [448.0, 3.0, -0.0]]).astype(src)
    out = torch.zeros(2, 3, dtype=dst)

    r = tb.to_torch(a, out=out)

    assert r is out
    assert tensor_bytes(out) == tensor_bytes(
        torch.from_numpy(a.view(np.uint8)).view(tb.torch_dtype(a.dtype)).to(dst)
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: _read_only(np.arange(6.0)),
        lambda: np.arange(6.0)[::-1].copy()[::-1],
        lambda: np.arange(6.0).astype(">f8"),
    ],
    ids=["read_only", "negative_strides", "byte_swapped"],
)
def test_out_from_arrays_torch_cannot_view(make: Callable[[], np.ndarray]) -> None:
    out = torch.zeros(6, dtype=torch.bfloat16)

    r = tb.to_torch(make(), out=out)

    assert r is out and out.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_out_shape_mismatch_raises() -> None:
    out = torch.zeros(3)

    with pytest.raises(tb.ShapeMismatchError) as info:
        tb.to_torch(np.zeros(4), out=out)

    assert isinstance(info.value, ValueError)
    assert str(info.value) == (
        "to_torch: out= has shape (3,) but the source has shape (4,); "
        "pass an out of the source's shape"
    )


def test_out_with_dtype_casts_to_dtype_first() -> None:
    a = np.array([1.1, 3.3, 1e-3])
    out = torch.zeros(3, dtype=torch.float64)

    tb.to_torch(a, dtype="bf16", out=out)

    assert tensor_bytes(out) == tensor_bytes(torch.from_numpy(a).to(torch.bfloat16).double())


def test_out_requiring_grad_is_filled_without_autograd() -> None:
    out = torch.nn.Parameter(torch.zeros(3))

    r = tb.to_torch(np.array([1.0, 2.0, 3.0], np.float32), out=out)

    assert r is out and out.detach().tolist() == [1.0, 2.0, 3.0]
    assert out.grad_fn is None


# --- dtype= casts ------------------------------------------------------------------------------

SPELLINGS = [
    (np.float32, torch.float32),
    (torch.float32, torch.float32),
    ("f32", torch.float32),
    ("float32", torch.float32),
    (ml_dtypes.bfloat16, torch.bfloat16),
    (torch.bfloat16, torch.bfloat16),
    ("bf16", torch.bfloat16),
    ("bfloat16", torch.bfloat16),
    ("f16", torch.float16),
    (np.float16, torch.float16),
    ("f64", torch.float64),
    ("float8_e5m2", torch.float8_e5m2),
]


@pytest.mark.parametrize(("spec", "expected"), SPELLINGS, ids=[repr(s) for s, _ in SPELLINGS])
def test_dtype_accepts_numpy_torch_and_names(spec: object, expected: torch.dtype) -> None:
    t = tb.to_torch(np.array([1.5, -2.5, 0.0]), dtype=spec)

    assert t.dtype is expected
    assert t.double().tolist() == [1.5, -2.5, 0.0]


def test_bf16_every_pattern_to_float32_matches_torch() -> None:
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    a = bits.view(ml_dtypes.bfloat16)

    t = tb.to_torch(a, dtype=torch.float32)

    expected = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).to(torch.float32)
    assert t.dtype is torch.float32
    assert tensor_bytes(t) == tensor_bytes(expected)  # every pattern, NaN payloads included


@pytest.mark.parametrize(
    "dst", [torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2, torch.float16], ids=str
)
def test_float32_random_bits_narrow_like_torch(dst: torch.dtype) -> None:
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 1 << 32, 1 << 16, dtype=np.uint64).astype(np.uint32)
    edges = make_patterns(tb.resolve_dtype("float32"))[:19].view(np.uint32)
    a = np.concatenate([edges, bits]).view(np.float32)

    t = tb.to_torch(a, dtype=dst)

    assert t.dtype is dst
    assert tensor_bytes(t) == tensor_bytes(torch.from_numpy(a).to(dst))


def test_nan_and_overflow_follow_torch() -> None:
    # Same kernel as to_numpy: every NaN narrowed to bfloat16 is 0xFFFF, float8_e4m3fn
    # saturates to ±448 (NaN before torch 2.13), float8_e5m2 overflows to ±inf.
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001], np.uint32).view(np.float32)
    big = np.array([np.inf, -np.inf, 1e6], np.float32)

    bf = tb.to_torch(nans, dtype="bf16")
    e4 = tb.to_torch(big, dtype="float8_e4m3fn")
    e5 = tb.to_torch(big, dtype="float8_e5m2")

    assert bf.view(torch.int16).tolist() == [-1, -1, -1]  # 0xFFFF
    top = 448.0 if torch_e4m3fn_saturates() else float("nan")
    np.testing.assert_array_equal(e4.float().numpy(), [top, -top, top])
    assert torch.equal(e4.view(torch.uint8), torch.from_numpy(big).to(e4.dtype).view(torch.uint8))
    assert e5.float().tolist() == [float("inf"), float("-inf"), float("inf")]


# --- packed fp4 --------------------------------------------------------------------------------


@pytest.fixture
def fp4() -> None:
    if FLOAT4_X2 is None or FLOAT4 is None:
        pytest.skip(reason="needs torch.float4_e2m1fn_x2 and ml_dtypes.float4_e2m1fn")


@pytest.mark.usefixtures("fp4")
@pytest.mark.parametrize("spec", ["torch", "name"])
def test_fp4_packs_every_nibble_pair(spec: str) -> None:
    lo, hi = np.meshgrid(np.arange(16, dtype=np.uint8), np.arange(16, dtype=np.uint8))
    pairs = np.stack([lo.ravel(), hi.ravel()], axis=-1).reshape(4, 128)  # 256 (lo, hi) pairs
    a = pairs.view(FLOAT4)
    dtype = FLOAT4_X2 if spec == "torch" else "float4_e2m1fn_x2"

    t = tb.to_torch(a, dtype=dtype)

    assert t.dtype is FLOAT4_X2 and tuple(t.shape) == (4, 64)
    expected = (pairs[:, 0::2] | (pairs[:, 1::2] << 4)).astype(np.uint8)
    assert sorted(set(expected.ravel().tolist())) == list(range(256))
    assert tensor_bytes(t) == expected.tobytes()
    assert tb.to_numpy(t, dtype=FLOAT4).tobytes() == a.tobytes()


@pytest.mark.usefixtures("fp4")
@pytest.mark.parametrize("shape", [(3,), (2, 5), ()], ids=str)
def test_fp4_packing_needs_an_even_last_dimension(shape: tuple[int, ...]) -> None:
    a = np.zeros(shape, FLOAT4)

    with pytest.raises(tb.ShapeMismatchError) as info:
        tb.to_torch(a, dtype=FLOAT4_X2)

    assert str(info.value) == (
        f"packing float4_e2m1fn needs an even last dimension, got shape {shape}; "
        "pad the last dimension to an even length"
    )


@pytest.mark.usefixtures("fp4")
def test_fp4_array_without_dtype_names_the_fix() -> None:
    a = np.zeros(4, FLOAT4)

    with pytest.raises(tb.UnsupportedDtypeError) as info:
        tb.to_torch(a)

    assert str(info.value) == (
        "ml_dtypes float4_e2m1fn has no torch dtype; pass dtype=torch.float4_e2m1fn_x2 to "
        "pack two values a byte, or dtype=torch.bfloat16, torch.float16 or torch.float32 "
        "(each holds every float4_e2m1fn value exactly)"
    )
    with pytest.raises(tb.CopyRequiredError, match=r"is float4_e2m1fn \(packing makes a new"):
        tb.to_torch(a, dtype=FLOAT4_X2, copy=False)


@pytest.mark.usefixtures("fp4")
def test_fp4_array_widens_with_dtype_float32() -> None:
    a = np.array([0.5, -6.0, 3.0, 0.0], FLOAT4)

    t = tb.to_torch(a, dtype=torch.float32)

    assert t.dtype is torch.float32 and t.tolist() == [0.5, -6.0, 3.0, 0.0]


# --- unsupported dtypes and kinds of array ------------------------------------------------------

NUMPY_UNSUPPORTED = [
    (
        "datetime64[D]",
        "datetime64[D] has no torch dtype; pass a.view(np.int64) to keep the raw ticks",
    ),
    ("timedelta64[s]", "timedelta64[s] has no torch dtype; pass a.view(np.int64)"),
    ("O", "object arrays have no torch dtype; convert to a numeric dtype first"),
    ("U3", "string dtype <U3 has no torch dtype; encode the strings to numbers first"),
    ("S3", "string dtype |S3 has no torch dtype"),
    ([("x", "f4"), ("y", "i2")], "structured dtype"),
    ("V4", "raw void dtype |V4 has no torch dtype; pass a.view(np.uint8)"),
]


@pytest.mark.parametrize(
    ("dtype", "message"), NUMPY_UNSUPPORTED, ids=[str(d) for d, _ in NUMPY_UNSUPPORTED]
)
def test_numpy_dtypes_without_a_torch_dtype(dtype: object, message: str) -> None:
    a = np.zeros(3, dtype=dtype)  # type: ignore[call-overload]

    with pytest.raises(tb.UnsupportedDtypeError) as info:
        tb.to_torch(a)

    assert isinstance(info.value, TypeError)
    assert message in str(info.value)
    with pytest.raises(tb.UnsupportedDtypeError, match=r"(have|has) no torch dtype"):
        tb.torch_dtype(a.dtype)


def test_structured_message_names_a_field() -> None:
    a = np.zeros(3, dtype=[("x", "f4"), ("y", "i2")])

    with pytest.raises(tb.UnsupportedDtypeError) as info:
        tb.to_torch(a)

    assert "convert each field separately (a['x'])" in str(info.value)


@pytest.mark.parametrize("kind", [np.longdouble, np.clongdouble], ids=lambda k: k.__name__)
def test_longdouble_wider_than_8_bytes(kind: type) -> None:
    dt = np.dtype(kind)
    if dt.itemsize == np.dtype(np.float64).itemsize * (2 if dt.kind == "c" else 1):
        pytest.skip(reason=f"{dt} is no wider than a double on this platform")
    wider = "np.float64" if dt.kind == "f" else "np.complex128"

    with pytest.raises(tb.UnsupportedDtypeError) as info:
        tb.to_torch(np.zeros(2, dt))

    assert str(info.value) == (
        f"{dt} ({dt.itemsize} bytes) has no torch dtype; pass a.astype({wider}), "
        "which rounds to 53 bits"
    )


# What to_torch of each NumPy-only type names: the torch dtypes that hold every value
# exactly (worked out by hand from each format's range and precision; the dtype table
# computes them from the values, and the test below checks the claim value by value).
EXACT_WIDENINGS = {
    "float8_e3m4": ("bfloat16", "float16", "float32"),  # 4 mantissa bits, 2^-6 .. 15.5
    "float8_e4m3": ("bfloat16", "float16", "float32"),  # 2^-9 .. 240
    "float8_e4m3b11fnuz": ("bfloat16", "float16", "float32"),  # 2^-13 .. 30
    "float8_e5m3fnu": ("bfloat16", "float32"),  # up to 114688: past float16's 65504
    "float6_e2m3fn": ("bfloat16", "float16", "float32"),
    "float6_e3m2fn": ("bfloat16", "float16", "float32"),
    "float4_e2m1fn": ("bfloat16", "float16", "float32"),
    "bcomplex32": ("complex64",),  # bfloat16 parts: complex32's float16 parts cannot
}


def test_ml_dtypes_without_a_torch_dtype(numpy_only_row: tb.DTypeRow) -> None:
    row = numpy_only_row
    exact = [f"torch.{n}" for n in EXACT_WIDENINGS[row.name]]
    a = (
        np.arange(4, dtype=np.uint8).view(row.numpy)
        if row.itemsize == 1
        else np.zeros(4, row.numpy)
    )

    with pytest.raises(tb.UnsupportedDtypeError) as info:
        tb.to_torch(a)

    named = exact[0] if len(exact) == 1 else f"{', '.join(exact[:-1])} or {exact[-1]}"
    how = f"dtype={named} (each holds every {row.name} value exactly)"
    if row.name == "float4_e2m1fn":
        how = f"dtype=torch.float4_e2m1fn_x2 to pack two values a byte, or {how}"
    assert str(info.value) == f"ml_dtypes {row.name} has no torch dtype; pass {how}"
    with pytest.raises(tb.UnsupportedDtypeError, match=f"ml_dtypes {row.name} has no torch"):
        tb.torch_dtype(row.numpy)
    with pytest.raises(tb.UnsupportedDtypeError, match=f"ml_dtypes {row.name} has no torch"):
        row.torch  # noqa: B018


def test_the_named_widenings_hold_every_value_exactly(numpy_only_row: tb.DTypeRow) -> None:
    row = numpy_only_row
    if row.itemsize == 1:
        values = np.arange(256, dtype=np.uint16).astype(np.uint8).view(row.numpy)
        exact: Any = np.float64
    else:  # bcomplex32: every bfloat16 pattern as the real and as the imaginary part
        every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
        zero = np.zeros_like(every)
        pairs = np.concatenate([np.stack([every, zero], -1), np.stack([zero, every], -1)])
        values = np.ascontiguousarray(pairs).view(row.numpy).reshape(-1)
        exact = np.complex128
    with np.errstate(invalid="ignore"):  # NaN parts: NumPy's cast warns, and keeps them
        want = values.astype(exact)

    for name in EXACT_WIDENINGS[row.name]:
        t = tb.to_torch(values, dtype=getattr(torch, name))
        got = t.to(torch.float64 if exact is np.float64 else torch.complex128).numpy()
        for g, w in ((got.real, want.real), (got.imag, want.imag)):
            assert np.array_equal(g, w, equal_nan=True), name
            assert np.array_equal(np.signbit(g), np.signbit(w)), name
    if row.name == "float8_e5m3fnu":  # and the one it leaves out cannot
        assert np.isinf(tb.to_torch(values, dtype=torch.float16).numpy()).any()


@pytest.mark.parametrize(
    ("mask", "filled"),
    [([False, True, False], [1.0, 0.0, 3.0]), (False, [1.0, 2.0, 3.0])],
    ids=["some_masked", "none_masked"],
)
@pytest.mark.parametrize("copy", [None, True, False], ids=lambda c: f"copy={c}")
def test_masked_arrays_are_refused(mask: object, filled: list[float], copy: bool | None) -> None:
    m = np.ma.masked_array([1.0, 2.0, 3.0], mask=mask)

    with pytest.raises(tb.UnsupportedTensorError) as info:
        tb.to_torch(m, copy=copy)

    assert isinstance(info.value, TypeError)
    assert str(info.value) == (
        "a masked array's mask would be lost; pass a.filled(fill_value), or convert a.data "
        "and np.ma.getmaskarray(a) separately"
    )
    assert tb.to_torch(m.filled(0.0)).tolist() == filled  # the fix the message names works


# --- scalars, 0-d and empty --------------------------------------------------------------------


def test_numpy_and_ml_dtypes_scalars_are_bit_exact(row: tb.DTypeRow, patterns: np.ndarray) -> None:
    picks = patterns if patterns.size <= 256 else patterns[:: max(1, patterns.size // 512)]
    for i in range(picks.size):
        scalar = picks[i]
        assert type(scalar) is row.numpy.type  # an ml_dtypes scalar for the extended rows

        t = tb.to_torch(scalar)

        assert t.shape == () and t.dtype is row.torch
        assert tensor_bytes(t) == picks[i : i + 1].tobytes()


def test_zero_dimensional_array_is_shared(row: tb.DTypeRow, patterns: np.ndarray) -> None:
    a = patterns[1:2].reshape(())

    t = tb.to_torch(a)

    assert t.shape == () and t.dtype is row.torch
    assert tensor_bytes(t) == a.tobytes()
    assert t.data_ptr() == data_address(a)


@pytest.mark.parametrize("shape", [(0,), (3, 0, 2)], ids=str)
def test_empty(row: tb.DTypeRow, shape: tuple[int, ...]) -> None:
    a = np.empty(shape, row.numpy)

    for t in (tb.to_torch(a), tb.to_torch(a, copy=True), tb.to_torch(_read_only(a))):
        assert tuple(t.shape) == shape and t.dtype is row.torch and t.numel() == 0


def test_python_sequences_go_through_numpy() -> None:
    t = tb.to_torch([[1, 2], [3, 4]])

    assert t.dtype is torch.int64 and t.tolist() == [[1, 2], [3, 4]]


def test_tensor_input_follows_the_same_contract() -> None:
    x = torch.arange(4.0)

    assert tb.to_torch(x).data_ptr() == x.data_ptr()
    assert tb.to_torch(x, copy=True).data_ptr() != x.data_ptr()
    assert tb.to_torch(x, dtype="bf16").dtype is torch.bfloat16
    with pytest.raises(tb.CopyRequiredError, match="needs a cast or a device transfer"):
        tb.to_torch(x, dtype="bf16", copy=False)


# --- accelerators ------------------------------------------------------------------------------


@pytest.fixture
def cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip(reason="needs a CUDA device")
    return torch.device("cuda")


def test_to_cuda_is_bit_exact(row: tb.DTypeRow, patterns: np.ndarray, cuda: torch.device) -> None:
    t = tb.to_torch(patterns, device=cuda)

    assert t.device.type == "cuda" and t.dtype is row.torch
    assert tensor_bytes(t) == patterns.tobytes()
    with pytest.raises(tb.CopyRequiredError, match=r"must move to cuda"):
        tb.to_torch(patterns, device=cuda, copy=False)


def test_to_cuda_with_cast_read_only_and_out(cuda: torch.device) -> None:
    a = _read_only(np.linspace(-3, 3, 1000, dtype=np.float32))
    out = torch.empty(1000, dtype=torch.bfloat16, device=cuda)

    t = tb.to_torch(a, dtype="bf16", device=cuda)
    r = tb.to_torch(a, out=out)

    expected = torch.from_numpy(a.copy()).to(torch.bfloat16)
    assert tensor_bytes(t) == tensor_bytes(expected)
    assert r is out and tensor_bytes(out) == tensor_bytes(expected)


# --- properties over shapes and strides --------------------------------------------------------


@st.composite
def numpy_views(draw: st.DrawFn) -> tuple[tb.DTypeRow, np.ndarray]:
    row = draw(st.sampled_from(ROWS))
    shape = draw(st.lists(st.integers(0, 5), max_size=4))
    n = int(np.prod(shape)) if shape else 1
    a = np.resize(make_patterns(row), n).reshape(shape)
    index = []
    for size in shape:
        step = draw(st.sampled_from([1, 2, 3, -1, -2]))
        start = draw(st.integers(0, size))
        index.append(slice(start, None, step) if step > 0 else slice(None, None, step))
    v = a[(*index, ...)]  # the Ellipsis keeps a 0-d result an array, not a scalar
    if v.ndim >= 2:
        v = v.transpose(draw(st.permutations(range(v.ndim))))
    return row, v


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(numpy_views())
def test_property_views_round_trip(case: tuple[tb.DTypeRow, np.ndarray]) -> None:
    row, v = case

    t = tb.to_torch(v)

    assert t.dtype is row.torch
    assert tuple(t.shape) == v.shape
    assert tensor_bytes(t) == v.tobytes()
    negative = any(s < 0 for s in v.strides)  # even on a length-1 axis: torch has none
    if v.size and not negative:
        assert t.data_ptr() == data_address(v)
        assert v.strides == tuple(s * row.itemsize for s in t.stride())
    if negative:
        assert t.data_ptr() != data_address(v)
    back = tb.to_numpy(t)
    assert back.tobytes() == v.tobytes()
