"""Quantized tensor subclasses: torchao's MXTensor, NVFP4Tensor, Float8Tensor, ... .

``to_numpy`` / ``to_torch`` refuse them without ``dtype=`` (their storage is codes and
scales, not values), dequantize them with it (bit-identical to the subclass's own
``dequantize(torch.float32)``, then one rounding), and the tree functions take them
apart with ``keep_quantized=True`` (the inner tensors of ``__tensor_flatten__``, as
ml_dtypes arrays sharing memory). Every torchao tensor here is built on the CPU by
torchao's own quantizers (``to_mx``, ``to_nvfp4``, ``from_hp``) or constructor; a
small wrapper subclass defined below checks the generic path without torchao.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

import tensorbridge as tb
from tensorbridge import _plan

# --- a quantized wrapper subclass of our own (no torchao needed) -------------------------------


class Int8Wrapper(torch.Tensor):
    """int8 codes x one float32 scale a row: the shape of a torchao subclass, in 30 lines."""

    qdata: torch.Tensor
    scale: torch.Tensor

    @staticmethod
    def __new__(cls, qdata: torch.Tensor, scale: torch.Tensor) -> Int8Wrapper:
        made: Int8Wrapper = torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls, qdata.shape, dtype=torch.float32, device=qdata.device
        )
        made.qdata, made.scale = qdata, scale
        return made

    def __tensor_flatten__(self) -> tuple[list[str], dict[str, Any]]:
        return ["qdata", "scale"], {"axis": 0}

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, Any], ctx: Any, size: Any, stride: Any) -> Any:
        return Int8Wrapper(inner["qdata"], inner["scale"])

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        raise NotImplementedError(f"{func} on Int8Wrapper")

    def dequantize(self, output_dtype: torch.dtype = torch.float32) -> torch.Tensor:  # type: ignore[override]
        return (self.qdata.to(torch.float32) * self.scale).to(output_dtype)


class CodesOnly(Int8Wrapper):
    """The same, without a way to dequantize (tensorbridge must not invent one)."""

    dequantize = None  # type: ignore[assignment]


def int8_wrapper(cls: type = Int8Wrapper) -> Any:
    g = torch.Generator().manual_seed(1)
    q = torch.randint(-128, 128, (4, 8), dtype=torch.int8, generator=g)
    return cls(q, torch.rand(4, 1, generator=g) + 0.5)


def test_generic_wrapper_refused_then_dequantized_by_its_own_method() -> None:
    x = int8_wrapper()
    with pytest.raises(tb.QuantizedTensorError) as e:
        tb.to_numpy(x)
    assert str(e.value) == (
        "Int8Wrapper holds qdata (int8 [4, 8]) and scale (float32 [4, 1]), not float32 "
        "values; pass dtype=np.float32 to dequantize it, or take its parts with "
        "tb.tree_to_numpy(..., keep_quantized=True)"
    )
    assert isinstance(e.value, tb.UnsupportedTensorError) and isinstance(e.value, TypeError)
    a = tb.to_numpy(x, dtype=np.float32)
    np.testing.assert_array_equal(a, (x.qdata.float() * x.scale).numpy())
    plan = _plan.plan_numpy(x, np.float32)
    assert plan.steps == ("dequantize",) and plan.copies


def test_wrapper_without_dequantize_is_refused_even_with_dtype() -> None:
    x = int8_wrapper(CodesOnly)
    with pytest.raises(tb.QuantizedTensorError, match="has no dequantize"):
        tb.to_numpy(x, dtype=np.float32)
    parts = tb.tree_to_numpy({"w": x}, keep_quantized=True)["w"]
    assert parts.scheme is None and parts.attributes == {"axis": 0}
    assert np.shares_memory(parts.parts["qdata"], x.qdata.numpy())


def test_a_wrapper_of_plain_values_is_not_quantized() -> None:
    two = pytest.importorskip(
        "torch.testing._internal.two_tensor", reason="torch's TwoTensor test subclass"
    )
    x = two.TwoTensor(torch.ones(3), torch.zeros(3))
    with pytest.raises(tb.UnsupportedTensorError) as e:
        tb.to_numpy(x)
    assert not isinstance(e.value, tb.QuantizedTensorError)
    assert "may not keep its values in its storage" in str(e.value)


def test_tensorbridge_does_not_import_torchao() -> None:
    code = (
        "import sys, torch, tensorbridge as tb\n"
        "tb.to_numpy(torch.ones(2)); tb.tree_to_numpy({'a': torch.ones(2)}, float_dtype='f16')\n"
        "tb.describe(torch.ones(2))\n"
        "print('torchao' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == ["False"]


# --- torchao's subclasses ----------------------------------------------------------------------

mx_tensor = pytest.importorskip(
    "torchao.prototype.mx_formats.mx_tensor", reason="torchao's MXTensor is under test"
)
nvfp4_tensor = pytest.importorskip(
    "torchao.prototype.mx_formats.nvfp4_tensor", reason="torchao's NVFP4Tensor is under test"
)
float8_tensor = pytest.importorskip(
    "torchao.quantization.quantize_.workflows.float8.float8_tensor",
    reason="torchao's Float8Tensor is under test",
)
granularity = pytest.importorskip("torchao.quantization.granularity", reason="torchao")
int8_tensor = pytest.importorskip(
    "torchao.quantization.quantize_.workflows.int8.int8_tensor", reason="torchao's Int8Tensor"
)
intx_tensor = pytest.importorskip(
    "torchao.quantization.quantize_.workflows.intx.intx_unpacked_to_int8_tensor",
    reason="torchao's IntxUnpackedToInt8Tensor",
)
MXTensor = mx_tensor.MXTensor
NVFP4Tensor = nvfp4_tensor.NVFP4Tensor
Float8Tensor = float8_tensor.Float8Tensor
F4X2 = torch.float4_e2m1fn_x2


def weights(*shape: int) -> torch.Tensor:
    """Normal values over many binades (so that the block scales differ), and some zeros."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-20, 20, shape, generator=g))
    w.view(-1)[::37] = 0.0
    return w


