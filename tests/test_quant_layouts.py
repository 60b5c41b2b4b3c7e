"""Written layouts beyond each scheme's default, and the options that pick them.

* ``convert --quantize mxfp4 --layout gpt-oss``: openai/gpt-oss-20b's layout
  (``model.layers.N.mlp.experts.{gate_up_proj,down_proj}_{blocks,scales}``, U8
  ``[E, out, in / 32, 16]`` / ``[E, out, in / 32]``; config ``quant_method: "mxfp4"``
  with gpt-oss's ``modules_to_not_convert``), checked with transformers' own
  ``convert_moe_packed_tensors`` and its whole ``GptOssForCausalLM`` loader.
* ``--element e5m2`` (MXFP8 with float8_e5m2 elements): torchao's ``to_mx`` is the
  reference, over random data and the edge values (0, -0.0, subnormals, max, inf, NaN).
* ``convert x.safetensors y.gguf --metadata ...``: checked with gguf's GGUFReader.
* GPTQ / AWQ formats and widths that are refused, with their messages.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tensorbridge as tb
from tensorbridge.cli import main

PRE = "model.layers.0.mlp.experts."


def bits(t: Any) -> np.ndarray:
    a = tb.to_numpy(t) if isinstance(t, torch.Tensor) else np.asarray(t)
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _experts(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """An unquantized gpt-oss layer as transformers saves it: experts' gate_up_proj
    [E, hidden, 2 * inter] and down_proj [E, inter, hidden] (square here, as gpt-oss-20b's
    2880 x 2880), biases, attention and router weights."""
    torch.manual_seed(3)
    sd = {
        PRE + "gate_up_proj": torch.randn(4, 64, 128).bfloat16(),
        PRE + "gate_up_proj_bias": torch.randn(4, 128).bfloat16(),
        PRE + "down_proj": torch.randn(4, 64, 64).bfloat16(),
        PRE + "down_proj_bias": torch.randn(4, 64).bfloat16(),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(64, 64).bfloat16(),
        "model.layers.0.mlp.router.weight": torch.randn(4, 64).bfloat16(),
        "model.embed_tokens.weight": torch.randn(32, 64).bfloat16(),
    }
    d = tmp_path / "plain"
    tb.save(sd, d / "model.safetensors")
    (d / "config.json").write_text(json.dumps({"model_type": "gpt_oss"}))
    return d, sd


# --- gpt-oss --------------------------------------------------------------------------------


def test_convert_gpt_oss_layout_matches_transformers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mxfp4_ref = pytest.importorskip(
        "transformers.integrations.mxfp4", reason="transformers dequantizes gpt-oss"
    )
    src, sd = _experts(tmp_path)
    out = tmp_path / "q"
    argv = ["convert", str(src), f"{out}/", "--quantize", "mxfp4", "--layout", "gpt-oss"]
    assert main([*argv, "--verify", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["verified"] is True and summary["layout"] == "gpt-oss"
    assert sorted(summary["quantized_weights"]) == [PRE + "down_proj", PRE + "gate_up_proj"]
    assert json.loads((out / "config.json").read_text()) == {
        "model_type": "gpt_oss",
        "quantization_config": {
            "modules_to_not_convert": [
                "model.layers.*.self_attn",
                "model.layers.*.mlp.router",
                "model.embed_tokens",
                "lm_head",
            ],
            "quant_method": "mxfp4",
        },
    }
    from safetensors.torch import load_file

    got = load_file(out / "model.safetensors")
    shapes = {k: (str(v.dtype), tuple(v.shape)) for k, v in got.items() if "_proj_" in k}
    assert shapes == {
        PRE + "gate_up_proj_blocks": ("torch.uint8", (4, 128, 2, 16)),  # [E, out, G, 16]
        PRE + "gate_up_proj_scales": ("torch.uint8", (4, 128, 2)),
        PRE + "gate_up_proj_bias": ("torch.bfloat16", (4, 128)),
        PRE + "down_proj_blocks": ("torch.uint8", (4, 64, 2, 16)),
        PRE + "down_proj_scales": ("torch.uint8", (4, 64, 2)),
        PRE + "down_proj_bias": ("torch.bfloat16", (4, 64)),
    }
    for n in sd:  # everything but the experts' projections is copied bit for bit
        if not n.endswith(("gate_up_proj", "down_proj")):
            assert np.array_equal(bits(got[n]), bits(sd[n])), n
    with tb.open(out, dequantize="bf16") as f:
        assert sorted(f.keys()) == sorted(sd)
        for proj in ("gate_up_proj", "down_proj"):
            blocks, scales = got[PRE + proj + "_blocks"], got[PRE + proj + "_scales"]
            ref = mxfp4_ref.convert_moe_packed_tensors(blocks, scales, dtype=torch.bfloat16)
            ours = f.get(PRE + proj, framework="torch")
            assert ours.shape == ref.shape == sd[PRE + proj].shape  # [E, in, out]
            assert np.array_equal(bits(ours), bits(ref))
            q = tb.quantize(sd[PRE + proj], "mxfp4", name="x", layout="gpt-oss")
            assert torch.equal(q["x_blocks"], blocks) and torch.equal(q["x_scales"], scales)
    # the square down_proj: transposed, not merely the right shape
    down = tb.load(out, dequantize="f32", framework="torch")[PRE + "down_proj"]
    want = sd[PRE + "down_proj"].float()
    wrong = want.transpose(1, 2)
    assert (down - want).abs().mean() < 0.5 * (down - wrong).abs().mean()


def test_gpt_oss_output_loads_in_transformers_gpt_oss_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The whole route: a tiny GptOssForCausalLM saved by transformers, converted here,
    loaded back by transformers' MXFP4 loader (dequantizing on CPU): every parameter is
    the one tb.load(..., dequantize="bf16") gives."""
    transformers = pytest.importorskip("transformers", reason="transformers loads gpt-oss")
    cfg = transformers.GptOssConfig(
        vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, num_local_experts=4,
        num_experts_per_tok=2, layer_types=["full_attention"],
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.GptOssForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path / "plain")
    out = tmp_path / "q"
    argv = ["convert", str(tmp_path / "plain"), f"{out}/", "--quantize", "mxfp4"]
    assert main([*argv, "--layout", "gpt-oss", "-q"]) == 0
    capsys.readouterr()
    model = transformers.GptOssForCausalLM.from_pretrained(
        out,
        quantization_config=transformers.Mxfp4Config(dequantize=True),
        dtype=torch.bfloat16,
    )
    theirs = model.state_dict()
    ours = tb.load(out, dequantize="bf16", framework="torch")
    assert sorted(theirs) == sorted(ours)
    for k in ours:
        assert np.array_equal(bits(theirs[k]), bits(ours[k])), k


