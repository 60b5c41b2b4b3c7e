"""``tb.quantize_checkpoint`` / ``copy_config``: ``convert --quantize`` as one Python call.

The stored tensors are :func:`tensorbridge.quantize`'s, bit for bit; the config a loader
reads goes beside the output; the refusals are those of the command line, in Python's
words. The command line's own tests (tests/test_quant_cli.py) check the same calls
through ``convert``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import tensorbridge as tb
from tensorbridge.checkpoint import copy_config
from tensorbridge.cli import main
from tensorbridge.quant.write import LAYOUTS


def bits(x: object) -> np.ndarray:
    a = tb.to_numpy(x) if isinstance(x, torch.Tensor) else np.asarray(x)
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _model(d: Path, config: bool = True) -> Path:
    torch.manual_seed(0)
    d.mkdir(exist_ok=True)
    sd = {
        "model.embed_tokens.weight": torch.randn(16, 64),
        "model.layers.0.mlp.up_proj.weight": torch.randn(32, 64),
        "model.layers.0.mlp.up_proj.bias": torch.randn(32),
        "model.layers.0.mlp.gate.weight": torch.randn(8, 40),  # rows of 40: not MX blocks
        "model.norm.weight": torch.ones(64),
    }
    tb.save(sd, d / "model.safetensors")
    if config:
        (d / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    return d / "model.safetensors"


@pytest.mark.parametrize("scheme", list(LAYOUTS))
def test_weights_are_tb_quantize_s(tmp_path: Path, scheme: str) -> None:
    src = _model(tmp_path / "src")
    done = tb.quantize_checkpoint(src, f"{tmp_path / 'out'}/", scheme, verify=True)
    assert isinstance(done, tb.QuantizedCheckpoint)
    up, gate = "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.gate.weight"
    # rows of 40 values fit no MX / NVFP4 block; fp8-block's 128 x 128 tiles take them
    assert done.scheme == scheme
    assert done.quantized == ((gate, up) if scheme == "fp8-block" else (up,))
    assert done.verified is True and done.problems == ()
    sd, got = tb.load(src), tb.load(done.path)
    for name in done.quantized:
        want = tb.quantize(sd[name], scheme, name=name, layout=LAYOUTS[scheme])
        for k, v in want.items():
            assert np.array_equal(bits(v), bits(got[k])), k
    assert np.array_equal(bits(got["model.norm.weight"]), bits(sd["model.norm.weight"]))
    assert done.tensors == len(got)


def test_the_config_a_loader_reads(tmp_path: Path) -> None:
    src = _model(tmp_path / "src")
    out = tmp_path / "out"
    done = tb.quantize_checkpoint(src, f"{out}/", "mxfp4")
    assert done.config == str(out / "config.json") and done.config_kept is None
    assert done.left_unquantized == {
        "model.embed_tokens.weight": "matches *embed*",
        "model.layers.0.mlp.gate.weight": "rows of 40 values are not a multiple of mxfp4's "
        "32-value blocks",
    }
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama"
    qc = config["quantization_config"]
    assert qc["format"] == "mxfp4-pack-quantized"
    assert qc["ignore"] == ["model.embed_tokens", "model.layers.0.mlp.gate"]
    assert done.bytes_in == sum(v.nbytes for v in tb.load(src).values())
    assert done.bytes_out == (out / "model.safetensors").stat().st_size
    # an existing config.json is kept unless overwrite=True
    tb.save({"x": torch.zeros(1)}, tmp_path / "o3" / "x.safetensors")
    (tmp_path / "o3" / "config.json").write_text("{}")
    kept = tb.quantize_checkpoint(src, tmp_path / "o3" / "q.safetensors", "mxfp4")
    assert kept.config is None and kept.config_kept == str(tmp_path / "o3" / "config.json")
    assert (tmp_path / "o3" / "config.json").read_text() == "{}"
    replaced = tb.quantize_checkpoint(
        src, tmp_path / "o3" / "q.safetensors", "mxfp4", overwrite=True
    )
    assert replaced.config == str(tmp_path / "o3" / "config.json")


def test_no_config_beside_the_source(tmp_path: Path) -> None:
    src = _model(tmp_path / "src", config=False)
    done = tb.quantize_checkpoint(src, tmp_path / "o" / "q.safetensors", "fp8-block", verify=True)
    assert done.config is None and done.config_kept is None and done.verified


def test_caveat_of_e5m2(tmp_path: Path) -> None:
    src = _model(tmp_path / "src")
    done = tb.quantize_checkpoint(src, f"{tmp_path / 'o'}/", "mxfp8", element="e5m2")
    assert done.caveat is not None and "e4m3" in done.caveat
    assert tb.quantize_checkpoint(src, f"{tmp_path / 'p'}/", "mxfp8").caveat is None


def test_refusals(tmp_path: Path) -> None:
    src = _model(tmp_path / "src")
    with pytest.raises(tb.QuantizationError, match="block_size= is fp8-block's"):
        tb.quantize_checkpoint(src, tmp_path / "a.safetensors", "mxfp4", block_size=(64, 64))
    with pytest.raises(tb.InvalidArgumentError, match="published safetensors layout"):
        tb.quantize_checkpoint(src, tmp_path / "a.npz", "mxfp4")
    q = tb.quantize_checkpoint(src, f"{tmp_path / 'q'}/", "mxfp4")
    with pytest.raises(tb.DestinationExistsError):
        tb.quantize_checkpoint(src, f"{tmp_path / 'q'}/", "mxfp4")
    with pytest.raises(tb.QuantizationError, match=r"is already quantized; dequantize it first"):
        tb.quantize_checkpoint(q.path, tmp_path / "qq.safetensors", "mxfp4")
    tb.save({"norm.weight": torch.ones(4)}, tmp_path / "n.safetensors")
    with pytest.raises(tb.QuantizationError, match="nothing to quantize"):
        tb.quantize_checkpoint(tmp_path / "n.safetensors", tmp_path / "o.safetensors", "mxfp8")
    assert not (tmp_path / "a.safetensors").exists() and not (tmp_path / "o.safetensors").exists()


def test_the_command_line_words_the_fixes_as_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The API's refusals name Python arguments; convert prints its options instead."""
    from tensorbridge.cli._errors import cli_words

    clash = "a.weight quantizes into a.weight_scale, which m.safetensors already holds; "
    assert cli_words(clash + "exclude one of them (leave 'a.weight_scale' out of names=)") == (
        clash + "exclude one of them (--exclude a.weight_scale)"
    )
    src = _model(tmp_path / "src")
    q = tb.quantize_checkpoint(src, f"{tmp_path / 'q'}/", "mxfp4")
    with pytest.raises(tb.QuantizationError, match=r"tb\.open\(src, dequantize='bf16'\)"):
        tb.quantize_checkpoint(q.path, tmp_path / "qq.safetensors", "mxfp4")
    argv = ["convert", q.path, str(tmp_path / "qq.safetensors"), "--quantize", "mxfp4"]
    assert main(argv) == 1
    assert capsys.readouterr().err == (
        f"tensorbridge convert: error: {q.path} is already quantized; dequantize it first "
        "(convert --dequantize bf16)\n"
    )