def every_byte(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Random bytes, every one of the 256 patterns included."""
    g = torch.Generator().manual_seed(seed)
    b = torch.randint(0, 256, (rows * cols,), dtype=torch.uint8, generator=g)
    b[:256] = torch.arange(256, dtype=torch.uint8)
    return b.reshape(rows, cols)


def mx_every_scale(elem: torch.dtype) -> Any:
    """An MXTensor whose 256 rows take every e8m0 scale byte (NaN and 2**-127 included)."""
    width = 16 if elem == F4X2 else 32
    codes = every_byte(256, width, 2)
    qdata = codes if elem == F4X2 else codes.view(elem)
    scale = torch.arange(256, dtype=torch.uint8).reshape(256, 1).view(torch.float8_e8m0fnu)
    pref = mx_tensor.KernelPreference.EMULATED
    return MXTensor(qdata, scale, elem, 32, torch.float32, pref, None, False)


def nvfp4_every_scale(global_scale: torch.Tensor | None) -> Any:
    codes = every_byte(256, 8, 3)
    scale = torch.arange(256, dtype=torch.uint8).reshape(256, 1).view(torch.float8_e4m3fn)
    return NVFP4Tensor(codes, scale, 16, torch.float32, global_scale)


def float8_every_code(per_row: bool) -> Any:
    qdata = every_byte(64, 32, 4).view(torch.float8_e4m3fn)
    scale = torch.rand(64, 1) if per_row else torch.full((1, 1), 0.037)
    block = [1, 32] if per_row else [64, 32]
    return Float8Tensor(qdata, scale, block_size=block, dtype=torch.float32)


P = granularity
CASES: dict[str, tuple[Callable[[], Any], str | None]] = {
    "mxfp8-e4m3": (lambda: MXTensor.to_mx(weights(16, 64), torch.float8_e4m3fn, 32), "mxfp8"),
    "mxfp8-e5m2": (lambda: MXTensor.to_mx(weights(16, 64), torch.float8_e5m2, 32), "mxfp8"),
    "mxfp8-3d": (lambda: MXTensor.to_mx(weights(2, 4, 64), torch.float8_e4m3fn, 32), "mxfp8"),
    "mxfp8-bf16": (
        lambda: MXTensor.to_mx(weights(16, 64).bfloat16(), torch.float8_e4m3fn, 32),
        "mxfp8",
    ),
    "mxfp4": (lambda: MXTensor.to_mx(weights(16, 64), F4X2, 32), "mxfp4"),
    "mxfp8-every-scale": (lambda: mx_every_scale(torch.float8_e4m3fn), "mxfp8"),
    "mxfp8-e5m2-every-scale": (lambda: mx_every_scale(torch.float8_e5m2), "mxfp8"),
    "mxfp4-every-scale": (lambda: mx_every_scale(F4X2), "mxfp4"),
    "mx-block16": (lambda: MXTensor.to_mx(weights(16, 64), torch.float8_e4m3fn, 16), None),
    "nvfp4": (lambda: NVFP4Tensor.to_nvfp4(weights(16, 64)), "nvfp4-modelopt"),
    "nvfp4-per-tensor": (
        lambda: NVFP4Tensor.to_nvfp4(
            weights(16, 64), per_tensor_scale=weights(16, 64).abs().amax() / 2688
        ),
        "nvfp4-modelopt",
    ),
    "nvfp4-every-scale": (lambda: nvfp4_every_scale(None), "nvfp4-modelopt"),
    "nvfp4-every-scale-global": (
        lambda: nvfp4_every_scale(torch.tensor(0.0123, dtype=torch.float32)),
        "nvfp4-modelopt",
    ),
    "nvfp4-per-expert": (
        lambda: NVFP4Tensor.to_nvfp4(weights(2, 8, 64), per_tensor_scale=torch.rand(2, 1, 1)),
        None,
    ),
    "float8-per-row": (
        lambda: Float8Tensor.from_hp(weights(16, 64), granularity=P.PerRow()),
        "fp8",
    ),
    "float8-per-tensor": (
        lambda: Float8Tensor.from_hp(weights(16, 64), granularity=P.PerTensor()),
        "fp8",
    ),
    "float8-every-code-row": (lambda: float8_every_code(True), "fp8"),
    "float8-every-code-tensor": (lambda: float8_every_code(False), "fp8"),
    "float8-per-block": (
        lambda: Float8Tensor.from_hp(weights(256, 256), granularity=P.PerBlock([128, 128])),
        None,
    ),
    # transposed views (torchao's own t()): strided qdata, left to the subclass
    "mxfp8-t": (lambda: MXTensor.to_mx(weights(32, 64), torch.float8_e4m3fn, 32).t(), None),
    "mxfp4-t": (lambda: MXTensor.to_mx(weights(32, 64), F4X2, 32).t(), None),
    "nvfp4-t": (lambda: NVFP4Tensor.to_nvfp4(weights(32, 64)).t(), None),
    # integer subclasses: their own dequantize (intx's takes no dtype)
    "int8-per-row": (
        lambda: int8_tensor.Int8Tensor.from_hp(weights(16, 64), granularity=P.PerRow()),
        None,
    ),
    "intx-int4": (
        lambda: intx_tensor.IntxUnpackedToInt8Tensor.from_hp(weights(16, 64), [1, 32], torch.int4),
        None,
    ),
}


def reference(x: Any) -> torch.Tensor:
    """The subclass's own dequantization in float32 (``dequantize()`` if it takes no dtype)."""
    try:
        made: torch.Tensor = x.dequantize(torch.float32)
    except TypeError:
        made = x.dequantize().to(torch.float32)
    return made


def same_bits(a: np.ndarray, b: np.ndarray) -> None:
    """Equal bit for bit, except that any NaN matches any NaN (payloads vary by operand order)."""
    assert a.dtype == b.dtype and a.shape == b.shape
    nan_a, nan_b = np.isnan(a.astype(np.float32)), np.isnan(b.astype(np.float32))
    np.testing.assert_array_equal(nan_a, nan_b)
    carrier = {2: np.uint16, 4: np.uint32}[a.itemsize]
    np.testing.assert_array_equal(a.view(carrier)[~nan_a], b.view(carrier)[~nan_b])


@pytest.fixture(params=list(CASES), ids=str)
def case(request: pytest.FixtureRequest) -> tuple[Any, str | None]:
    make, scheme = CASES[request.param]
    return make(), scheme


def test_scheme_is_recognised_or_left_to_the_subclass(case: tuple[Any, str | None]) -> None:
    x, scheme = case
    plan = _plan.plan_numpy(x, "float32")
    assert plan.steps == ("dequantize",) and plan.copies
    d = tb.describe(x)
    assert d.dequantize is not None and d.dequantize.steps == ("dequantize",)
    route = f"tensorbridge's {scheme} kernel" if scheme else f"its own {type(x).__name__}"
    assert route in d.dequantize.reason
    assert d.quantized is not None and d.quantized.startswith(type(x).__name__)


def test_to_numpy_float32_is_bit_identical_to_the_subclass(case: tuple[Any, str | None]) -> None:
    x, _ = case
    got = tb.to_numpy(x, dtype=np.float32)
    same_bits(got, reference(x).numpy())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_other_dtypes_round_once_from_float32(case: tuple[Any, str | None], dtype: Any) -> None:
    x, _ = case
    want = reference(x).to(dtype)
    got = tb.to_torch(x, dtype=dtype)
    assert type(got) is torch.Tensor and got.dtype == dtype
    same_bits(tb.to_numpy(got), tb.to_numpy(want))
    same_bits(tb.to_numpy(x, dtype=dtype), tb.to_numpy(want))


def test_refused_without_dtype_naming_the_parts(case: tuple[Any, str | None]) -> None:
    x, _ = case
    names = x.__tensor_flatten__()[0]
    with pytest.raises(tb.QuantizedTensorError) as np_error:
        tb.to_numpy(x)
    with pytest.raises(tb.QuantizedTensorError) as torch_error:
        tb.to_torch(x)
    said = str(np_error.value)
    assert said.startswith(f"{type(x).__name__} holds ")
    assert all(f"{n} (" in said for n in names)
    assert f"{x.qdata.dtype}".removeprefix("torch.") in said
    assert "pass dtype=np.float32 to dequantize it" in said
    assert "keep_quantized=True" in said
    assert "pass dtype=torch.float32 to dequantize it" in str(torch_error.value)
    assert tb.describe(x).to_numpy.verdict == "error"


def test_a_meta_subclass_has_no_data() -> None:
    x = MXTensor.to_mx(weights(4, 32), torch.float8_e4m3fn, 32)
    pref = mx_tensor.KernelPreference.EMULATED
    meta = MXTensor(
        x.qdata.to("meta"), x.scale.to("meta"), x.elem_dtype, 32, torch.float32, pref, None, False
    )
    with pytest.raises(tb.NoDataError, match="meta MXTensor"):
        tb.to_numpy(meta, dtype=np.float32)


def test_copy_false_is_refused() -> None:
    x = MXTensor.to_mx(weights(4, 32), torch.float8_e4m3fn, 32)
    with pytest.raises(tb.CopyRequiredError, match="is a quantized MXTensor"):
        tb.to_numpy(x, dtype=np.float32, copy=False)
    with pytest.raises(tb.CopyRequiredError, match="is a quantized MXTensor"):
        tb.to_torch(x, dtype=torch.float32, copy=False)


def test_to_torch_of_its_own_dtype_still_dequantizes() -> None:
    x = MXTensor.to_mx(weights(4, 32), torch.float8_e4m3fn, 32)
    got = tb.to_torch(x, dtype=torch.float32)
    assert type(got) is torch.Tensor
    assert torch.equal(got, x.dequantize(torch.float32))
    assert _plan.plan_torch(x, torch.float32).steps == ("dequantize",)


def test_out_and_readonly_follow_the_plain_rules() -> None:
    x = NVFP4Tensor.to_nvfp4(weights(4, 32))
    out = np.empty((4, 32), np.float64)
    assert tb.to_numpy(x, dtype=np.float32, out=out) is out
    np.testing.assert_array_equal(out, x.dequantize(torch.float32).numpy().astype(np.float64))
    assert not tb.to_numpy(x, dtype="bfloat16", readonly=True).flags.writeable


def test_a_parameter_holding_a_subclass_is_not_read_through_its_storage() -> None:
    x = MXTensor.to_mx(weights(4, 32), torch.float8_e4m3fn, 32)
    p = torch.nn.Parameter(x, requires_grad=False)
    assert isinstance(p, torch.nn.Parameter)
    with pytest.raises(tb.QuantizedTensorError):
        tb.to_numpy(p)
    same_bits(tb.to_numpy(p, dtype=np.float32), x.dequantize(torch.float32).numpy())


def test_plans_are_decided_once_per_kind() -> None:
    xs = [MXTensor.to_mx(weights(4, 32) * i, torch.float8_e4m3fn, 32) for i in range(1, 21)]
    _plan.forget()
    before = _plan.decisions[0]
    out = tb.tree_to_numpy(xs, float_dtype="bfloat16")
    assert len(out) == 20 and all(a.dtype == ml_dtypes.bfloat16 for a in out)
    assert _plan.decisions[0] - before <= 3  # the subclass's kind, and its float32 stand-in


# --- keep_quantized ----------------------------------------------------------------------------


def test_keep_quantized_gives_the_inner_tensors_as_ml_dtypes_arrays(
    case: tuple[Any, str | None],
) -> None:
    x, scheme = case
    names, attributes = x.__tensor_flatten__()
    sd = {"layer": {"weight": x, "bias": torch.ones(3, dtype=torch.bfloat16)}}
    out = tb.tree_to_numpy(sd, keep_quantized=True)
    p = out["layer"]["weight"]
    assert isinstance(p, tb.QuantizedParts)
    assert p.kind == f"{type(x).__module__}.{type(x).__qualname__}"
    assert p.scheme == scheme and p.shape == tuple(x.shape)
    assert p.dtype == tb.numpy_dtype(x.dtype)
    assert list(p.parts) == list(names)
    assert p.attributes.keys() == attributes.keys()
    assert all(p.attributes[k] is attributes[k] for k in attributes)
    for name in names:
        inner = getattr(x, name)
        arr = p.parts[name]
        if inner.dtype == F4X2:
            inner = inner.view(torch.uint8)  # packed fp4: its bytes
        assert arr.dtype == tb.numpy_dtype(inner.dtype)
        assert arr.shape == tuple(inner.shape)
        assert arr.tobytes() == inner.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        if inner.numel():
            assert np.shares_memory(arr, tb.to_numpy(inner))
    assert out["layer"]["bias"].dtype == ml_dtypes.bfloat16


def test_keep_quantized_parts_are_views_and_copy_true_copies() -> None:
    x = MXTensor.to_mx(weights(4, 64), F4X2, 32)
    p = tb.tree_to_numpy({"w": x}, keep_quantized=True)["w"]
    assert p.parts["qdata"].dtype == np.uint8 and p.parts["scale"].dtype == ml_dtypes.float8_e8m0fnu
    p.parts["scale"][0, 0] = ml_dtypes.float8_e8m0fnu(2.0)  # writes through to the tensor
    assert x.scale.view(torch.uint8)[0, 0].item() == 128
    fresh = tb.tree_to_numpy({"w": x}, keep_quantized=True, copy=True)["w"]
    assert not np.shares_memory(fresh.parts["qdata"], x.qdata.numpy())
    ro = tb.tree_to_numpy({"w": x}, keep_quantized=True, readonly=True)["w"]
    assert not ro.parts["qdata"].flags.writeable


def test_keep_quantized_wins_over_float_dtype_for_quantized_leaves() -> None:
    x = NVFP4Tensor.to_nvfp4(weights(4, 32), per_tensor_scale=torch.tensor(0.01))
    sd = {"w": x, "b": torch.ones(2, dtype=torch.bfloat16)}
    out = tb.tree_to_numpy(sd, keep_quantized=True, float_dtype="float32")
    assert isinstance(out["w"], tb.QuantizedParts) and out["b"].dtype == np.float32
    assert out["w"].parts["per_tensor_scale"].shape == ()


def test_tree_to_torch_keep_quantized_gives_the_inner_tensors() -> None:
    x = Float8Tensor.from_hp(weights(8, 32), granularity=granularity.PerRow())
    p = tb.tree_to_torch({"w": x}, keep_quantized=True)["w"]
    assert p.dtype == torch.float32 and p.scheme == "fp8"
    assert p.parts["qdata"] is x.qdata and p.parts["scale"] is x.scale
    fresh = tb.tree_to_torch({"w": x}, keep_quantized=True, copy=True)["w"]
    assert fresh.parts["qdata"].data_ptr() != x.qdata.data_ptr()
    assert torch.equal(fresh.parts["qdata"].view(torch.uint8), x.qdata.view(torch.uint8))


def test_trees_refuse_with_the_key_path_or_dequantize_with_a_cast() -> None:
    x = MXTensor.to_mx(weights(4, 32), torch.float8_e4m3fn, 32)
    sd = {"enc": {"w": x, "n": torch.ones(2)}}
    with pytest.raises(tb.QuantizedTensorError, match=r"^at \['enc'\]\['w'\]: MXTensor holds"):
        tb.tree_to_numpy(sd)
    with pytest.raises(tb.QuantizedTensorError, match=r"tree_to_torch\(\.\.\., keep_quantized"):
        tb.tree_to_torch(sd)
    out = tb.tree_to_numpy(sd, float_dtype="float32")  # the subclass's own dtype: dequantized
    same_bits(out["enc"]["w"], x.dequantize(torch.float32).numpy())
    back = tb.tree_to_torch(sd, dtype=torch.bfloat16)
    assert type(back["enc"]["w"]) is torch.Tensor
    assert torch.equal(back["enc"]["w"], x.dequantize(torch.float32).bfloat16())


def test_describe_reports_the_parts_not_the_storage() -> None:
    x = MXTensor.to_mx(weights(8, 64), torch.float8_e4m3fn, 32)
    d = tb.describe(x)
    assert d.quantized == (
        "MXTensor (mxfp8): qdata (float8_e4m3fn [8, 64]) and scale (float8_e8m0fnu [8, 2])"
    )
    assert d.storage_nbytes is None and d.storage_offset is None
    assert d.dequantize is not None and d.dequantize.verdict == "copy"
    assert d.to_dict()["dequantize"]["steps"] == ["dequantize"]


# --- the rest of the library ---------------------------------------------------------------------


def test_tb_dequantize_takes_a_subclass_alone_or_in_a_state_dict() -> None:
    x = MXTensor.to_mx(weights(8, 64), F4X2, 32)
    want = x.dequantize(torch.float32).bfloat16()
    assert torch.equal(tb.dequantize(x), want)
    out = tb.dequantize({"w": x, "b": torch.ones(2)}, dtype="float32")
    assert type(out["w"]) is torch.Tensor and torch.equal(out["w"], reference(x))
    assert torch.equal(out["b"], torch.ones(2))


@pytest.mark.parametrize("suffix", [".safetensors", ".pt", ".npz", ".npy"])
def test_save_refuses_a_subclass_naming_it(tmp_path: Any, suffix: str) -> None:
    x = NVFP4Tensor.to_nvfp4(weights(8, 64))
    obj = x if suffix == ".npy" else {"layer": {"w": x}}
    at = "" if suffix == ".npy" else "at 'layer.w': "
    with pytest.raises(tb.QuantizedTensorError) as e:
        tb.save(obj, tmp_path / f"m{suffix}")
    assert str(e.value).startswith(f"{at}NVFP4Tensor holds qdata (uint8 [8, 32])")
    assert "float_dtype=torch.bfloat16" in str(e.value)
    assert list(tmp_path.iterdir()) == []
    tb.save(tb.tree_to_torch({"w": x}, float_dtype=torch.bfloat16), tmp_path / "ok.safetensors")
    assert torch.equal(
        tb.to_torch(tb.load(tmp_path / "ok.safetensors")["w"]), reference(x).bfloat16()
    )