def test_gpt_oss_streams_slices_with_the_same_bits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensorbridge.quant import base

    src, _ = _experts(tmp_path)
    argv = ["convert", str(src), "", "--quantize", "mxfp4", "--layout", "gpt-oss", "-q"]
    argv[2] = str(tmp_path / "whole.safetensors")
    assert main(argv) == 0
    monkeypatch.setattr(base, "PIECE_ELEMENTS", 40)  # one output column a slice
    argv[2] = str(tmp_path / "sliced.safetensors")
    assert main(argv) == 0
    capsys.readouterr()
    whole, sliced = (tmp_path / "whole.safetensors"), (tmp_path / "sliced.safetensors")
    assert whole.read_bytes() == sliced.read_bytes()


def test_gpt_oss_ignore_and_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, _ = _experts(tmp_path)
    out = tmp_path / "q"
    argv = ["convert", str(src), f"{out}/", "--quantize", "mxfp4", "--layout", "gpt-oss"]
    assert main([*argv, "--ignore", PRE + "down_proj"]) == 1
    assert capsys.readouterr().err.endswith(
        f"error: {PRE}down_proj is left unquantized but model.layers.0.mlp.experts's other "
        "projection is not: transformers' gpt-oss MXFP4 loader converts a whole experts "
        "module; ignore both (--ignore 'model.layers.0.mlp.experts.*') or neither\n"
    )
    assert not out.exists()
    assert main([*argv, "--ignore", PRE + "*", "-q"]) == 1
    assert "(3-D float ...experts.gate_up_proj / down_proj tensors); nothing to" in (
        capsys.readouterr().err
    )
    from tensorbridge.quant.write import skip_reason

    f32 = tb.resolve_dtype("float32")
    assert skip_reason(PRE + "down_proj", f32, (2, 40, 64), "mxfp4", layout="gpt-oss") == (
        "40 inputs (the [E, in, out] weight's middle axis) are not a multiple of mxfp4's "
        "32-value blocks"
    )
    assert skip_reason(PRE + "down_proj_bias", f32, (2, 64), "mxfp4", layout="gpt-oss") == (
        "not a gpt-oss expert projection (3-D ...experts.gate_up_proj / down_proj)"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--layout", "gpt-oss"], "--layout says how --quantize writes weights; pass --quantize"),
        (["--element", "e5m2"], "--element says how --quantize writes weights; pass --quantize"),
        (
            ["--quantize", "mxfp8", "--layout", "gpt-oss"],
            "--layout gpt-oss: mxfp8 is written in its published layout only; leave out "
            "--layout (other layouts: mxfp4 (gpt-oss))",
        ),
        (
            ["--quantize", "mxfp4", "--layout", "torchao"],
            "--layout torchao: mxfp4 is written as compressed-tensors (the default) or "
            "gpt-oss; pass one of those",
        ),
        (
            ["--quantize", "mxfp4", "--element", "e5m2"],
            "--element e5m2: the element type is mxfp8's choice (e4m3 or e5m2); mxfp4's is "
            "fixed, leave out --element",
        ),
        (
            ["--quantize", "mxfp8", "--element", "e3m4"],
            "--element e3m4: mxfp8's elements are e4m3 (float8_e4m3fn, the default) or e5m2 "
            "(float8_e5m2); pass one of those",
        ),
    ],
)
def test_layout_and_element_usage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    src, _ = _experts(tmp_path)
    assert main(["convert", str(src), str(tmp_path / "o.safetensors"), *argv]) == 2
    assert capsys.readouterr().err.endswith(f"error: {message}\n")
    assert not (tmp_path / "o.safetensors").exists()