# (quantize_checkpoint's arguments, its message in Python's words, convert's options,
# the same message in the command line's words)
OPTION_REFUSALS = [
    (
        {"scheme": "gptq"},
        "scheme='gptq': tensorbridge dequantizes gptq but does not write it; pass one of "
        "fp8-block, mxfp8, mxfp4, nvfp4-modelopt, nvfp4-compressed-tensors",
        ["--quantize", "gptq"],
        "--quantize gptq: tensorbridge dequantizes gptq but does not write it; pass one of "
        "fp8-block, mxfp8, mxfp4, nvfp4-modelopt, nvfp4-compressed-tensors",
    ),
    (
        {"scheme": "mxfp8", "layout": "gpt-oss"},
        "layout='gpt-oss': mxfp8 is written in its published layout only; leave out layout= "
        "(other layouts: mxfp4 (gpt-oss))",
        ["--quantize", "mxfp8", "--layout", "gpt-oss"],
        "--layout gpt-oss: mxfp8 is written in its published layout only; leave out --layout "
        "(other layouts: mxfp4 (gpt-oss))",
    ),
    (
        {"scheme": "mxfp4", "element": "e5m2"},
        "element='e5m2': the element type is mxfp8's choice (e4m3 or e5m2); mxfp4's is "
        "fixed, leave out element=",
        ["--quantize", "mxfp4", "--element", "e5m2"],
        "--element e5m2: the element type is mxfp8's choice (e4m3 or e5m2); mxfp4's is "
        "fixed, leave out --element",
    ),
    (
        {"scheme": "mxfp4", "block_size": (64, 64)},
        "block_size= is fp8-block's; mxfp4 has fixed blocks (leave out block_size=)",
        ["--quantize", "mxfp4", "--block-size", "64,64"],
        "--block-size is fp8-block's; mxfp4 has fixed blocks (leave out --block-size)",
    ),
]


