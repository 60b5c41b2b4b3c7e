"""Quantized checkpoints: every scheme against an implementation that is not ours.

Synthetic checkpoints in the exact published layouts (no hub is reachable); each
builder names the public checkpoint whose names, dtypes, shapes and config it
mirrors. References: transformers' own fp8 block-wise and gpt-oss MXFP4 code,
torchao (MX, NVFP4), compressed-tensors (fp8 per channel, NVFP4).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

import tensorbridge as tb
from tensorbridge.cli import main
from tensorbridge.quant import plan, read_config

finegrained = pytest.importorskip(
    "transformers.integrations.finegrained_fp8", reason="transformers is a test reference"
)


def _dequantize_fp8_weight(*args: Any) -> torch.Tensor:
    """transformers' block-size-given fp8 dequantizer (5.24+; older releases lack it)."""
    fn = getattr(finegrained, "_dequantize_fp8_weight", None)
    if fn is None:
        pytest.skip("this transformers has no _dequantize_fp8_weight to compare with")
    return fn(*args)  # type: ignore[no-any-return]


mxfp4_ref = pytest.importorskip("transformers.integrations.mxfp4")


def bits(t: Any) -> np.ndarray:
    a = tb.to_numpy(t) if isinstance(t, torch.Tensor) else np.asarray(t)
    return a.view(np.uint8)


def _torchao_mx() -> Any:
    return pytest.importorskip(
        "torchao.prototype.mx_formats.mx_tensor", reason="torchao is the MX reference"
    )


# --- fp8 block-wise (deepseek-ai/DeepSeek-V3) ------------------------------------------------


def deepseek_dir(
    tmp_path: Path, shapes: dict[str, tuple[int, int]], shard: int | None = None
) -> Path:
    """deepseek-ai/DeepSeek-V3: F8_E4M3 weights + F32 weight_scale_inv per 128x128 block,
    config.json quantization_config {"quant_method": "fp8", "weight_block_size": [128, 128]}."""
    torch.manual_seed(0)
    sd: dict[str, torch.Tensor] = {"model.embed_tokens.weight": torch.randn(32, 64).bfloat16()}
    for name, shape in shapes.items():
        sd.update(tb.quantize(torch.randn(shape), "fp8-block", name=name))
    sd["model.norm.weight"] = torch.randn(64).bfloat16()
    d = tmp_path / "ds"
    if shard is None:
        tb.save(sd, d / "model.safetensors")
    else:
        tb.save(sd, d / "model.safetensors.index.json", max_shard_size=shard)
    config = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "quantization_config": {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [128, 128],
        },
    }
    (d / "config.json").write_text(json.dumps(config))
    return d


def test_fp8_block_matches_transformers_bit_exact() -> None:
    q = tb.quantize(torch.randn(256, 384), "fp8-block")
    ours = tb.dequantize(
        q["weight"], q["weight_scale_inv"], scheme="fp8-block", block_size=(128, 128)
    )
    ref = finegrained.Fp8Dequantize(None)._dequantize_one(
        q["weight"], q["weight_scale_inv"], output_dtype=torch.bfloat16
    )
    assert ours.dtype == torch.bfloat16 and np.array_equal(bits(ours), bits(ref))


def test_fp8_block_quantize_is_transformers_fp8quantize() -> None:
    w = torch.randn(256, 384) * 3
    quantizer = SimpleNamespace(
        quantization_config=SimpleNamespace(weight_block_size=(128, 128), scale_fmt=None)
    )
    ref = finegrained.Fp8Quantize(quantizer)._quantize_one("x.weight", w)
    ours = tb.quantize(w, "fp8-block", name="x.weight")
    assert sorted(ours) == sorted(ref) == ["x.weight", "x.weight_scale_inv"]
    for k in ref:
        assert ours[k].dtype == ref[k].dtype and np.array_equal(bits(ours[k]), bits(ref[k]))


def test_fp8_block_576_rows_partial_edge(tmp_path: Path) -> None:
    """DeepSeek-V3's kv_a_proj_with_mqa is [576, 7168]: 4.5 row blocks, scale grid [5, 56]."""
    name = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
    d = deepseek_dir(tmp_path, {name: (576, 256)})
    with tb.open(d) as raw:
        codes, scale = raw[name], raw[name + "_scale_inv"]
        assert scale.shape == (5, 2)
        codes_t, scale_t = tb.to_torch(codes), tb.to_torch(scale)
    with pytest.raises(ValueError, match="not divisible by scale grid"):  # transformers infers
        finegrained.Fp8Dequantize(None)._dequantize_one(codes_t, scale_t, torch.bfloat16)
    ref = _dequantize_fp8_weight(codes_t, scale_t, [128, 128], torch.float32)
    out = tb.load(d, dequantize="bf16")
    assert sorted(out) == sorted(["model.embed_tokens.weight", name, "model.norm.weight"])
    assert np.array_equal(bits(out[name]), bits(ref.to(torch.bfloat16)))


def test_fp8_block_448_rows_block_size_from_config_not_grid(tmp_path: Path) -> None:
    """[448, 256] has a [4, 2] grid: 112-row blocks fit it exactly, but the blocks are 128."""
    name = "model.layers.0.mlp.gate_proj.weight"
    d = deepseek_dir(tmp_path, {name: (448, 256)})
    with tb.open(d) as raw:
        codes_t, scale_t = tb.to_torch(raw[name]), tb.to_torch(raw[name + "_scale_inv"])
    right = _dequantize_fp8_weight(codes_t, scale_t, [128, 128], torch.float32)
    inferred = finegrained.Fp8Dequantize(None)._dequantize_one(codes_t, scale_t, torch.float32)
    wrong = (inferred != right).float().mean().item()
    assert 0.15 < wrong < 0.3  # transformers' grid inference: about 21 % of elements wrong
    ours = tb.load(d, dequantize="f32")[name]
    assert np.array_equal(ours, right.numpy())


def test_fp8_block_weight_and_scale_in_different_shards(tmp_path: Path) -> None:
    name = "model.layers.0.mlp.up_proj.weight"
    d = deepseek_dir(tmp_path, {name: (256, 256)}, shard=64 * 1024)
    with tb.open(d) as raw:
        assert raw.shard_of(name) != raw.shard_of(name + "_scale_inv")
        ref = _dequantize_fp8_weight(
            tb.to_torch(raw[name]), tb.to_torch(raw[name + "_scale_inv"]), [128, 128], torch.float32
        )
    out = tb.load(d, dequantize="bf16", framework="torch")
    assert torch.equal(out[name], ref.to(torch.bfloat16))
    assert out["model.norm.weight"].dtype == torch.bfloat16  # passed through