# --- MXFP8 with e5m2 elements -----------------------------------------------------------


def _edge_blocks() -> torch.Tensor:
    """Rows of 32-value blocks at the edges: zeros and -0.0, float32 subnormals, e5m2's
    max and beyond, float32's max, inf, -inf and NaN among ordinary values."""
    f32 = torch.finfo(torch.float32)
    rows = [
        torch.zeros(32),
        torch.full((32,), -0.0),
        torch.full((32,), f32.smallest_normal / 8) * torch.arange(32),  # subnormals
        torch.full((32,), 57344.0) * torch.linspace(-1, 1, 32),  # e5m2's max
        torch.linspace(-1, 1, 32) * 1e5,  # beyond it: the scale moves up
        torch.linspace(-1, 1, 32) * f32.max,
        torch.linspace(-1, 1, 32) * 2.0**-140,
    ]
    for special in (float("inf"), float("-inf"), float("nan")):
        r = torch.linspace(-3, 3, 32)
        r[5] = special
        rows.append(r)
    x = torch.stack(rows)
    x[1, 7] = 1e-30  # a tiny value among -0.0s
    return x


@pytest.mark.parametrize("element", ["e5m2", "e4m3"])
@pytest.mark.parametrize("source", ["float32", "bfloat16"])
def test_mxfp8_elements_match_torchao_bit_for_bit(element: str, source: str) -> None:
    mx = pytest.importorskip(
        "torchao.prototype.mx_formats.mx_tensor", reason="torchao is the MX reference"
    )
    torch.manual_seed(4)
    random = torch.randn(24, 128) * torch.logspace(-30, 30, 24)[:, None]
    edges = _edge_blocks().reshape(-1, 64)  # two blocks a row
    x = torch.cat([random.reshape(-1, 64), edges]).to(getattr(torch, source))
    elem = torch.float8_e5m2 if element == "e5m2" else torch.float8_e4m3fn
    ref_scale, ref_data = mx.to_mx(x, elem, 32)  # FLOOR: torchao's default, the OCP spec's
    ours = tb.quantize(x, "mxfp8", element=element)
    assert ours["weight"].dtype == elem and ours["weight_scale"].dtype == torch.float8_e8m0fnu
    assert np.array_equal(bits(ours["weight_scale"]), bits(ref_scale))
    assert np.array_equal(bits(ours["weight"]), bits(ref_data))
    # and the same by torch's own dtype name
    same = tb.quantize(x, "mxfp8", element=str(elem))
    assert np.array_equal(bits(same["weight"]), bits(ours["weight"]))
    for dtype in (torch.bfloat16, torch.float32):
        ref = mx.to_dtype(ref_data, ref_scale, elem, 32, dtype)
        got = tb.dequantize(ours["weight"], ours["weight_scale"], scheme="mxfp8", dtype=dtype)
        assert np.array_equal(bits(got), bits(ref))