@pytest.mark.parametrize(("kwargs", "python", "argv", "options"), OPTION_REFUSALS)
def test_refusals_speak_python_and_convert_speaks_options(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    kwargs: dict[str, object],
    python: str,
    argv: list[str],
    options: str,
) -> None:
    """The library names its arguments (``scheme=``, ``layout=``); ``convert --quantize``
    says the same refusal with the options that give them."""
    src = _model(tmp_path / "src")
    dst = tmp_path / "o.safetensors"
    with pytest.raises(tb.QuantizationError) as e:
        tb.quantize_checkpoint(src, dst, **kwargs)  # type: ignore[arg-type]
    assert str(e.value) == python
    assert main(["convert", str(src), str(dst), *argv]) == 2
    assert capsys.readouterr().err == f"tensorbridge convert: error: {options}\n"
    assert not dst.exists()


def test_the_gpt_oss_refusal_speaks_python_and_convert_speaks_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.manual_seed(0)
    pre = "model.layers.0.mlp.experts."
    sd = {pre + "gate_up_proj": torch.randn(2, 64, 64), pre + "down_proj": torch.randn(2, 64, 64)}
    src = tmp_path / "e.safetensors"
    tb.save(sd, src)
    dst = tmp_path / "o.safetensors"
    why = (
        f"{pre}down_proj is left unquantized but model.layers.0.mlp.experts's other "
        "projection is not: transformers' gpt-oss MXFP4 loader converts a whole experts "
        "module; ignore both "
    )
    with pytest.raises(tb.QuantizationError) as e:
        tb.quantize_checkpoint(src, dst, "mxfp4", layout="gpt-oss", ignore=[pre + "down_proj"])
    assert str(e.value) == why + "(ignore=['model.layers.0.mlp.experts.*']) or neither"
    argv = ["convert", str(src), str(dst), "--quantize", "mxfp4", "--layout", "gpt-oss"]
    assert main([*argv, "--ignore", pre + "down_proj"]) == 1
    assert capsys.readouterr().err == (
        f"tensorbridge convert: error: {why}(--ignore 'model.layers.0.mlp.experts.*') or neither\n"
    )