def test_fp8_block_refusals() -> None:
    q = tb.quantize(torch.randn(256, 256), "fp8-block", name="w")
    with pytest.raises(tb.QuantizationError, match=r"no block size.*block_size=\(128, 128\)"):
        tb.dequantize(q)  # no config: the grid is never trusted
    with pytest.raises(tb.QuantizationError, match=r"does not tile w \[256, 256\] in \[64, 64\]"):
        tb.dequantize(q, config={"quant_method": "fp8", "weight_block_size": [64, 64]})
    u8 = {"w": q["w"], "w_scale_inv": torch.ones(2, 2, dtype=torch.uint8)}
    with pytest.raises(tb.QuantizationError, match="uint8: e8m0 exponents or integer codes"):
        tb.dequantize(u8, block_size=(128, 128))
    out = tb.dequantize(q, config={"quant_method": "fp8", "weight_block_size": [128, 128]})
    assert list(out) == ["w"] and out["w"].dtype == torch.bfloat16


# --- fp8 per tensor / per channel (compressed-tensors float-quantized, FBGEMM) ----------------


def test_fp8_channel_matches_compressed_tensors() -> None:
    """RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8 (compressed-tensors float-quantized):
    weight F8_E4M3 [out, in], weight_scale F32 [out, 1], input_scale F32 [1]."""
    ct = pytest.importorskip("compressed_tensors.quantization", reason="reference")
    from compressed_tensors.quantization.lifecycle.forward import dequantize as ct_dequantize

    w = torch.randn(64, 96)
    scale = w.abs().amax(dim=1, keepdim=True) / 448
    codes = (w / scale).to(torch.float8_e4m3fn)
    args = ct.QuantizationArgs(num_bits=8, type="float", strategy="channel", symmetric=True)
    ref = ct_dequantize(codes, scale, args=args, dtype=torch.bfloat16)
    sd = {
        "model.layers.0.mlp.down_proj.weight": codes,
        "model.layers.0.mlp.down_proj.weight_scale": scale,
        "model.layers.0.mlp.down_proj.input_scale": torch.ones(1),
        "model.norm.weight": torch.ones(64),
    }
    config = {"quant_method": "compressed-tensors", "format": "float-quantized"}
    out = tb.dequantize(sd, config=config)
    assert list(out) == ["model.layers.0.mlp.down_proj.weight", "model.norm.weight"]
    assert ref.dtype == torch.float32  # its product in float32, then one rounding: ours
    assert torch.equal(out["model.layers.0.mlp.down_proj.weight"], ref.to(torch.bfloat16))
    p = plan(
        {k: (tb.resolve_dtype(v.dtype), tuple(v.shape)) for k, v in sd.items()},
        read_config(None) or None,
        "fp8",
    )
    assert p.dropped == ("model.layers.0.mlp.down_proj.input_scale",)


def test_fp8_per_tensor_from_names() -> None:
    """ModelOpt FP8 / FBGEMM per-tensor: weight fp8 + weight_scale F32 []."""
    codes = torch.randn(8, 16).to(torch.float8_e4m3fn)
    out = tb.dequantize({"w": codes, "w_scale": torch.tensor(0.5)}, dtype="f32")
    assert torch.equal(out["w"], codes.float() * 0.5)
    with pytest.raises(tb.QuantizationError, match=r"does not tile w \[8, 16\] per tensor"):
        tb.dequantize({"w": codes, "w_scale": torch.ones(8, 2)})


# --- MX: torchao's to_mx / to_dtype ----------------------------------------------------------


@pytest.mark.parametrize(
    ("scheme", "element"),
    [("mxfp8", "float8_e4m3fn"), ("mxfp8", "float8_e5m2"), ("mxfp4", None)],
)
def test_mx_quantize_and_dequantize_match_torchao(scheme: str, element: str | None) -> None:
    mx = _torchao_mx()
    torch.manual_seed(1)
    x = torch.randn(16, 128) * torch.logspace(-3, 3, 16)[:, None]
    x[3, :32] = 0.0  # an all-zero block
    elem = getattr(torch, element) if element else torch.float4_e2m1fn_x2
    ref_scale, ref_data = mx.to_mx(x, elem, 32)
    ours = tb.quantize(x, scheme, **({"element": element} if element else {}))
    assert np.array_equal(bits(ours["weight_scale"]), bits(ref_scale))
    assert np.array_equal(bits(ours["weight"]), bits(ref_data.view(torch.uint8)))
    for dtype in (torch.bfloat16, torch.float32):
        ref = mx.to_dtype(ref_data, ref_scale, elem, 32, dtype)
        got = tb.dequantize(ours["weight"], ours["weight_scale"], scheme=scheme, dtype=dtype)
        assert np.array_equal(bits(got), bits(ref))


def test_mx_u8_scale_is_refused_without_config() -> None:
    codes = torch.zeros(4, 16, dtype=torch.uint8)
    scale = torch.full((4, 1), 127, dtype=torch.uint8)
    with pytest.raises(
        tb.QuantizationError, match=r"w_scale is U8: it could hold e8m0.*scheme='mxfp4'"
    ):
        tb.dequantize({"w": codes, "w_scale": scale})
    out = tb.dequantize({"w": codes, "w_scale": scale}, scheme="mxfp4")
    assert out["w"].shape == (4, 32)


def gpt_oss_experts(e: int, hidden: int, inter: int) -> dict[str, torch.Tensor]:
    """openai/gpt-oss-20b: model.layers.N.mlp.experts.{gate_up_proj,down_proj}_{blocks,scales}
    U8 [E, out, in/32, 16] / U8 [E, out, in/32]; biases bf16; config quant_method "mxfp4".
    The model loads gate_up_proj [E, hidden, 2 * inter] and down_proj [E, inter, hidden]."""
    torch.manual_seed(2)
    pre = "model.layers.0.mlp.experts."
    sd: dict[str, torch.Tensor] = {}
    sd.update(
        tb.quantize(
            torch.randn(e, hidden, 2 * inter), "mxfp4", name=pre + "gate_up_proj", layout="gpt-oss"
        )
    )
    sd[pre + "gate_up_proj_bias"] = torch.randn(e, 2 * inter).bfloat16()
    sd.update(
        tb.quantize(
            torch.randn(e, inter, hidden), "mxfp4", name=pre + "down_proj", layout="gpt-oss"
        )
    )
    sd[pre + "down_proj_bias"] = torch.randn(e, hidden).bfloat16()
    return sd