def test_mxfp8_e5m2_edge_policy() -> None:
    """What torchao does (the bits are compared above), stated: zeros take the smallest
    scale; inf takes the scale of 2**128 and saturates; a NaN makes the block's scale
    NaN."""
    q = tb.quantize(_edge_blocks(), "mxfp8", element="e5m2")
    scale = q["weight_scale"].view(torch.uint8)[:, 0].tolist()
    codes = q["weight"].float()
    assert scale[0] == 0 and codes[0].eq(0).all()  # zeros: the smallest scale, 2**-127
    assert torch.equal(
        q["weight"][1].view(torch.uint8)[:7], torch.full((7,), 0x80, dtype=torch.uint8)
    )
    assert scale[3] == 127 and codes[3].abs().max() == 57344.0  # max: scale 1
    assert scale[-3] == 127 + 128 - 15 and codes[-3, 5] == 57344.0  # +inf saturates
    # NaN: scale byte 255 (as a float32 bit pattern 2**128 = inf, so the other codes
    # are +-0); read back, e8m0's 255 is NaN: the whole block dequantizes to NaN
    assert scale[-1] == 255 and codes[-1].isnan().tolist() == [i == 5 for i in range(32)]
    assert codes[-1][codes[-1].isfinite()].eq(0).all()
    back = tb.dequantize(q["weight"], q["weight_scale"], scheme="mxfp8", dtype="f32")
    assert back[-1].isnan().all() and not back[:-1].isnan().any()


def test_quantize_element_refusals() -> None:
    w = torch.randn(4, 64)
    with pytest.raises(tb.QuantizationError, match=r"^element='e3m4': mxfp8's elements are"):
        tb.quantize(w, "mxfp8", element="e3m4")
    with pytest.raises(
        tb.QuantizationError,
        match=r"^element='e5m2': mxfp4's elements are fp4 e2m1; the element type is mxfp8's",
    ):
        tb.quantize(w, "mxfp4", element="e5m2")