def test_cast_report_says_scheme_as_its_own_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same refusal through ``cast-report --scheme``: there ``scheme=`` is ``--scheme``."""
    src = _model(tmp_path / "src")
    with tb.open(src) as f, pytest.raises(tb.QuantizationError, match=r"^scheme='gptq': "):
        tb.quant_report(f, scheme="gptq")
    assert main(["cast-report", str(src), "--scheme", "gptq"]) == 1
    assert capsys.readouterr().err.startswith(
        "tensorbridge cast-report: error: --scheme gptq: tensorbridge dequantizes gptq but "
        "does not write it; pass one of fp8-block"
    )


def test_the_command_line_is_this_call(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _model(tmp_path / "src")
    done = tb.quantize_checkpoint(src, f"{tmp_path / 'py'}/", "nvfp4-modelopt", verify=True)
    argv = ["convert", str(src), f"{tmp_path / 'cli'}/", "--quantize", "nvfp4-modelopt"]
    assert main([*argv, "--verify", "--json", "-q"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["quantized_weights"] == list(done.quantized)
    assert summary["left_unquantized"] == dict(done.left_unquantized)
    assert (summary["tensors"], summary["bytes_in"]) == (done.tensors, done.bytes_in)
    assert summary["verified"] is True
    assert (tmp_path / "cli" / "model.safetensors").read_bytes() == Path(done.path).read_bytes()


def test_copy_config(tmp_path: Path) -> None:
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "config.json").write_text(
        json.dumps({"model_type": "llama", "quantization_config": {"quant_method": "fp8"}})
    )
    target = copy_config(tmp_path / "q" / "model.safetensors", tmp_path / "d" / "m.safetensors")
    assert target == str(tmp_path / "d" / "config.json")
    assert json.loads((tmp_path / "d" / "config.json").read_text()) == {"model_type": "llama"}
    (tmp_path / "d" / "config.json").write_text("{}")
    assert copy_config(tmp_path / "q" / "m.safetensors", tmp_path / "d" / "m.safetensors") is None
    assert (tmp_path / "d" / "config.json").read_text() == "{}"
    assert copy_config(
        tmp_path / "q" / "m.safetensors", tmp_path / "d" / "m.safetensors", overwrite=True
    )
    assert copy_config(tmp_path / "q" / "a", tmp_path / "q" / "b") is None  # one directory


# --- tb.dequantize_checkpoint: convert --dequantize as one Python call ------------------------


def _quantized(tmp_path: Path, config: bool = True) -> Path:
    """An mxfp4 checkpoint (with its config.json, or none) and an activation scale."""
    src = _model(tmp_path / "src")
    done = tb.quantize_checkpoint(src, f"{tmp_path / 'q'}/", "mxfp4")
    q = Path(done.path)
    with tb.open(q) as f:
        sd = {n: f[n] for n in f}
    sd["model.layers.0.mlp.up_proj.input_scale"] = np.ones((), np.float32)
    tb.save(sd, q, overwrite=True)
    if not config:
        (q.parent / "config.json").unlink()
    return q


def test_dequantize_checkpoint_writes_the_unquantized_model(tmp_path: Path) -> None:
    q = _quantized(tmp_path)
    out = tmp_path / "w"
    done = tb.dequantize_checkpoint(q, f"{out}/", "bf16", verify=True)
    assert isinstance(done, tb.DequantizedCheckpoint)
    assert done.path == str(out / "model.safetensors") and done.dtype == "bfloat16"
    assert done.dequantized == ("model.layers.0.mlp.up_proj.weight",)
    assert done.dropped == ("model.layers.0.mlp.up_proj.input_scale",)
    assert done.verified is True and done.problems == ()
    want = tb.load(q, dequantize="bf16")
    got = tb.load(done.path)
    assert list(got) == list(want) and done.tensors == len(want)
    for name, value in want.items():
        assert np.array_equal(bits(got[name]), bits(value)), name
    config = json.loads((out / "config.json").read_text())
    assert done.config == str(out / "config.json")
    assert config == {"model_type": "llama", "hidden_size": 64}  # no quantization_config
    assert done.bytes_out == (out / "model.safetensors").stat().st_size
    assert done.bytes_in == sum(v.nbytes for v in want.values())


def test_dequantize_checkpoint_takes_what_no_config_says(tmp_path: Path) -> None:
    """fp8-block without a config: the block size is an argument (``block_size=``), never
    guessed; ``tb.open`` takes it too."""
    src = _model(tmp_path / "src", config=False)
    q = tb.quantize_checkpoint(src, tmp_path / "q.safetensors", "fp8-block", block_size=(16, 32))
    with pytest.raises(tb.QuantizationError, match="no block size"):
        tb.dequantize_checkpoint(q.path, tmp_path / "a.safetensors", "f32")
    assert not (tmp_path / "a.safetensors").exists()
    done = tb.dequantize_checkpoint(
        q.path, tmp_path / "w.safetensors", "f32", block_size=(16, 32), verify=True
    )
    assert done.verified and done.config is None
    assert set(done.dequantized) == set(q.quantized)
    with tb.open(q.path, dequantize="f32", block_size=(16, 32)) as f:
        w = "model.layers.0.mlp.up_proj.weight"
        assert np.array_equal(bits(f[w]), bits(tb.load(done.path)[w]))
    with pytest.raises(tb.InvalidArgumentError, match=r"^block_size= says how to dequantize"):
        tb.open(q.path, block_size=(16, 32))


def test_dequantize_checkpoint_of_open_files_and_refusals(tmp_path: Path) -> None:
    q = _quantized(tmp_path)
    w = "model.layers.0.mlp.up_proj.weight"
    with tb.open(q) as plain:  # read through its scheme here; the caller's file stays open
        done = tb.dequantize_checkpoint(plain, tmp_path / "a.npz", "f32", names=[w])
        assert plain.keys() and done.tensors == 1
    with tb.open(q, dequantize="f32") as f:  # already dequantizing: read as it is
        with pytest.raises(tb.InvalidArgumentError, match="opened dequantizing already"):
            tb.dequantize_checkpoint(f, tmp_path / "b.npz", "f32", scheme="mxfp4")
        one = tb.dequantize_checkpoint(f, tmp_path / "w.npy", "f32", names=[w])
    assert np.array_equal(tb.load(one.path), tb.load(done.path)[w])
    with pytest.raises(tb.InvalidArgumentError, match=r"a \.npy file holds one array but"):
        tb.dequantize_checkpoint(q, tmp_path / "c.npy", "f32")
    with pytest.raises(tb.InvalidArgumentError, match=r"'nope' is not a tensor of"):
        tb.dequantize_checkpoint(q, tmp_path / "c.npz", "f32", names=["nope"])
    with pytest.raises(tb.DestinationExistsError):
        tb.dequantize_checkpoint(q, tmp_path / "a.npz", "f32")
    with pytest.raises(tb.InvalidArgumentError, match="are not sharded"):
        tb.dequantize_checkpoint(q, tmp_path / "c.npz", "f32", max_shard_size="1KB")
    assert not (tmp_path / "c.npy").exists() and not (tmp_path / "c.npz").exists()


def test_dequantize_checkpoint_of_a_gguf_file(tmp_path: Path) -> None:
    """A GGUF file's blocks are dequantized by its reader: no scheme plan, no config."""
    g = tmp_path / "m.gguf"
    x = np.linspace(-1, 1, 4 * 64, dtype=np.float32).reshape(4, 64)
    tb.save({"w": x}, g, metadata={"general.architecture": "llama"}, quantize="q8_0")
    done = tb.dequantize_checkpoint(g, tmp_path / "w.safetensors", "f32", verify=True)
    assert done.plan is None and done.dequantized == () and done.verified
    assert np.array_equal(tb.load(done.path)["w"], tb.load(g, dequantize="f32")["w"])
    with tb.open(g) as plain, pytest.raises(tb.UnsupportedDtypeError, match="pass names="):
        tb.dequantize_checkpoint(plain, tmp_path / "v.safetensors", "f32")


def test_convert_dequantize_is_this_call(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import tensorbridge.checkpoint as checkpoint

    q = _quantized(tmp_path)
    done = tb.dequantize_checkpoint(q, f"{tmp_path / 'py'}/", "bf16", verify=True)
    calls: list[str] = []
    call = checkpoint.dequantize_checkpoint

    def spy(*args: object, **kwargs: object) -> object:
        calls.append(str(args[1]))
        return call(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(checkpoint, "dequantize_checkpoint", spy)
    argv = ["convert", str(q), f"{tmp_path / 'cli'}/", "--dequantize", "bf16"]
    assert main([*argv, "--verify", "--json", "-q"]) == 0
    assert calls == [f"{tmp_path / 'cli'}/"]
    summary = json.loads(capsys.readouterr().out)
    assert summary["dequantized"] == done.plan.summary()  # type: ignore[union-attr]
    assert summary["dropped"] == list(done.dropped) and summary["verified"] is True
    assert (summary["tensors"], summary["bytes_in"]) == (done.tensors, done.bytes_in)
    cli = tmp_path / "cli"
    assert (cli / "model.safetensors").read_bytes() == Path(done.path).read_bytes()
    assert (cli / "config.json").read_text() == (tmp_path / "py" / "config.json").read_text()