def test_gpt_oss_square_down_proj_transposed_like_transformers(tmp_path: Path) -> None:
    sd = gpt_oss_experts(4, 64, 32)
    pre = "model.layers.0.mlp.experts."
    assert sd[pre + "down_proj_blocks"].shape == (4, 64, 1, 16)  # [E, out=hidden, G, 16]
    d = tmp_path / "gpt-oss"
    tb.save(sd, d / "model.safetensors")
    (d / "config.json").write_text(
        json.dumps(
            {
                "quantization_config": {
                    "quant_method": "mxfp4",
                    "modules_to_not_convert": ["model.layers.*.self_attn"],
                }
            }
        )
    )
    out = tb.load(d, dequantize="bf16", framework="torch")
    assert sorted(out) == sorted(
        pre + n for n in ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")
    )
    for proj, shape in (("gate_up_proj", (4, 64, 64)), ("down_proj", (4, 32, 64))):
        ref = mxfp4_ref.convert_moe_packed_tensors(
            sd[pre + proj + "_blocks"], sd[pre + proj + "_scales"], dtype=torch.bfloat16
        )
        assert out[pre + proj].shape == ref.shape == shape
        assert torch.equal(out[pre + proj].view(torch.int16), ref.view(torch.int16))
    # square: a missing transpose keeps the shape and scrambles the weights
    sq = tb.quantize(torch.randn(2, 64, 64), "mxfp4", name="d", layout="gpt-oss")
    got = tb.dequantize(sq["d_blocks"], sq["d_scales"], scheme="mxfp4", layout="gpt-oss")
    ref = mxfp4_ref.convert_moe_packed_tensors(sq["d_blocks"], sq["d_scales"], dtype=torch.bfloat16)
    assert torch.equal(got, ref) and not torch.equal(got, ref.transpose(1, 2))


# --- NVFP4: ModelOpt (multiply) and compressed-tensors (divide) -------------------------------


def test_nvfp4_modelopt_matches_torchao() -> None:
    nv = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor", reason="reference")
    x = torch.randn(32, 64) * 5
    per_tensor = nv.per_tensor_amax_to_scale(x.abs().amax())
    ref_scale, ref_data = nv.nvfp4_quantize(x, 16, per_tensor)
    q = tb.quantize(x, "nvfp4-modelopt")
    assert np.array_equal(bits(q["weight"]), bits(ref_data))
    assert np.array_equal(bits(q["weight_scale"]), bits(ref_scale))
    assert torch.equal(q["weight_scale_2"], per_tensor.reshape(()))
    t = nv.NVFP4Tensor(ref_data, ref_scale, 16, torch.bfloat16, per_tensor_scale=per_tensor)
    ref = t.dequantize(torch.bfloat16)
    sd = {
        "layers.0.weight": q["weight"],
        "layers.0.weight_scale": q["weight_scale"],
        "layers.0.weight_scale_2": q["weight_scale_2"],
        "layers.0.input_scale": torch.ones(()),
    }
    out = tb.dequantize(sd, config={"quant_method": "modelopt", "quant_algo": "NVFP4"})
    assert list(out) == ["layers.0.weight"]
    assert torch.equal(out["layers.0.weight"].view(torch.int16), ref.view(torch.int16))


def test_nvfp4_compressed_tensors_matches_its_decompressor() -> None:
    """nvidia / RedHatAI NVFP4 exports by llm-compressor: weight_packed U8 [out, in/2],
    weight_scale F8_E4M3 [out, in/16], weight_global_scale F32 [1], input_global_scale."""
    pytest.importorskip("compressed_tensors", reason="reference")
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme

    x = torch.randn(32, 64)
    q = tb.quantize(x, "nvfp4-compressed-tensors")
    scheme = preset_name_to_scheme("NVFP4", ["Linear"])
    ref = NVFP4PackedCompressor.decompress(dict(q), scheme)["weight"]
    sd = {
        "l.weight_packed": q["weight_packed"],
        "l.weight_scale": q["weight_scale"],
        "l.weight_global_scale": q["weight_global_scale"],
        "l.input_global_scale": torch.ones(1),
    }
    config = {
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "config_groups": {"group_0": {"format": "nvfp4-pack-quantized"}},
    }
    out = tb.dequantize(sd, config=config, dtype=ref.dtype)
    assert list(out) == ["l.weight"] and torch.equal(out["l.weight"], ref)
    # the two conventions hold reciprocal global scales: the same weight either way
    mo = tb.quantize(x, "nvfp4-modelopt")
    assert torch.equal(mo["weight"], q["weight_packed"])
    a = tb.dequantize(
        mo["weight"],
        mo["weight_scale"],
        global_scale=mo["weight_scale_2"],
        scheme="nvfp4-modelopt",
        dtype="f32",
    )
    b = tb.dequantize(
        q["weight_packed"],
        q["weight_scale"],
        global_scale=q["weight_global_scale"],
        scheme="nvfp4-ct",
        dtype="f32",
    )
    assert torch.allclose(a, b, rtol=1e-6, atol=0)


def test_nvfp4_refusals() -> None:
    q = tb.quantize(torch.randn(8, 32), "nvfp4-modelopt", name="w")
    with pytest.raises(
        tb.QuantizationError,
        match=r"w_scale looks like NVFP4, whose convention is never guessed.*nvfp4-modelopt",
    ):
        tb.dequantize(q)  # never guessed
    with pytest.raises(tb.QuantizationError, match="scheme='nvfp4' does not say whose convention"):
        tb.dequantize(q, scheme="nvfp4")
    missing = {k: v for k, v in q.items() if k != "w_scale_2"}
    with pytest.raises(
        tb.QuantizationError, match=r"no global scale w_scale_2.*off by a constant factor"
    ):
        tb.dequantize(missing, scheme="nvfp4-modelopt")
    ct_config = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}
    with pytest.raises(
        tb.QuantizationError, match=r"w_scale_2 is there: the config says compressed-tensors"
    ):
        tb.dequantize(
            {"w_packed": q["w"], "w_scale": q["w_scale"], "w_scale_2": q["w_scale_2"]},
            config=ct_config,
        )
    bad = dict(q, w_scale=q["w_scale"][:, :1].contiguous())
    with pytest.raises(tb.QuantizationError, match=r"w_scale \[8, 1\] does not tile w \[8, 16\]"):
        tb.dequantize(bad, scheme="nvfp4-modelopt")