def test_convert_mxfp8_e5m2_reads_in_compressed_tensors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tb.save({"l.weight": torch.randn(64, 128) * 1000}, tmp_path / "w.safetensors")
    (tmp_path / "config.json").write_text("{}")
    out = tmp_path / "o" / "q.safetensors"
    argv = ["convert", str(tmp_path / "w.safetensors"), str(out), "--quantize", "mxfp8"]
    assert main([*argv, "--element", "e5m2", "--verify", "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["verified"] is True and summary["element"] == "e5m2"
    assert captured.err == (
        "note: compressed-tensors' config has no field for the element type and means e4m3; "
        "the codes are F8_E5M2 in the safetensors header, which compressed-tensors' "
        "decompressor and tensorbridge read, but a reader that assumes e4m3 gets wrong "
        "weights\n"
    )
    from safetensors.torch import load_file

    got = load_file(out)
    assert got["l.weight"].dtype == torch.float8_e5m2 and got["l.weight_scale"].dtype == torch.uint8
    cfg = json.loads((tmp_path / "o" / "config.json").read_text())["quantization_config"]
    assert cfg["format"] == "mxfp8-quantized"
    ours = tb.load(out, dequantize="bf16", framework="torch")["l.weight"]
    pytest.importorskip("compressed_tensors", reason="compressed-tensors reads its layouts")
    from compressed_tensors.compressors.mxfp8.base import MXFP8QuantizationCompressor
    from compressed_tensors.quantization import preset_name_to_scheme

    parts = {"weight": got["l.weight"], "weight_scale": got["l.weight_scale"]}
    ref = MXFP8QuantizationCompressor.decompress(parts, preset_name_to_scheme("MXFP8", ["Linear"]))
    assert np.array_equal(bits(ref["weight"].to(torch.bfloat16)), bits(ours))


# --- GGUF metadata from the command line -------------------------------------------------


def test_convert_to_gguf_with_typed_metadata(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gguf = pytest.importorskip("gguf", reason="the gguf package (llama.cpp's) is the oracle")
    tb.save({"w": torch.randn(4, 32).bfloat16()}, tmp_path / "x.safetensors")
    (tmp_path / "more.json").write_text(
        json.dumps({"llama.context_length": 4096, "tokenizer.ggml.tokens": ["a", "b"]})
    )
    argv = ["convert", str(tmp_path / "x.safetensors"), str(tmp_path / "y.gguf"), "-q"]
    meta = [
        "general.architecture=llama", "llama.block_count=2", "llama.rope.freq_base=10000.0",
        "x.flag=true", 'general.name="2"', "x.ctx:uint64=4096", "x.list=[1, -2, 3]",
        "x.eps:float64=1e-5", "x.text=hello world", "x.neg=-1",
    ]  # fmt: skip
    argv += [a for m in meta for a in ("--metadata", m)]
    assert main([*argv, "--metadata-json", str(tmp_path / "more.json")]) == 0
    capsys.readouterr()
    r = gguf.GGUFReader(tmp_path / "y.gguf")
    found = {
        k: ([t.name for t in f.types], f.contents())
        for k, f in r.fields.items()
        if not k.startswith("GGUF.")
    }
    assert found == {
        "general.architecture": (["STRING"], "llama"),
        "llama.context_length": (["UINT32"], 4096),
        "tokenizer.ggml.tokens": (["ARRAY", "STRING"], ["a", "b"]),
        "llama.block_count": (["UINT32"], 2),
        "llama.rope.freq_base": (["FLOAT32"], 10000.0),
        "x.flag": (["BOOL"], True),
        "general.name": (["STRING"], "2"),
        "x.ctx": (["UINT64"], 4096),
        "x.list": (["ARRAY", "INT32"], [1, -2, 3]),
        "x.eps": (["FLOAT64"], 1e-5),
        "x.text": (["STRING"], "hello world"),
        "x.neg": (["INT32"], -1),
    }
    t = r.tensors[0]
    assert t.name == "w" and t.tensor_type.name == "BF16"


def test_convert_to_gguf_without_architecture_names_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tb.save({"w": torch.randn(4, 32)}, tmp_path / "x.safetensors")
    argv = ["convert", str(tmp_path / "x.safetensors"), str(tmp_path / "y.gguf")]
    assert main([*argv, "--metadata", "llama.block_count=2"]) == 1
    assert capsys.readouterr().err == (
        f"tensorbridge convert: error: cannot save {tmp_path / 'y.gguf'}: a GGUF file needs "
        "the metadata key 'general.architecture' (the model family llama.cpp loads it as, "
        "e.g. 'llama'); pass --metadata general.architecture=NAME (e.g. llama), or "
        "--metadata-json FILE\n"
    )
    assert not (tmp_path / "y.gguf").exists()
    assert main([*argv, "--metadata", "general.architecture=1"]) == 1  # JSON: a number
    assert "needs the metadata key 'general.architecture'" in capsys.readouterr().err
    assert main([*argv, "--metadata", 'general.architecture="1"', "-q"]) == 0  # a string


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--metadata", "nokey"], "--metadata nokey: pass KEY=VALUE (general.architecture=llama)"),
        (["--metadata", "a:uint8=300"], "--metadata a:uint8=300: 300 does not fit UINT8; pass"),
        (["--metadata", "a:uint8=1.5"], "--metadata a:uint8=1.5: 1.5 does not fit UINT8; pass"),
        (["--metadata", "a:q=1"], "--metadata a:q=1: GGUF has no value type 'q'; pass one of"),
        (["--metadata", "a:bool=1"], "--metadata a:bool=1: 1 is not a bool; pass true or false"),
        (["--metadata", "a:int32=x"], "--metadata a:int32=x: 'x' is not a number; a INT32"),
        (["--metadata-json", "{missing}"], "--metadata-json {missing}: "),
        (["--metadata-json", "{list}"], "holds a list; pass a JSON object"),
    ],
)
def test_metadata_usage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    tb.save({"w": torch.randn(4, 32)}, tmp_path / "x.safetensors")
    (tmp_path / "list.json").write_text("[1]")
    argv = [a.format(missing=tmp_path / "no.json", list=tmp_path / "list.json") for a in argv]
    message = message.format(missing=tmp_path / "no.json", list=tmp_path / "list.json")
    base = ["convert", str(tmp_path / "x.safetensors"), str(tmp_path / "y.gguf")]
    assert main([*base, "--metadata", "general.architecture=llama", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "y.gguf").exists()


def test_metadata_for_other_formats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tb.save({"w": torch.randn(4, 32)}, tmp_path / "x.safetensors")
    base = ["convert", str(tmp_path / "x.safetensors")]
    assert main([*base, str(tmp_path / "y.npz"), "--metadata", "a=1"]) == 2
    assert (  # Destination.check's rule, in convert's words
        "'.npz' files have no place for metadata; save to .safetensors or .pt or .gguf or "
        ".zarr or .h5 or .onnx to keep it, or leave out --metadata (a)\n"
    ) in capsys.readouterr().err
    assert main([*base, str(tmp_path / "y.safetensors"), "--metadata", "a:uint8=1"]) == 2
    assert "keeps text; drop :uint8" in capsys.readouterr().err
    assert main([*base, str(tmp_path / "y.safetensors"), "--metadata", "a=[1, 2]", "-q"]) == 0
    with tb.open(tmp_path / "y.safetensors") as f:
        assert f.metadata["a"] == "[1, 2]"  # safetensors keeps text: as given
    assert main([*base, str(tmp_path / "y.pt"), "--metadata", "w=1"]) == 2
    assert "--metadata w: a .pt file keeps metadata beside the tensors" in capsys.readouterr().err
    assert main([*base, str(tmp_path / "y.pt"), "--metadata", "epoch=3", "-q"]) == 0
    assert torch.load(tmp_path / "y.pt", weights_only=True)["epoch"] == 3  # typed: an int


# --- GPTQ and AWQ: what is refused ---------------------------------------------------------


def _gptq(bits: int) -> dict[str, torch.Tensor]:
    pre = "model.layers.0.self_attn.q_proj."
    return {
        pre + "qweight": torch.zeros(256 * bits // 32, 64, dtype=torch.int32),
        pre + "qzeros": torch.zeros(2, 64 * bits // 32, dtype=torch.int32),
        pre + "scales": torch.ones(2, 64, dtype=torch.float16),
    }


def _pack_words(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """GPTQModel's ``pack``: 32 // bits codes an int32 along the last axis, low bits first."""
    per = 32 // bits
    c = codes.to(torch.int64).reshape(*codes.shape[:-1], -1, per)
    word = sum(c[..., j] << (j * bits) for j in range(per))
    return ((word + 2**31) % 2**32 - 2**31).to(torch.int32)


def gptqmodel_v2_dequantize(qweight, qzeros, scales, bits, group_size):  # type: ignore[no-untyped-def]
    """AutoGPTQ's published unpacking (qlinear_cuda_old.py, ``forward``), without v1's
    ``zeros + 1``: GPTQModel's gptq_v2 stores the zeros as they are. fp16, [in, out]."""
    wf = torch.tensor(list(range(0, 32, bits)), dtype=torch.int32).unsqueeze(0)
    zeros = torch.bitwise_right_shift(
        torch.unsqueeze(qzeros, 2).expand(-1, -1, 32 // bits), wf.unsqueeze(0)
    ).to(torch.int16 if bits == 8 else torch.int8)
    zeros = torch.bitwise_and(zeros, (2**bits) - 1).reshape(scales.shape)
    weight = torch.bitwise_right_shift(
        torch.unsqueeze(qweight, 1).expand(-1, 32 // bits, -1), wf.unsqueeze(-1)
    ).to(torch.int16 if bits == 8 else torch.int8)
    weight = torch.bitwise_and(weight, (2**bits) - 1).reshape(-1, weight.shape[2])
    g_idx = torch.arange(weight.shape[0]) // group_size
    return scales[g_idx] * (weight - zeros[g_idx])


@pytest.mark.parametrize("width", [2, 4, 8])
def test_gptq_v2_widths_streamed_match_gptqmodel(
    width: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2-, 4- and 8-bit GPTQModel (gptq_v2, no act-order) checkpoints read through
    tb.open a piece at a time: the reference's fp16 values, bit for bit."""
    from tensorbridge.quant import base

    g = torch.Generator().manual_seed(width)
    n_in, out, gs = 256, 64, 64
    q = torch.randint(0, 2**width, (n_in, out), generator=g)
    zeros = torch.randint(0, 2**width, (n_in // gs, out), generator=g)
    pre = "model.layers.0.mlp.up_proj."
    sd = {
        pre + "qweight": _pack_words(q.t(), width).t().contiguous(),
        pre + "qzeros": _pack_words(zeros, width),
        pre + "scales": (torch.rand(n_in // gs, out, generator=g) / 50).half(),
    }
    ref = gptqmodel_v2_dequantize(*(sd[pre + k] for k in ("qweight", "qzeros", "scales")),
                                  width, gs)  # fmt: skip
    d = tmp_path / "gptq"
    tb.save(sd, d / "model.safetensors")
    cfg = {"quant_method": "gptq", "bits": width, "group_size": gs, "format": "gptq_v2"}
    (d / "config.json").write_text(json.dumps({"quantization_config": cfg}))
    monkeypatch.setattr(base, "PIECE_ELEMENTS", 300)  # a few output columns a piece
    with tb.open(d, dequantize="f16") as f:
        got = f.get(pre + "weight", framework="torch")
    assert got.shape == (out, n_in) and np.array_equal(bits(got), bits(ref.t()))


@pytest.mark.parametrize("width", [5, 6, 7])
def test_gptq_widths_no_toolkit_writes_are_refused(width: int) -> None:
    cfg = {"quant_method": "gptq", "bits": width, "group_size": 128, "checkpoint_format": "gptq"}
    with pytest.raises(
        tb.QuantizationError,
        match=rf"qweight: {width}-bit GPTQ is not a width AutoGPTQ / GPTQModel write \(2, 3, 4 "
        r"and 8 bits are read\); check bits in the config, or dequantize it with GPTQModel$",
    ):
        tb.dequantize(_gptq(8), config=cfg)


def test_gptq_format_key_of_transformers_5() -> None:
    """transformers 5 / GPTQModel write ``format`` where older exports wrote
    ``checkpoint_format``: read it, or a v2 checkpoint would be read as v1."""
    sd = _gptq(4)
    pre = "model.layers.0.self_attn.q_proj."
    sd[pre + "qzeros"][:] = 0x77777777  # every zero 7: AutoGPTQ v1's symmetric zeros
    base = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    v1 = tb.dequantize(sd, config=base, dtype="f32")[pre + "weight"]
    v2 = tb.dequantize(sd, config={**base, "format": "gptq_v2"}, dtype="f32")[pre + "weight"]
    assert v1.eq(-8).all() and v2.eq(-7).all()  # zero 7 + 1 vs 7; codes 0
    with pytest.raises(
        tb.QuantizationError,
        match=r"checkpoint_format 'marlin' is not one tensorbridge reads; it reads 'gptq' .*"
        r"dequantize 'marlin' checkpoints \(Marlin, BitBLAS, \.\.\.\) with GPTQModel",
    ):
        tb.dequantize(sd, config={**base, "format": "marlin"})


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"version": "gemv"}, r"AWQ version 'gemv' packs codes differently from the GEMM"),
        ({"version": "GEMV_FAST"}, r"AWQ version 'gemv_fast' packs codes differently"),
        ({"version": "marlin"}, r"'marlin' .* the only one tensorbridge reads \(GEMV, GEMV-fast,"),
        ({"format": "gemv"}, r"AWQ version 'gemv' packs codes"),  # transformers 5's key
        ({"format": "llm-awq"}, r"'llm-awq' .*dequantize it with AutoAWQ / GPTQModel, or export"),
        (
            {"version": "exllama"},
            r"'exllama' names a kernel, not a layout: .* set version to 'gemm' in the config",
        ),
    ],
)
def test_awq_layouts_other_than_gemm_are_refused(config: dict[str, str], message: str) -> None:
    pre = "model.layers.0.mlp.down_proj."
    sd = {
        pre + "qweight": torch.zeros(256, 8, dtype=torch.int32),
        pre + "qzeros": torch.zeros(2, 8, dtype=torch.int32),
        pre + "scales": torch.ones(2, 64, dtype=torch.float16),
    }
    cfg = {"quant_method": "awq", "bits": 4, "group_size": 128, **config}
    with pytest.raises(tb.QuantizationError, match=message):
        tb.dequantize(sd, config=cfg)
    assert tb.dequantize(sd, config={**cfg, "version": "gemm"})[pre + "weight"].shape == (64, 256)
