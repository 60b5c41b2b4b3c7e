"""Quantized checkpoints on the command line: inspect's codes / scales / dequantized
statistics, compare and cast-report with a scheme (per-block errors, saturated blocks,
e8m0 scales at their limits, NaN / inf produced), and convert --quantize.

Independent references: compressed-tensors' MXFP8 / MXFP4 / NVFP4 decompressors,
torchao's NVFP4Tensor, transformers' Fp8Dequantize (fp8 block-wise). Per-block
errors are checked against a brute-force computation over the whole weight, and
each scheme's block map against what changing one scale actually changes.
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
from tensorbridge.quant import SCHEMES, plan
from tensorbridge.quant.write import LAYOUTS, stored_layout


def bits(t: Any) -> np.ndarray:
    a = tb.to_numpy(t) if isinstance(t, torch.Tensor) else np.asarray(t)
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def f32(t: Any) -> torch.Tensor:
    return (t if isinstance(t, torch.Tensor) else tb.to_torch(np.asarray(t))).to(torch.float32)


# --- the block map: which output values each scale scales ------------------------------------


def _cases() -> list[tuple[str, dict[str, torch.Tensor], dict[str, Any]]]:
    torch.manual_seed(3)
    w, e = torch.randn(2, 300, 160), torch.randn(2, 64, 96)
    return [
        ("fp8-block", tb.quantize(w, "fp8-block", block_size=(128, 64)), {"block_size": (128, 64)}),
        ("mxfp8", tb.quantize(w, "mxfp8"), {}),
        ("mxfp4", tb.quantize(w, "mxfp4"), {}),
        ("mxfp4", tb.quantize(e, "mxfp4", layout="gpt-oss", name="x"), {}),
        ("nvfp4-modelopt", tb.quantize(w, "nvfp4-modelopt"), {}),
        ("nvfp4-compressed-tensors", tb.quantize(w, "nvfp4-compressed-tensors"), {}),
        ("fp8", {"weight": w.to(torch.float8_e4m3fn), "weight_scale": torch.rand(2, 300, 1)}, {}),
    ]  # fmt: skip


@pytest.mark.parametrize("case", range(7), ids=lambda i: _cases()[i][0] + f"-{i}")
def test_block_index_is_what_one_scale_changes(case: int) -> None:
    scheme, sd, opts = _cases()[case]
    index = {k: (tb.resolve_dtype(v.dtype), tuple(v.shape)) for k, v in sd.items()}
    [g] = plan(index, None, scheme, opts).groups
    s = SCHEMES[g.scheme]
    ids = s.block_index(g, torch.arange(g.size))
    assert ids is not None
    scale_name = g.parts["scale"]
    parts = {role: sd[stored] for role, stored in g.parts.items()}
    base = s.dequantize(parts, g, torch.float32).reshape(-1)
    nblocks = sd[scale_name].numel()
    for b in (0, 1, nblocks // 2, nblocks - 1):
        changed = dict(parts)
        raw = sd[scale_name].clone().reshape(-1)
        if raw.dtype in (torch.uint8, torch.float8_e8m0fnu):  # e8m0: one exponent up
            raw.view(torch.uint8)[b] += 1
        else:  # doubled, or halved where doubling would overflow the scale's dtype
            value = raw[b].to(torch.float32)
            big = bool(value.abs() * 2 > torch.finfo(raw.dtype).max)
            raw[b] = value / 2 if big else value * 2
        changed["scale"] = raw.reshape(sd[scale_name].shape)
        after = s.dequantize(changed, g, torch.float32).reshape(-1)
        moved = (after != base).nonzero().reshape(-1)
        mine = (ids == b).nonzero().reshape(-1)
        # every changed value lies in the block; zero codes stay zero, nothing else moves
        assert set(moved.tolist()) <= set(mine.tolist())
        assert len(moved) == int(torch.count_nonzero(base[mine]))


def test_block_errors_are_the_brute_force_ones() -> None:
    torch.manual_seed(0)
    w = torch.randn(64, 128)
    w[5, 32:64] *= 300  # one loud block
    q = tb.quantize(w, "mxfp4", name="l.weight")
    report = tb.quant_report(q, {"l.weight": w}, worst=3)
    got = report.weights["l.weight"]
    deq = tb.dequantize(q["l.weight"], q["l.weight_scale"], scheme="mxfp4", dtype="float32")
    err = (deq.double() - w.double()).abs().reshape(64, 4, 32)
    blk_err = err.amax(-1)
    blk_rel = blk_err / w.double().abs().reshape(64, 4, 32).amax(-1)
    assert got.blocks == 256 and got.max_abs_err == float(err.max())
    assert got.max_rel_err == pytest.approx(float(blk_rel.max()), rel=1e-12)
    top = torch.topk(blk_rel.reshape(-1), 3).indices.tolist()
    assert [b.block for b in got.worst_blocks] == [(i // 4, i % 4) for i in top]
    assert report.worst_blocks == got.worst_blocks and report.ok
    codes = tb.dequantize(
        q["l.weight"], torch.full((64, 4), 127, dtype=torch.uint8), scheme="mxfp4", dtype="f32"
    )
    assert got.saturated_blocks == int((codes.abs() == 6).reshape(64, 4, 32).any(-1).sum())
    stats = tb.stats(deq)
    assert got.stats.mean == pytest.approx(stats.mean) and got.stats.max == stats.max


def test_small_pieces_give_the_same_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """The report is computed a piece at a time: more pieces, the same numbers."""
    from tensorbridge.quant import base

    torch.manual_seed(1)
    w = torch.randn(300, 256)
    q = tb.quantize(w, "fp8-block", name="a.weight")
    whole = tb.quant_report(q, {"a.weight": w}, block_size=(128, 128))
    monkeypatch.setattr(base, "PIECE_ELEMENTS", 96)
    pieces = tb.quant_report(q, {"a.weight": w}, block_size=(128, 128))
    a, b = whole.weights["a.weight"], pieces.weights["a.weight"]
    assert (a.max_abs_err, a.max_rel_err, a.worst_blocks, a.blocks) == (
        b.max_abs_err,
        b.max_rel_err,
        b.worst_blocks,
        b.blocks,
    )
    assert a.stats.min == b.stats.min and a.stats.mean == pytest.approx(b.stats.mean)
    assert a.blocks == 3 * 2 and a.saturated_blocks == 6  # amax maps to 448 in every block


def _limits_checkpoint(d: Path) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """An MXFP8 weight whose e8m0 scales sit at 0x00 (x2), 0xFE (x1) and 0xFF (x3)."""
    codes = torch.full((4, 64), 6.0).to(torch.float8_e4m3fn)
    scale = torch.full((4, 2), 127, dtype=torch.uint8)
    scale[0, 0] = scale[1, 1] = 0x00
    scale[2, 0] = 0xFE  # 6 x 2**127 overflows float32: inf
    scale[3, :] = 0xFF
    scale[0, 1] = 0xFF
    sd = {"l.weight": codes, "l.weight_scale": scale.view(torch.float8_e8m0fnu)}
    d.mkdir(exist_ok=True)
    tb.save(sd, d / "model.safetensors")
    return sd, {"0x00": 2, "0xfe": 1, "nan": 3}


def test_e8m0_limits_nan_and_inf_produced(tmp_path: Path) -> None:
    sd, _ = _limits_checkpoint(tmp_path / "q")
    w = tb.quant_report(sd).weights["l.weight"]
    assert (w.e8m0_min, w.e8m0_max, w.e8m0_nan) == (2, 1, 3)
    assert w.nan_produced == 3 * 32 and w.inf_produced == 32
    assert w.saturated_blocks == 0 and not w.ok
    assert tb.quant_report(tmp_path / "q").weights["l.weight"] == w  # a path reads the same


# --- inspect -----------------------------------------------------------------------------------


def test_inspect_shows_codes_scales_and_dequantized_stats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, limits = _limits_checkpoint(tmp_path / "q")
    assert main(["inspect", str(tmp_path / "q"), "-q"]) == 0
    text = capsys.readouterr().out
    assert "quantized: mxfp8: 1 quantized weights" in text
    lines = text.splitlines()
    i = lines.index(next(x for x in lines if x.startswith("quantized weight")))
    assert lines[i].split() == ["quantized", "weight", "scheme", "codes", "scales"]
    assert lines[i + 2].split() == [
        "l.weight", "mxfp8", "float8_e4m3fn", "(4,", "64)", "float8_e8m0fnu", "(4,", "2)"
    ]  # fmt: skip
    assert main(["inspect", str(tmp_path / "q"), "-q", "--stats", "--json"]) == 0
    [report] = json.loads(capsys.readouterr().out)
    detail = report["quantization"]["details"]["l.weight"]
    assert detail["codes"] == {"name": "l.weight", "dtype": "float8_e4m3fn", "shape": [4, 64]}
    assert detail["scales"]["e8m0_at_limits"] == limits
    assert detail["nan_produced"] == 96 and detail["inf_produced"] == 32
    assert detail["stats"]["nan_count"] == 96 and detail["stats"]["posinf_count"] == 32
    assert detail["stats"]["min"] == 6 * 2.0**-127  # 0x00 scales: 2**-127 (a subnormal)
    assert report["quantization"]["weights"]["l.weight"] == {
        "scheme": "mxfp8",
        "codes": "l.weight",
        "scale": "l.weight_scale",
    }
    assert main(["inspect", str(tmp_path / "q"), "-q", "--stats"]) == 0
    text = capsys.readouterr().out
    header = next(x for x in text.splitlines() if x.startswith("quantized weight"))
    assert header.split()[-9:] == ["0xfe", "e8m0", "NaN", "min", "max", "mean", "std", "nan", "inf"]
    row = text.splitlines()[text.splitlines().index(header) + 2].split()
    assert row[8:13] == ["8", "0", "2", "1", "3"]  # blocks, saturated, 0x00, 0xfe, NaN
    assert row[-2:] == ["96", "32"]


def test_inspect_stats_match_a_whole_dequantize(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.manual_seed(2)
    w = torch.randn(576, 256)
    q = tb.quantize(w, "fp8-block", name="kv.weight")
    tb.save(q, tmp_path / "m.safetensors")
    argv = ["inspect", str(tmp_path / "m.safetensors"), "-q", "--stats", "--json"]
    (tmp_path / "config.json").write_text(
        json.dumps(
            {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
        )
    )
    assert main(argv) == 0
    detail = json.loads(capsys.readouterr().out)[0]["quantization"]["details"]["kv.weight"]
    ref = tb.stats(tb.dequantize(q["kv.weight"], q["kv.weight_scale_inv"], scheme="fp8-block",
                                 block_size=(128, 128), dtype="float32"))  # fmt: skip
    assert detail["blocks"] == 10 and detail["scales"]["shape"] == [5, 2]
    for k in ("min", "max", "numel", "zeros", "nan_count"):
        assert detail["stats"][k] == getattr(ref, k)
    assert detail["stats"]["std"] == pytest.approx(ref.std, rel=1e-12)


# --- compare and cast-report with a scheme ---------------------------------------------------


def _pair(tmp_path: Path, scheme: str = "mxfp4") -> tuple[Path, Path, dict[str, torch.Tensor]]:
    torch.manual_seed(4)
    ref = {
        "model.layers.0.mlp.up_proj.weight": torch.randn(64, 128),
        "model.norm.weight": torch.rand(64),
    }
    tb.save(ref, tmp_path / "ref.safetensors")
    q = dict(ref)
    del q["model.layers.0.mlp.up_proj.weight"]
    q.update(tb.quantize(ref["model.layers.0.mlp.up_proj.weight"], scheme,
                         name="model.layers.0.mlp.up_proj.weight"))  # fmt: skip
    (tmp_path / "q").mkdir()
    tb.save(q, tmp_path / "q" / "model.safetensors")
    return tmp_path / "ref.safetensors", tmp_path / "q", ref


def test_compare_quantized_with_its_reference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ref_path, q_path, ref = _pair(tmp_path)
    expected = tb.quant_report(q_path, ref)
    name = "model.layers.0.mlp.up_proj.weight"
    for argv in (
        ["compare", str(ref_path), str(q_path)],  # detected from the names, either order
        ["compare", str(q_path), str(ref_path), "--scheme", "mxfp4"],
    ):
        assert main([*argv, "-q", "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["ok"] and doc["quantized"] == str(q_path)
        assert doc["report"] == expected.to_dict()
        assert doc["tensors"]["model.norm.weight"]["bitwise_equal"] is True
    assert main(["compare", str(ref_path), str(q_path), "-q"]) == 0
    text = capsys.readouterr().out
    worst = expected.worst_blocks[0]
    assert f"  {name} block {worst.block}: max abs " in text
    assert text.splitlines()[-1] == (
        f"verdict: no NaN or inf produced; worst block max rel "
        f"{worst.max_rel_err:.4g} ({name} block {worst.block})"
    )
    w = expected.weights[name]
    assert w.max_abs_err == float(
        (tb.load(q_path, dequantize="float32", framework="torch")[name] - ref[name]).abs().max()
    )
    # a tolerance on the blocks' relative error fails the comparison
    assert main(["compare", str(ref_path), str(q_path), "-q", "--rtol", "0.01"]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "verdict: 1 weight beyond --rtol 0.01"


def test_compare_with_a_scheme_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ref_path, q_path, _ = _pair(tmp_path)
    r = str(ref_path)
    assert main(["compare", r, r, "--scheme", "mxfp4"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"tensorbridge compare: error: neither {r} nor {r} holds mxfp4 weights; leave out --scheme"
    )
    assert main(["compare", str(q_path), str(q_path), "--scheme", "mxfp4"]) == 2
    assert "both " in capsys.readouterr().err
    # two quantized checkpoints without --scheme: the stored tensors, as before
    assert main(["compare", str(q_path), str(q_path), "-q"]) == 0
    assert "verdict: within tolerance" in capsys.readouterr().out
    tb.save({"other.weight": torch.zeros(64, 128)}, tmp_path / "other.safetensors")
    assert main(["compare", str(tmp_path / "other.safetensors"), str(q_path), "-q"]) == 1
    out = capsys.readouterr().out
    assert f"only in {q_path}: model.layers.0.mlp.up_proj.weight" in out
    assert f"only in {tmp_path / 'other.safetensors'}: other.weight" in out


def test_cast_report_with_a_scheme(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ref_path, q_path, ref = _pair(tmp_path)
    argv = ["cast-report", str(ref_path), "--scheme", "nvfp4-modelopt", "-q"]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    expected = tb.quant_report(ref_path, scheme="nvfp4-modelopt")
    assert doc == expected.to_dict()
    name = "model.layers.0.mlp.up_proj.weight"
    # the same numbers as quantizing in memory and comparing with the original
    q = tb.quantize(ref[name], "nvfp4-modelopt", name=name)
    again = tb.quant_report(q, ref, scheme="nvfp4-modelopt")
    assert again.weights[name] == expected.weights[name]
    assert doc["skipped"] == {"model.norm.weight": "not a floating-point weight of 2 or more "
                              "dimensions"}  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert text.startswith(
        f"{ref_path}: nvfp4-modelopt: 1 weights quantized and dequantized again\n"
    )
    assert main([*argv, "--ignore", "*up_proj*"]) == 2
    assert "has no weight nvfp4-modelopt would quantize" in capsys.readouterr().err
    # a quantized file: its own weights, no --scheme needed
    assert main(["cast-report", str(q_path), "-q", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["weights"][name]["max_abs_err"] is None and doc["ok"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dtype", "bf16", "--scheme", "mxfp4"], "pass --dtype (a cast) or --scheme"),
        ([], "is not quantized: pass --dtype DTYPE for a cast or --scheme NAME"),
        (["--dtype", "bf16", "--ignore", "x"], "--ignore applies to --scheme"),
        (["--scheme", "nvfp4"], "does not say whose convention"),
    ],
)
def test_cast_report_usage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    ref_path, _, _ = _pair(tmp_path)
    status = main(["cast-report", str(ref_path), "-q", *argv])
    assert status in (1, 2) and message in capsys.readouterr().err


def test_cast_report_of_nan_scales_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _limits_checkpoint(tmp_path / "q")
    assert main(["cast-report", str(tmp_path / "q"), "-q"]) == 1
    text = capsys.readouterr().out
    assert text.splitlines()[-1] == "verdict: 1 weight with NaN / inf or unreadable"
    row = next(x for x in text.splitlines() if x.startswith("l.weight")).split()
    assert row == ["l.weight", "mxfp8", "8", "0", "2", "1", "3", "96", "32", "BAD"]


# --- convert --quantize ------------------------------------------------------------------------

_WRITES = ["mxfp8", "mxfp4", "nvfp4-modelopt", "nvfp4-compressed-tensors", "fp8-block"]


def _plain(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    torch.manual_seed(5)
    sd = {
        "model.embed_tokens.weight": torch.randn(100, 64).bfloat16(),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(96, 64).bfloat16(),
        "model.layers.0.self_attn.q_proj.bias": torch.randn(96).bfloat16(),
        "model.layers.0.mlp.gate.weight": torch.randn(8, 40).bfloat16(),  # 40: no MX / NVFP4
        "model.layers.0.mlp.down_proj.weight": torch.randn(128, 256).bfloat16(),
        "model.norm.weight": torch.ones(64).bfloat16(),
        "lm_head.weight": torch.randn(100, 64).bfloat16(),
    }
    d = tmp_path / "plain"
    tb.save(sd, d / "model.safetensors")
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    return d, sd


@pytest.mark.parametrize("scheme", _WRITES)
def test_convert_quantize_is_tb_quantize_and_round_trips(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], scheme: str
) -> None:
    src, sd = _plain(tmp_path)
    out = tmp_path / "q"
    assert main(["convert", str(src), f"{out}/", "--quantize", scheme, "--verify", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["verified"] is True and summary["config"] == str(out / "config.json")
    linear = ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight"]
    if scheme == "fp8-block":
        linear.insert(1, "model.layers.0.mlp.gate.weight")
    assert sorted(summary["quantized_weights"]) == sorted(linear)
    from safetensors.torch import load_file

    got = load_file(out / "model.safetensors")
    want: dict[str, Any] = {}
    for n in linear:
        q = tb.quantize(sd[n], scheme, name=n, layout=LAYOUTS[scheme])
        layout = stored_layout(n, tuple(sd[n].shape), scheme)
        assert {k: (tb.resolve_dtype(v.dtype), tuple(v.shape)) for k, v in q.items()} == {
            k: (row, shape) for k, (_, row, shape) in layout.items()
        }
        want.update(q)
    for n in sd:
        if n not in linear:
            want[n] = sd[n]  # copied bit for bit
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and np.array_equal(bits(got[k]), bits(want[k])), k
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and plan(
        {k: (tb.resolve_dtype(v.dtype), tuple(v.shape)) for k, v in got.items()},
        tb.quant.read_config(out),  # type: ignore[attr-defined]
    ).schemes == (scheme,)
    # and back: convert --dequantize gives tb.dequantize's values, bit for bit
    back = tmp_path / "back"
    assert main(["convert", str(out), f"{back}/", "--dequantize", "bf16", "-q"]) == 0
    capsys.readouterr()
    assert "quantization_config" not in json.loads((back / "config.json").read_text())
    plain = load_file(back / "model.safetensors")
    assert sorted(plain) == sorted(sd)
    cfg = config["quantization_config"]
    in_memory = tb.dequantize(dict(want), config=cfg, dtype="bfloat16")
    for k in sd:
        assert np.array_equal(bits(plain[k]), bits(in_memory[k])), k


def _reference_dequantize(scheme: str, parts: dict[str, torch.Tensor]) -> torch.Tensor:
    """The weight as an independent toolkit reads the written layout (bfloat16)."""
    if scheme == "fp8-block":
        finegrained = pytest.importorskip(
            "transformers.integrations.finegrained_fp8", reason="transformers reads fp8 blocks"
        )
        return finegrained.Fp8Dequantize(None)._dequantize_one(  # type: ignore[no-any-return]
            parts["weight"], parts["weight_scale_inv"], output_dtype=torch.bfloat16
        )
    if scheme == "nvfp4-modelopt":
        nv = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor", reason="reference")
        t = nv.NVFP4Tensor(parts["weight"], parts["weight_scale"], 16, torch.bfloat16,
                           per_tensor_scale=parts["weight_scale_2"])  # fmt: skip
        return t.dequantize(torch.bfloat16)  # type: ignore[no-any-return]
    pytest.importorskip("compressed_tensors", reason="compressed-tensors reads its layouts")
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.compressors.mxfp8.base import MXFP8QuantizationCompressor
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme

    compressor, preset = {
        "mxfp8": (MXFP8QuantizationCompressor, "MXFP8"),
        "mxfp4": (MXFP4PackedCompressor, "MXFP4A16"),
        "nvfp4-compressed-tensors": (NVFP4PackedCompressor, "NVFP4"),
    }[scheme]
    out = compressor.decompress(parts, preset_name_to_scheme(preset, ["Linear"]))
    return out["weight"].to(torch.bfloat16)  # type: ignore[no-any-return]


@pytest.mark.parametrize("scheme", _WRITES)
def test_convert_quantize_output_reads_in_the_reference_toolkit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], scheme: str
) -> None:
    src, sd = _plain(tmp_path)
    out = tmp_path / "q.safetensors"
    assert main(["convert", str(src), str(out), "--quantize", scheme, "-q"]) == 0
    capsys.readouterr()
    (tmp_path / "config.json").unlink()  # read by --scheme alone
    from safetensors.torch import load_file

    got = load_file(out)
    n = "model.layers.0.mlp.down_proj.weight"
    parts = {k[len(n) - len("weight") :]: v for k, v in got.items() if k.startswith(n)}
    ref = _reference_dequantize(scheme, parts)
    block = (128, 128) if scheme == "fp8-block" else None
    ours = tb.dequantize(got, scheme=scheme, block_size=block, dtype="bf16")[n]
    assert ref.shape == ours.shape == sd[n].shape
    assert np.array_equal(bits(ref), bits(ours))


@pytest.mark.parametrize("scheme", _WRITES)
def test_convert_quantize_streams_slices_with_the_same_bits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    scheme: str,
) -> None:  # fmt: skip
    """Weights are quantized a slice of rows at a time as they are written: many small
    slices (NVFP4: with the whole weight's amax) give tb.quantize's bytes."""
    from tensorbridge.quant import base

    torch.manual_seed(6)
    w = {"a.weight": torch.randn(2, 300, 256) * torch.logspace(-2, 2, 300)[:, None]}
    tb.save(w, tmp_path / "w.safetensors")
    monkeypatch.setattr(base, "PIECE_ELEMENTS", 512)  # 2 rows a slice (fp8-block: 128)
    calls: list[int] = []
    quantize = SCHEMES[scheme].quantize

    def counted(x: torch.Tensor, **kw: Any) -> Any:
        calls.append(x.shape[0])
        return quantize(x, **kw)

    monkeypatch.setattr(SCHEMES[scheme], "quantize", counted)
    out = tmp_path / "q.safetensors"
    argv = ["convert", str(tmp_path / "w.safetensors"), str(out), "--quantize", scheme, "-q"]
    assert main(argv) == 0
    capsys.readouterr()
    assert max(calls) == (128 if scheme == "fp8-block" else 2)
    want = tb.quantize(w["a.weight"], scheme, name="a.weight", layout=LAYOUTS[scheme])
    with tb.open(out) as f:
        assert sorted(f) == sorted(want)
        for k, v in want.items():
            assert np.array_equal(bits(f[k]), bits(v)), k


def test_convert_quantize_ignore_and_notes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, _ = _plain(tmp_path)
    out = tmp_path / "q"
    argv = ["convert", str(src), f"{out}/", "--quantize", "mxfp4", "--ignore", "*down_proj*"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert (
        "note: left model.layers.0.mlp.gate.weight unquantized: rows of 40 values are not a "
        "multiple of mxfp4's 32-value blocks" in captured.err
    )
    assert "quantized: mxfp4: 1 weight; " in captured.out
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config["format"] == "mxfp4-pack-quantized"
    assert config["ignore"] == [
        "lm_head",
        "model.embed_tokens",
        "model.layers.0.mlp.down_proj",
        "model.layers.0.mlp.gate",
    ]


@pytest.mark.parametrize(
    ("argv", "status", "message"),
    [
        (["--quantize", "nvfp4"], 2, "does not say whose convention"),
        (["--quantize", "gptq"], 2, "dequantizes gptq but does not write it"),
        (["--quantize", "mxfp4", "--block-size", "64,64"], 2, "--block-size is fp8-block's"),
        (["--quantize", "mxfp4", "--dequantize", "bf16"], 2, "--quantize or --dequantize"),
        (["--quantize", "mxfp4", "--float-dtype", "bf16"], 2, "in a second convert"),
        (["--quantize", "mxfp4", "--scheme", "mxfp4"], 2, "leave out --scheme"),
        (["--ignore", "x"], 2, "--ignore says which weights --quantize leaves"),
    ],
)
def test_convert_quantize_usage(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    status: int,
    message: str,
) -> None:
    src, _ = _plain(tmp_path)
    assert main(["convert", str(src), str(tmp_path / "o.safetensors"), *argv]) == status
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o.safetensors").exists()


def test_convert_quantize_without_a_config_says_how_to_read_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tb.save({"l.weight": torch.randn(64, 256)}, tmp_path / "w.safetensors")
    out = tmp_path / "o" / "q.safetensors"
    argv = ["convert", str(tmp_path / "w.safetensors"), str(out), "--quantize", "fp8-block"]
    assert main([*argv, "--block-size", "64,128"]) == 0
    captured = capsys.readouterr()
    assert captured.err == (
        f"note: no config.json beside {tmp_path / 'w.safetensors'}, so none says how {out} "
        "is quantized: read it with --scheme fp8-block --block-size 64,128 "
        "(tb.open(..., dequantize=..., scheme=...))\n"
    )
    assert not (tmp_path / "o" / "config.json").exists()
    assert main(["compare", str(tmp_path / "w.safetensors"), str(out), "-q", "--json",
                 "--scheme", "fp8-block", "--block-size", "64,128"]) == 0  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert doc["report"]["weights"]["l.weight"]["scale_shape"] == [1, 2]


def test_convert_quantize_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, _ = _plain(tmp_path)
    assert main(["convert", str(src), str(tmp_path / "o.npz"), "--quantize", "mxfp4"]) == 2
    assert "writes the schemes' published safetensors layouts" in capsys.readouterr().err
    q = tmp_path / "q.safetensors"
    assert main(["convert", str(src), str(q), "--quantize", "mxfp4", "-q"]) == 0
    before = q.read_bytes()
    assert main(["convert", str(src), str(q), "--quantize", "mxfp8", "-q"]) == 1  # no overwrite
    assert "--overwrite" in capsys.readouterr().err and q.read_bytes() == before
    assert main(["convert", str(q), str(tmp_path / "qq.safetensors"), "--quantize", "mxfp4"]) == 1
    assert "is already quantized; dequantize it first" in capsys.readouterr().err
    tb.save({"norm.weight": torch.ones(4)}, tmp_path / "n.safetensors")
    argv = ["convert", str(tmp_path / "n.safetensors"), str(tmp_path / "o.safetensors")]
    assert main([*argv, "--quantize", "fp8-block"]) == 1
    assert "nothing to quantize" in capsys.readouterr().err


def test_quantize_layouts() -> None:
    w = torch.randn(4, 64)
    q = tb.quantize(w, "mxfp4", name="w", layout="compressed-tensors")
    assert {k: v.dtype for k, v in q.items()} == {"w_packed": torch.uint8, "w_scale": torch.uint8}
    plain = tb.quantize(w, "mxfp4", name="w")
    assert torch.equal(q["w_packed"], plain["w"])
    assert torch.equal(q["w_scale"], plain["w_scale"].view(torch.uint8))
    with pytest.raises(tb.QuantizationError, match=r"^nvfp4-modelopt has no layout 'x'; leave"):
        tb.quantize(w, "nvfp4-modelopt", layout="x")
    with pytest.raises(tb.QuantizationError, match="or pass 'gpt-oss' or 'compressed-tensors'"):
        tb.quantize(w, "mxfp4", layout="x")
    with pytest.raises(tb.QuantizationError, match="pass scheme= to see what quantizing"):
        tb.quant_report({"w": w})


_QUANTIZE_CHILD = """
import sys, threading, time
import tensorbridge as tb
import tensorbridge.io, tensorbridge.quant.write, tensorbridge.io.safetensors  # not measured
from tensorbridge.cli import main
import torch
tb.quantize(torch.ones(16, 32), "nvfp4-modelopt")  # torch's and ml_dtypes' first-use setup

peak = [0]
def watch(stop):
    while not stop.is_set():
        peak[0] = max(peak[0], status("RssAnon"))
        time.sleep(0.001)

def measured(fn):
    stop = threading.Event()
    base = status("RssAnon")
    peak[0] = base
    t = threading.Thread(target=watch, args=(stop,))
    t.start()
    fn()
    stop.set()
    t.join()
    return peak[0] - base

def naive():
    sd = tb.load(sys.argv[1], framework="torch")
    out = {}
    for k, v in sd.items():
        out.update(tb.quantize(v, "nvfp4-modelopt", name=k))
    tb.save(out, sys.argv[3])

argv = ["convert", sys.argv[1], sys.argv[2], "--quantize", "nvfp4-modelopt", "-q"]
import contextlib, io
with contextlib.redirect_stdout(io.StringIO()):
    streamed = measured(lambda: main(argv))
print(streamed, measured(naive))
"""


@pytest.mark.slow  # 64 MiB of weights quantized twice in a child
def test_convert_quantize_peak_anonymous_memory_is_bounded(tmp_path: Path) -> None:
    """64 MiB of bf16 weights quantized to NVFP4: the stream holds a slice, not a weight."""
    from _peak_rss import run_child

    g = torch.Generator().manual_seed(3)
    sd = {f"layers.{i}.weight": torch.randn(2048, 4096, generator=g).bfloat16() for i in range(4)}
    tb.save(sd, tmp_path / "w.safetensors")
    del sd
    out, naive_out = tmp_path / "o.safetensors", tmp_path / "n.safetensors"
    child = run_child(_QUANTIZE_CHILD, str(tmp_path / "w.safetensors"), str(out), str(naive_out))
    streamed, naive = map(int, child.split())
    assert naive > 64 << 20, "the measure misses the naive route's weights"
    # a slice's temporaries per worker thread (torch's thread count, at most 8) and the
    # workers + 1 reused slots of the pipeline: a fixed amount, whatever the model
    assert streamed < 32 << 20, f"anonymous memory grew {streamed >> 20} MiB while streaming"
    assert out.read_bytes() == naive_out.read_bytes()


def test_integer_schemes_report_per_weight() -> None:
    """GPTQ's act-order groups are no grid over the weight: no blocks, errors per weight."""
    from test_quant import gptq_layer

    sd = gptq_layer(4, v2=True)
    config = {"quant_method": "gptq", "group_size": 32, "checkpoint_format": "gptq_v2"}
    exact = tb.dequantize(sd, config=config, dtype="float32")
    name = "model.layers.0.self_attn.q_proj.weight"
    w = exact[name]
    report = tb.quant_report(sd, {name: w * 2}, config=config)
    got = report.weights[name]
    assert got.blocks is None and got.saturated_blocks is None and got.worst_blocks == ()
    assert got.e8m0_min is None and got.scheme == "gptq"
    assert got.max_abs_err == float(w.abs().max()) and got.max_rel_err == 0.5
    assert got.stats.max == float(w.max()) and report.ok


def test_compare_of_an_undecidable_checkpoint_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """U8 scales with no config: e8m0 or integers? compare says so and compares as stored."""
    w = torch.randn(4, 64)
    q = tb.quantize(w, "mxfp8", name="l.weight", layout="compressed-tensors")
    tb.save(q, tmp_path / "q.safetensors")
    tb.save({"l.weight": w}, tmp_path / "w.safetensors")
    argv = ["compare", str(tmp_path / "w.safetensors"), str(tmp_path / "q.safetensors")]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith(
        f"note: {tmp_path / 'q.safetensors'} looks quantized but l.weight_scale is U8: it "
        "could hold e8m0 exponents"
    )
    assert captured.err.rstrip().endswith("; comparing the stored tensors")
    assert f"only in {tmp_path / 'q.safetensors'}: l.weight_scale" in captured.out
    assert main([*argv, "--scheme", "mxfp8", "-q"]) == 0
    assert "verdict: no NaN or inf produced; worst block max rel " in capsys.readouterr().out


# --- tb.save of an opened file: what convert does, from Python ---------------------------------


@pytest.mark.parametrize("suffix", [".safetensors", ".npz", ".pt"])
def test_save_of_an_opened_dequantized_checkpoint_is_tb_load(tmp_path: Path, suffix: str) -> None:
    """tb.save(tb.open(dir, dequantize=...), out) writes what tb.load(dir, dequantize=...) gives."""
    _, q, _ = _pair(tmp_path, "mxfp4")
    want = tb.load(q, dequantize="bf16")
    out = tmp_path / f"out{suffix}"
    with tb.open(q, dequantize="bf16") as f:
        tb.save(f, out)
    got = tb.load(out)
    assert sorted(got) == sorted(want) == ["model.layers.0.mlp.up_proj.weight", "model.norm.weight"]
    for name in want:
        assert got[name].dtype == want[name].dtype
        assert np.array_equal(bits(got[name]), bits(want[name]))


def test_save_of_an_opened_file_keeps_its_metadata(tmp_path: Path) -> None:
    """The file's own metadata goes along where the format has a place for it; a warning
    names what a format without one leaves out."""
    src = tmp_path / "a.safetensors"
    tb.save({"w": torch.arange(6, dtype=torch.bfloat16)}, src, metadata={"step": "7"})
    with tb.open(src) as f:
        tb.save(f, tmp_path / "b.safetensors")
        with pytest.warns(UserWarning, match=r"no place for metadata; a\.safetensors's step"):
            tb.save(f, tmp_path / "b.npz")
        tb.save(f, tmp_path / "c.safetensors", metadata={"run": "x"})  # given wins
    with tb.open(tmp_path / "b.safetensors") as g:
        assert g.metadata["step"] == "7"
        assert np.array_equal(bits(g["w"]), bits(torch.arange(6, dtype=torch.bfloat16)))
    assert "step" not in tb.open(tmp_path / "c.safetensors").metadata
    assert np.array_equal(bits(tb.load(tmp_path / "b.npz")["w"]), bits(tb.load(src)["w"]))


def test_save_of_an_opened_file_with_an_unreadable_entry_names_it(tmp_path: Path) -> None:
    np.savez(tmp_path / "s.npz", w=np.ones(3, np.float32), label=np.array(["a"]))
    with tb.open(tmp_path / "s.npz") as f, pytest.raises(tb.UnsupportedDtypeError, match="label"):
        tb.save(f, tmp_path / "o.safetensors")