# --- detection, refusals, files and the command line -------------------------------------------


def test_unsupported_method_and_orphans_are_refused(tmp_path: Path) -> None:
    with pytest.raises(
        tb.QuantizationError, match=r"quant_method 'bitsandbytes'.*use bitsandbytes"
    ):
        tb.dequantize({"w": torch.ones(2)}, config={"quant_method": "bitsandbytes"})
    q = tb.quantize(torch.randn(128, 128), "fp8-block", name="w")
    q["v_scale_inv"] = torch.ones(1)
    with pytest.raises(tb.QuantizationError, match="v_scale_inv has no weight v beside it"):
        tb.dequantize(q, block_size=(128, 128))
    plain = {"w": torch.ones(3)}
    assert tb.dequantize(plain)["w"] is plain["w"]  # nothing quantized: passed through


def test_detection_from_names_asks_each_scheme(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a config, detection asks every scheme of the registry what the names say
    (``Scheme.from_names``): a scheme added to the registry is found with no change to
    ``quant/detect.py``."""
    from tensorbridge.quant import SCHEMES, Group, Scheme

    class Toy(Scheme):
        name = "toy"
        summary = numerics = "a test's scheme"
        part_suffixes = ("_toy",)

        def from_names(self, index: Any, options: Any) -> list[Group]:
            return [
                self.make_group(n[: -len("_toy")], {"codes": n}, index, options)
                for n in index
                if n.endswith("_toy")
            ]

        def detect(self, index: Any, config: Any, options: Any) -> list[Group]:
            return []

        def make_group(self, name: str, parts: Any, index: Any, options: Any) -> Group:
            return Group(name, self.name, dict(parts), index[parts["codes"]][1])

        def kernel(self, parts: Any, group: Group) -> torch.Tensor:
            return parts["codes"].to(torch.float32)

    i8 = tb.resolve_dtype("int8")
    index = {"a.weight_toy": (i8, (2, 3)), "a.bias": (i8, (2,))}
    assert not plan(index).quantized  # no scheme of the registry claims the names
    monkeypatch.setitem(SCHEMES, "toy", Toy())
    p = plan(index)
    assert [(g.name, g.scheme, g.parts["codes"]) for g in p.groups] == [
        ("a.weight", "toy", "a.weight_toy")
    ]
    assert p.schemes == ("toy",) and p.passthrough == ("a.bias",)


def test_detection_from_names_names_no_scheme() -> None:
    """``quant/detect.py`` asks the registry: its detection from names writes no scheme's
    name or alias, and nothing there picks a scheme out of ``SCHEMES`` by name."""
    import ast

    from tensorbridge.quant import SCHEMES, detect

    tree = ast.parse(Path(detect.__file__).read_text())
    names = {n for s in SCHEMES.values() for n in (s.name, *s.aliases, *s.ambiguous)}
    by_name = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and node.value.id == "SCHEMES"
        and isinstance(node.slice, ast.Constant)
    ]
    assert not by_name
    from_names = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "_from_names"
    )
    texts = [
        node.value
        for node in ast.walk(from_names)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]
    assert not [t for t in texts for n in names if n in t.split("'")]


def test_convert_streams_and_drops_quantization_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    names = {
        "model.layers.0.self_attn.kv_a_proj_with_mqa.weight": (576, 256),
        "model.layers.0.mlp.down_proj.weight": (128, 384),
    }
    d = deepseek_dir(tmp_path, names, shard=100_000)
    out_dir = tmp_path / "out"
    assert (
        main(["convert", str(d), str(out_dir) + "/", "--dequantize", "bf16", "--json", "-q"]) == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert "fp8-block: 2 quantized weights" in summary["dequantized"]
    config = json.loads((out_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "deepseek_v3"
    from safetensors.torch import load_file

    got = load_file(out_dir / "model.safetensors")
    ref = tb.load(d, dequantize="bf16", framework="torch")
    assert sorted(got) == sorted(ref)
    for k in got:
        assert torch.equal(got[k].view(torch.int16), ref[k].view(torch.int16))
    with tb.open(d) as raw:  # the non-quantized tensors, bit for bit
        assert np.array_equal(bits(got["model.norm.weight"]), bits(raw["model.norm.weight"]))


def test_inspect_names_the_scheme(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = deepseek_dir(tmp_path, {"a.weight": (128, 128)})
    assert main(["inspect", str(d), "-q"]) == 0
    text = capsys.readouterr().out
    assert "quantized: fp8-block: 1 quantized weights (block size [128, 128])" in text
    assert main(["inspect", str(d), "-q", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)[0]["quantization"]
    assert report["weights"]["a.weight"] == {
        "scheme": "fp8-block",
        "codes": "a.weight",
        "scale": "a.weight_scale_inv",
    }


def test_numpy_in_numpy_out() -> None:
    q = tb.quantize(np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32), "mxfp8")
    assert q["weight"].dtype == np.dtype(ml_dtypes.float8_e4m3fn)
    out = tb.dequantize(q["weight"], q["weight_scale"], scheme="mxfp8")
    assert isinstance(out, np.ndarray) and out.dtype == np.dtype(ml_dtypes.bfloat16)
    assert os.fspath(".")  # keep os imported for path helpers


def test_code_tables_are_ml_dtypes_values_bit_for_bit() -> None:
    """The e2m1 and e8m0 tables are written from the OCP MX spec (no ml_dtypes import)."""
    from tensorbridge.quant import codes

    every = np.arange(256, dtype=np.uint8)
    fp4 = every[:16].view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    e8m0 = every.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    assert codes.FP4_VALUES.tobytes() == fp4.tobytes()  # -0.0 at code 8 included
    assert codes._E8M0_VALUES.tobytes() == e8m0.tobytes()  # NaN 0x7fc00000 at 255


_STREAM_CHILD = """
import sys, threading, time
import torch
torch.set_num_threads(int(sys.argv[3]))  # the stream's worker threads
import tensorbridge as tb
import tensorbridge.io, tensorbridge.quant.api, tensorbridge.io.safetensors  # imports: not measured
import ml_dtypes  # imported on first need since the table is built without it: not measured
from tensorbridge.cli import main

def anon():
    return status("RssAnon")

peak = [0]
def watch(stop):
    while not stop.is_set():
        peak[0] = max(peak[0], anon())
        time.sleep(0.001)

def measured(fn):
    stop = threading.Event()
    base = anon()
    peak[0] = base
    t = threading.Thread(target=watch, args=(stop,))
    t.start()
    fn()
    stop.set()
    t.join()
    return peak[0] - base

import contextlib, io
with contextlib.redirect_stdout(io.StringIO()):
    streamed = measured(lambda: main(["convert", sys.argv[1], sys.argv[2], "--dequantize", "bf16"]))
naive = measured(lambda: tb.load(sys.argv[1], dequantize="bf16"))
print(streamed, naive)
"""


@pytest.mark.slow  # 64 MiB of codes dequantized to 128 MiB, twice, in a child
@pytest.mark.parametrize(("threads", "bound"), [(1, 16), (2, 28)])
def test_convert_dequantize_peak_anonymous_memory_is_bounded(
    tmp_path: Path, threads: int, bound: int
) -> None:
    """64 MiB of fp8 codes become 128 MiB of bf16: the stream holds a few chunks (one a
    worker thread, one being written, about 4 MiB each) and each worker's temporaries,
    not a 32 MiB weight."""
    from _peak_rss import run_child

    g = torch.Generator().manual_seed(3)
    sd: dict[str, torch.Tensor] = {}
    for i in range(4):
        codes = torch.randint(0, 0x7E, (4096, 4096), dtype=torch.uint8, generator=g)
        sd[f"layers.{i}.weight"] = codes.view(torch.float8_e4m3fn)
        sd[f"layers.{i}.weight_scale_inv"] = torch.rand(32, 32, generator=g)
    d = tmp_path / "big"
    tb.save(sd, d / "model.safetensors")
    (d / "config.json").write_text(
        json.dumps(
            {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
        )
    )
    del sd
    streamed, naive = map(
        int, run_child(_STREAM_CHILD, str(d), str(tmp_path / "o.safetensors"), str(threads)).split()
    )
    assert naive > 100 << 20, "the measure misses the naive route's 128 MiB"
    assert streamed < bound << 20, f"anonymous memory grew {streamed >> 20} MiB while streaming"


# --- GPTQ and AWQ: the reference unpacking, verbatim from their toolkits ----------------------


def autogptq_dequantize(qweight, qzeros, scales, g_idx, bits):  # type: ignore[no-untyped-def]
    """AutoGPTQ's torch path (qlinear_cuda_old.py, ``forward``'s dequantization), fp16."""
    wf = torch.tensor(list(range(0, 32, bits)), dtype=torch.int32).unsqueeze(0)
    zeros = torch.bitwise_right_shift(
        torch.unsqueeze(qzeros, 2).expand(-1, -1, 32 // bits), wf.unsqueeze(0)
    ).to(torch.int16 if bits == 8 else torch.int8)
    zeros = zeros + 1
    zeros = torch.bitwise_and(zeros, (2**bits) - 1)
    zeros = zeros.reshape(scales.shape)
    weight = torch.bitwise_right_shift(
        torch.unsqueeze(qweight, 1).expand(-1, 32 // bits, -1), wf.unsqueeze(-1)
    ).to(torch.int16 if bits == 8 else torch.int8)
    weight = torch.bitwise_and(weight, (2**bits) - 1)
    weight = weight.reshape(-1, weight.shape[2])
    return scales[g_idx.long()] * (weight - zeros[g_idx.long()])  # [in, out]


def awq_dequantize_gemm(qweight, qzeros, scales, bits, group_size):  # type: ignore[no-untyped-def]
    """AutoAWQ 0.2.9, awq/utils/packing_utils.py (unpack_awq, reverse_awq_order,
    dequantize_gemm), MIT licence."""
    shifts = torch.arange(0, 32, bits)
    iweights = torch.bitwise_right_shift(qweight[:, :, None], shifts[None, None, :]).to(torch.int8)
    iweights = iweights.view(iweights.shape[0], -1)
    izeros = torch.bitwise_right_shift(qzeros[:, :, None], shifts[None, None, :]).to(torch.int8)
    izeros = izeros.view(izeros.shape[0], -1)
    order = torch.arange(iweights.shape[-1], dtype=torch.int32).view(-1, 32 // bits)
    order = order[:, [0, 4, 1, 5, 2, 6, 3, 7]].view(-1)
    izeros, iweights = izeros[:, order], iweights[:, order]
    iweights = torch.bitwise_and(iweights, (2**bits) - 1)
    izeros = torch.bitwise_and(izeros, (2**bits) - 1)
    scales = scales.repeat_interleave(group_size, dim=0)
    izeros = izeros.repeat_interleave(group_size, dim=0)
    return (iweights - izeros) * scales  # [in, out]


def _pack(codes: torch.Tensor, bits: int, order: list[int] | None = None) -> torch.Tensor:
    """Pack along the last axis, 32 // bits codes a word (``order[j]``: the code in slot j)."""
    per = 32 // bits
    c = codes.to(torch.int64).reshape(*codes.shape[:-1], -1, per)
    if order is not None:
        c = c[..., order]
    word = sum(c[..., j] << (j * bits) for j in range(per))
    return ((word + 2**31) % 2**32 - 2**31).to(torch.int32)


def gptq_layer(bits: int, v2: bool, symmetric: bool = False) -> dict[str, torch.Tensor]:
    """TheBloke/Llama-2-7B-GPTQ (desc_act: act-order g_idx): q_proj.qweight / qzeros /
    scales / g_idx, here for in=256, out=64, group size 32."""
    g = torch.Generator().manual_seed(bits)
    n_in, out, gs, top = 256, 64, 32, 2**bits
    q = torch.randint(0, top, (n_in, out), generator=g)
    zeros = (
        torch.full((n_in // gs, out), top // 2)
        if symmetric
        else torch.randint(0, top, (n_in // gs, out), generator=g)
    )
    stored = zeros if v2 else (zeros - 1) & (top - 1)
    g_idx = (torch.randperm(n_in, generator=g) // gs).to(torch.int32)  # act-order
    pre = "model.layers.0.self_attn.q_proj."
    return {
        pre + "qweight": _pack(q.t(), bits).t().contiguous(),
        pre + "qzeros": _pack(stored, bits),
        pre + "scales": (torch.rand(n_in // gs, out, generator=g) / 50).half(),
        pre + "g_idx": g_idx,
        pre + "bias": torch.zeros(out, dtype=torch.float16),
    }


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_gptq_v1_act_order_matches_autogptq(bits: int) -> None:
    sd = gptq_layer(bits, v2=False)
    pre = "model.layers.0.self_attn.q_proj."
    ref = autogptq_dequantize(
        sd[pre + "qweight"], sd[pre + "qzeros"], sd[pre + "scales"], sd[pre + "g_idx"], bits
    )
    config = {
        "quant_method": "gptq",
        "bits": bits,
        "group_size": 32,
        "desc_act": True,
        "checkpoint_format": "gptq",
    }
    out = tb.dequantize(sd, config=config, dtype="f16")
    assert sorted(out) == [pre + "bias", pre + "weight"]
    assert out[pre + "weight"].shape == (64, 256)  # the Linear's [out, in]
    # AutoGPTQ multiplies in fp16: the exact product rounded once, as ours to fp16
    assert torch.equal(out[pre + "weight"], ref.t())


def test_gptq_v2_and_the_unknown_format() -> None:
    pre = "model.layers.0.self_attn.q_proj."
    v1, v2 = gptq_layer(4, v2=False), gptq_layer(4, v2=True)
    base = {"quant_method": "gptq", "bits": 4, "group_size": 32}
    a = tb.dequantize(v1, config={**base, "checkpoint_format": "gptq"})[pre + "weight"]
    b = tb.dequantize(v2, config={**base, "checkpoint_format": "gptq_v2"})[pre + "weight"]
    assert torch.equal(a, b)  # the same weights, zeros stored two ways
    assert torch.equal(tb.dequantize(v1, config=base)[pre + "weight"], a)  # no format: v1
    sym = gptq_layer(4, v2=False, symmetric=True)  # AutoGPTQ symmetric: every stored zero 7
    ref = autogptq_dequantize(*(sym[pre + k] for k in ("qweight", "qzeros", "scales", "g_idx")), 4)
    assert torch.equal(tb.dequantize(sym, config=base, dtype="f16")[pre + "weight"], ref.t())
    with pytest.raises(tb.QuantizationError, match=r"qweight is int-packed \(GPTQ or AWQ"):
        tb.dequantize(v1)
    one = tb.dequantize(
        *(v2[pre + k] for k in ("qweight", "scales")),
        zeros=v2[pre + "qzeros"],
        g_idx=v2[pre + "g_idx"],
        scheme="gptq",
        config={"bits": 4, "group_size": 32, "checkpoint_format": "gptq_v2"},
    )
    assert torch.equal(one, b)  # one weight, parts by keyword


@pytest.mark.parametrize("sym", [False, True], ids=["asym", "sym"])
@pytest.mark.parametrize("desc_act", [False, True], ids=["in-order", "act-order"])
def test_gptq_quantize_config_without_a_format_is_autogptq_v1(
    sym: bool, desc_act: bool, tmp_path: Path
) -> None:
    """Most published GPTQ models (TheBloke's, AutoGPTQ exports): ``quantize_config.json``
    with bits / group_size / desc_act / sym and no format key. transformers' GPTQConfig
    defaults ``format`` to ``"gptq"`` (v1, zeros stored minus one): read as AutoGPTQ does."""
    pre = "model.layers.0.self_attn.q_proj."
    sd = gptq_layer(4, v2=False, symmetric=sym)
    if not desc_act:  # AutoGPTQ writes g_idx either way; in order it is i // group_size
        sd[pre + "g_idx"] = (torch.arange(256) // 32).to(torch.int32)
    ref = autogptq_dequantize(*(sd[pre + k] for k in ("qweight", "qzeros", "scales", "g_idx")), 4)
    d = tmp_path / "model"
    tb.save(sd, d / "model.safetensors")
    cfg = {
        "bits": 4,
        "group_size": 32,
        "damp_percent": 0.01,
        "desc_act": desc_act,
        "sym": sym,
        "true_sequential": True,
        "model_name_or_path": None,
        "model_file_base_name": "model",
    }
    (d / "quantize_config.json").write_text(json.dumps(cfg))
    with tb.open(d, dequantize="f16") as f:
        got = f.get(pre + "weight", framework="torch")
    assert np.array_equal(bits(got), bits(ref.t().contiguous()))


@pytest.mark.parametrize(
    ("said", "given"),
    [
        (
            {"checkpoint_format": "gptq", "format": "gptq_v2"},
            "checkpoint_format: 'gptq', format: 'gptq_v2'",
        ),
        (
            {"is_marlin_format": True, "checkpoint_format": "gptq"},
            "checkpoint_format: 'gptq', is_marlin_format: True",
        ),
    ],
)
def test_gptq_config_that_contradicts_itself_is_refused(said: dict[str, Any], given: str) -> None:
    base = {"quant_method": "gptq", "bits": 4, "group_size": 32}
    with pytest.raises(
        tb.QuantizationError,
        match=rf"^the GPTQ config contradicts itself \({re.escape(given)}\); keep the one that "
        r"names the checkpoint's format and remove the others$",
    ):
        tb.dequantize(gptq_layer(4, v2=False), config={**base, **said})
    agree = {**base, "checkpoint_format": "gptq_v2", "format": "GPTQ_V2"}  # the same, twice
    v2 = gptq_layer(4, v2=True)
    pre = "model.layers.0.self_attn.q_proj."
    assert torch.equal(
        tb.dequantize(v2, config=agree)[pre + "weight"],
        tb.dequantize(gptq_layer(4, v2=False), config=base)[pre + "weight"],
    )
    with pytest.raises(tb.QuantizationError, match=r"checkpoint_format 'marlin' is not one"):
        tb.dequantize(v2, config={**base, "is_marlin_format": True})  # AutoGPTQ <= 0.7.1


def test_awq_gemm_packing_order_matches_autoawq() -> None:
    """TheBloke/Llama-2-7B-AWQ (version "gemm"): qweight I32 [in, out/8], qzeros
    I32 [in/128, out/8], scales F16 [in/128, out]."""
    g = torch.Generator().manual_seed(5)
    n_in, out, gs = 256, 64, 128
    q = torch.randint(0, 16, (n_in, out), generator=g)
    z = torch.randint(0, 16, (n_in // gs, out), generator=g)
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    pre = "model.layers.0.mlp.down_proj."
    sd = {
        pre + "qweight": _pack(q, 4, order),
        pre + "qzeros": _pack(z, 4, order),
        pre + "scales": (torch.rand(n_in // gs, out, generator=g) / 50).half(),
    }
    ref = awq_dequantize_gemm(sd[pre + "qweight"], sd[pre + "qzeros"], sd[pre + "scales"], 4, gs)
    config = {
        "quant_method": "awq",
        "bits": 4,
        "group_size": gs,
        "version": "gemm",
        "zero_point": True,
    }
    out_ = tb.dequantize(sd, config=config, dtype="f16")[pre + "weight"]
    assert out_.shape == (64, 256) and torch.equal(out_, ref.t())  # fp16: one rounding each
    in_order = awq_dequantize_gemm(_pack(q, 4), _pack(z, 4), sd[pre + "scales"], 4, gs)
    assert not torch.equal(in_order, ref)  # the order matters
    with pytest.raises(tb.QuantizationError, match="AWQ version 'gemv'"):
        tb.dequantize(sd, config={**config, "version": "gemv"})


def _every_scheme() -> list[tuple[str, dict[str, torch.Tensor], dict[str, Any]]]:
    torch.manual_seed(7)
    w, e = torch.randn(300, 256), torch.randn(3, 64, 96)
    return [
        ("fp8-block", tb.quantize(w, "fp8-block", name="a.weight"), {"block_size": (128, 128)}),
        ("mxfp8", tb.quantize(w, "mxfp8", name="a.weight"), {}),
        ("mxfp4", tb.quantize(w, "mxfp4", name="a.weight"), {}),
        ("mxfp4", tb.quantize(e, "mxfp4", name="a.experts", layout="gpt-oss"), {}),
        ("nvfp4-modelopt", tb.quantize(w, "nvfp4-modelopt", name="a.weight"), {}),
        ("nvfp4-ct", tb.quantize(w, "nvfp4-ct", name="a.weight"), {}),
        ("fp8", {"a.weight": w.to(torch.float8_e4m3fn), "a.weight_scale": torch.rand(300, 1)}, {}),
        ("gptq", gptq_layer(4, v2=True), {"config": {"quant_method": "gptq", "group_size": 32,
                                                     "checkpoint_format": "gptq_v2"}}),
    ]  # fmt: skip


@pytest.mark.parametrize("case", range(8))
def test_small_pieces_give_the_same_bits(case: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Streaming slices every weight into pieces; their concatenation is the weight."""
    from tensorbridge.quant import base

    scheme, sd, options = _every_scheme()[case]
    kw = {"scheme": scheme, **options} if "config" not in options else options
    whole = tb.dequantize(sd, **kw)
    monkeypatch.setattr(base, "PIECE_ELEMENTS", 96)  # many pieces, even inside a block row
    pieces = tb.dequantize(sd, **kw)
    assert list(whole) == list(pieces)
    for k in whole:
        assert np.array_equal(bits(whole[k]), bits(pieces[k])), k


@pytest.mark.parametrize("symmetric", [True, False])
def test_pack_quantized_matches_compressed_tensors(symmetric: bool) -> None:
    """RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16 (compressed-tensors
    pack-quantized): weight_packed I32 [out, in/8], weight_scale BF16 [out, in/128],
    weight_shape I64 [2]; asymmetric exports add weight_zero_point I32 [out/8, groups]."""
    pytest.importorskip("compressed_tensors", reason="reference")
    from compressed_tensors.compressors.pack_quantized.base import (
        PackedQuantizationCompressor,
    )
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    args = QuantizationArgs(num_bits=4, type="int", strategy="group", group_size=128,
                            symmetric=symmetric)  # fmt: skip
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    g = torch.Generator().manual_seed(11)
    w = torch.randn(64, 256, generator=g).bfloat16()
    scale = (w.float().reshape(64, 2, 128).abs().amax(-1) / 7).bfloat16()
    layer = {"weight": w, "weight_scale": scale}
    if not symmetric:
        layer["weight_zero_point"] = torch.randint(-8, 8, (64, 2), generator=g, dtype=torch.int8)
    packed = PackedQuantizationCompressor.compress(layer, scheme)
    ref = PackedQuantizationCompressor.decompress(dict(packed), scheme)["weight"]
    sd = {f"model.layers.0.mlp.up_proj.{k}": v for k, v in packed.items()}
    config = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "format": "pack-quantized",
                                      "weights": args.model_dump()}},
    }  # fmt: skip
    out = tb.dequantize(sd, config=config, dtype=ref.dtype)
    assert list(out) == ["model.layers.0.mlp.up_proj.weight"]  # weight_shape consumed
    assert torch.equal(out["model.layers.0.mlp.up_proj.weight"], ref)
    with pytest.raises(
        tb.QuantizationError, match=r"belongs to no quantized weight of this unconfigured"
    ):
        tb.dequantize(sd)  # no config: refused, never passed through as int32


def test_convert_without_config_needs_the_block_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = deepseek_dir(tmp_path, {"a.weight": (256, 128)})
    (d / "config.json").unlink()
    out = str(tmp_path / "o.safetensors")
    assert main(["convert", str(d), out, "--dequantize", "bf16", "-q"]) == 1
    assert "no block size" in capsys.readouterr().err
    assert main(["convert", str(d), out, "--dequantize", "bf16", "--block-size", "128,128"]) == 0
    with tb.open(out) as f:
        assert f.info("a.weight")[0] is tb.resolve_dtype("bf16")
    assert main(["convert", str(d), out, "--block-size", "128,128"]) == 2  # needs --dequantize


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_codes_to_float32_every_bit_pattern(name: str) -> None:
    """The integer-pass conversion gives torch's own cast bit for bit (NaN payloads too),
    and the shifted values times the factor are the same numbers."""
    from tensorbridge.quant.base import fp8_to_f32, fp8_to_f32_shifted

    codes = torch.arange(256, dtype=torch.uint8).view(getattr(torch, name))
    want = codes.to(torch.float32)
    assert torch.equal(fp8_to_f32(codes).view(torch.int32), want.view(torch.int32))
    values, factor = fp8_to_f32_shifted(codes)
    assert factor == (256.0 if name == "float8_e4m3fn" else 1.0)
    assert torch.equal((values * factor).view(torch.int32), want.view(torch.int32))
    table = np.arange(256, dtype=np.uint8).view(getattr(ml_dtypes, name)).astype(np.float32)
    assert np.array_equal(fp8_to_f32(codes).numpy(), table, equal_nan=True)


def test_fp8_scale_factor_fold_is_exact_up_to_overflow() -> None:
    """code x scale over every e4m3 code and scales from subnormal to the float32 limit
    (where folding 2**8 into the scale would overflow) equals the float32 product."""
    from tensorbridge.quant.base import fold_factor, fp8_to_f32_shifted

    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    for s in (1e-45, 1.2e-38, 3e-3, 1.0, 7.5e35, 3.0e38, float("inf")):
        scale = torch.tensor([s], dtype=torch.float32)
        values, factor = fp8_to_f32_shifted(codes)
        folded = fold_factor(values, factor, scale)
        got = values * folded
        want = codes.to(torch.float32) * scale
        assert np.array_equal(got.numpy(), want.numpy(), equal_nan=True), s
    values, huge = fp8_to_f32_shifted(codes)[0], torch.tensor([3.0e38])
    assert fold_factor(values, 256.0, huge) is huge  # not folded: the values took 2**8
    assert np.array_equal(values.numpy(), codes.to(torch.float32).numpy(), equal_nan=True)


def test_pack_quantized_int8_matches_compressed_tensors() -> None:
    """W8A16 exports (RedHatAI/...-quantized.w8a16): 8-bit codes, per-channel scales."""
    pytest.importorskip("compressed_tensors", reason="reference")
    from compressed_tensors.compressors.pack_quantized.base import (
        PackedQuantizationCompressor,
    )
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    args = QuantizationArgs(num_bits=8, type="int", strategy="channel")
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    w = torch.randn(48, 128, generator=torch.Generator().manual_seed(5)).bfloat16()
    scale = (w.float().abs().amax(-1, keepdim=True) / 127).bfloat16()
    packed = PackedQuantizationCompressor.compress({"weight": w, "weight_scale": scale}, scheme)
    ref = PackedQuantizationCompressor.decompress(dict(packed), scheme)["weight"]
    ours = tb.dequantize(packed["weight_packed"], packed["weight_scale"],
                         scheme="pack-quantized", bits=8, dtype=ref.dtype)  # fmt: skip
    assert ours.dtype == ref.dtype and torch.equal(ours, ref)


def _pack_bitstream(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """AutoGPTQ's 3-bit layout, written bit by bit (independently of the reader): along
    the last axis, each run of 32 codes is one little-endian stream in ``bits`` int32
    words, code k at bits [k * bits, (k + 1) * bits)."""
    rows, n = codes.shape
    out = np.zeros((rows, n // 32 * bits), np.uint32)
    c = codes.numpy().astype(np.uint64)
    for k in range(n):
        for b in range(bits):
            pos = (k // 32) * 32 * bits + (k % 32) * bits + b
            out[:, pos // 32] |= (
                ((c[:, k] >> np.uint64(b)) & np.uint64(1)) << np.uint64(pos % 32)
            ).astype(np.uint32)
    return torch.from_numpy(out.view(np.int32))


def test_gptq_3bit_straddling_words(monkeypatch: pytest.MonkeyPatch) -> None:
    """AutoGPTQ 3-bit (e.g. TheBloke/...-GPTQ branches gptq-3bit-128g-actorder_True):
    qweight I32 [in * 3 / 32, out], qzeros I32 [groups, out * 3 / 32], codes 10 and 21
    of every 32 straddling a word boundary; v1 zeros stored minus 1."""
    from tensorbridge.quant.base import unpack_int32

    golden = torch.tensor([[(5 << 30) & 0xFFFFFFFF, 5 >> 2]], dtype=torch.int64).to(torch.int32)
    assert unpack_int32(torch.cat([golden, torch.zeros(1, 1, dtype=torch.int32)], 1), 3)[0, 10] == 5
    g = torch.Generator().manual_seed(3)
    n_in, out, gs = 256, 64, 32
    q = torch.randint(0, 8, (n_in, out), generator=g)
    zeros = torch.randint(1, 8, (n_in // gs, out), generator=g)
    scales = (torch.rand(n_in // gs, out, generator=g) / 50).half()
    g_idx = (torch.randperm(n_in, generator=g) // gs).to(torch.int32)
    pre = "model.layers.0.mlp.down_proj."
    sd = {
        pre + "qweight": _pack_bitstream(q.t().contiguous(), 3).t().contiguous(),
        pre + "qzeros": _pack_bitstream((zeros - 1) & 7, 3),
        pre + "scales": scales,
        pre + "g_idx": g_idx,
    }
    assert sd[pre + "qweight"].shape == (24, 64) and sd[pre + "qzeros"].shape == (8, 6)
    assert torch.equal(unpack_int32(sd[pre + "qweight"].t().contiguous(), 3).t().long(), q)
    config = {"quant_method": "gptq", "bits": 3, "group_size": gs, "desc_act": True,
              "checkpoint_format": "gptq"}  # fmt: skip
    got = tb.dequantize(sd, config=config, dtype="f32")[pre + "weight"]
    want = scales.float()[g_idx.long()] * (q - zeros[g_idx.long()]).float()  # [in, out]
    assert got.shape == (64, 256) and torch.equal(got, want.t())
    from tensorbridge.quant import base

    monkeypatch.setattr(base, "PIECE_ELEMENTS", 96)  # pieces of 32 output columns
    assert torch.equal(tb.dequantize(sd, config=config, dtype="f32")[pre + "weight"], got)
    with pytest.raises(tb.QuantizationError, match=r"runs of 3 words"):
        tb.dequantize({k: v[:-1] if k.endswith("qweight") else v for k, v in sd.items()},
                      config=config)  # fmt: skip
