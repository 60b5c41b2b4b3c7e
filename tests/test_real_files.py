"""Checkpoints as other tools write them, and the edges users hit first with them.

Every file here is made by the tool that publishes such files (``huggingface_hub``,
``transformers``, ``torch.save`` of every era, ``torch.jit.save``, ``np.save``), never
by tensorbridge, and every test asserts what a user gets: the bytes, the names, the
one-line message, the exit status, the files left on disk.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

import tensorbridge as tb
from tensorbridge.cli import main
from tensorbridge.io._detect import detect

hub = pytest.importorskip("huggingface_hub", reason="huggingface_hub makes the Hub layouts")


def run(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def error_line(err: str, command: str) -> str:
    lines = [line for line in err.splitlines() if not line.startswith("note: ")]
    assert len(lines) == 1, err
    prefix = f"tensorbridge {command}: error: "
    assert lines[0].startswith(prefix), err
    return lines[0][len(prefix) :]


def bits(x: Any) -> bytes:
    a = x.detach().contiguous().view(torch.uint8).numpy() if isinstance(x, torch.Tensor) else x
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8).tobytes()


def state_dict() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(64, 16, generator=g).to(torch.bfloat16),
        "layers.0.weight": torch.randn(16, 16, generator=g),
        "layers.0.bias": torch.randn(16, generator=g).to(torch.float16),
        "layers.1.weight": torch.randn(16, 16, generator=g).to(torch.float8_e4m3fn),
        "steps": torch.arange(5, dtype=torch.int64),
    }


def same(got: dict[str, Any], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert tb.torch_dtype(got[k].dtype) is v.dtype, k
        assert bits(got[k]) == bits(v), k


# --- sharded checkpoints -------------------------------------------------------------------


@pytest.mark.parametrize("safe", [False, True], ids=["bin", "safetensors"])
def test_hub_sharded_checkpoints_read_as_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], safe: bool
) -> None:
    sd = state_dict()
    hub.save_torch_state_dict(sd, tmp_path, max_shard_size=600, safe_serialization=safe)
    index = "model.safetensors.index.json" if safe else "pytorch_model.bin.index.json"
    shards = sorted(p.name for p in tmp_path.iterdir() if p.name != index)
    assert len(shards) == 3 and (tmp_path / index).exists()
    for where in (tmp_path, tmp_path / index):
        same(tb.load(where), sd)
        with tb.open(where) as f:
            assert type(f).__name__ == "ShardedFile" and len(f) == len(sd)
            assert {f.shard_of(k) for k in f} == set(shards)
    rc, out, err = run(capsys, "inspect", tmp_path / index)
    assert (rc, err) == (0, "")
    assert out.splitlines()[0] == f"{tmp_path / index}: 5 tensors, 3.3 KiB"
    rc, out, err = run(capsys, "convert", tmp_path, tmp_path / "one.safetensors", "--verify")
    assert (rc, err) == (0, "") and out.splitlines()[-1] == "verify: bit-exact"
    same(tb.load(tmp_path / "one.safetensors"), sd)
    rc, out, _ = run(capsys, "compare", tmp_path, tmp_path / "one.safetensors")
    assert rc == 0 and out.splitlines()[-1].startswith(
        "verdict: within tolerance (max abs err 0, max rel err 0; max ulp 0 counted in "
    )


def test_shard_index_naming_a_missing_shard(tmp_path: Path) -> None:
    hub.save_torch_state_dict(state_dict(), tmp_path, max_shard_size=600, safe_serialization=False)
    (tmp_path / "pytorch_model-00002-of-00003.bin").unlink()
    with pytest.raises(tb.FormatError, match=r"names the shard pytorch_model-00002-of-00003.bin"):
        tb.open(tmp_path)


def test_directory_prefers_safetensors_like_transformers(tmp_path: Path) -> None:
    sd = state_dict()
    torch.save({k: v + 0 for k, v in sd.items() if k == "steps"}, tmp_path / "pytorch_model.bin")
    hub.save_torch_state_dict(sd, tmp_path)  # one model.safetensors
    with tb.open(tmp_path) as f:
        assert f.filename == "model.safetensors" and len(f) == 5


# --- legacy torch.save, sniffing, refusals ------------------------------------------------------


def test_legacy_torch_save_is_read_by_the_pickle_machine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # torch's legacy format cannot hold float8 (torch.load itself fails on it): no fp8 here
    sd = {k: v for k, v in state_dict().items() if v.dtype is not torch.float8_e4m3fn}
    path = tmp_path / "old.pt"
    torch.save({"model": sd, "epoch": 7}, path, _use_new_zipfile_serialization=False)
    assert detect(path) == "pt-legacy"
    got = tb.load(path)
    same({k.removeprefix("model."): v for k, v in got.items()}, sd)
    with tb.open(path) as f:
        assert f.metadata == {"epoch": "7"} and f.plain_values() == {"epoch": 7}
        assert f.notes == ["old.pt: legacy torch.save format (before torch 1.6): its "
                           "storages were read into memory, not memory-mapped"]  # fmt: skip
        assert not f["model.steps"].flags.writeable  # the same read-only rule as mapped files
        t = f.get("model.steps", framework="torch")
        t += 1  # torch results are private: writable, and other reads do not see the write
        assert f["model.steps"].tolist() == [0, 1, 2, 3, 4]
    rc, _, err = run(capsys, "inspect", path)
    assert rc == 0 and err.startswith("note: old.pt: legacy torch.save format")
    rc, _, err = run(capsys, "inspect", path, "--quiet")
    assert (rc, err) == (0, "")


@pytest.mark.parametrize(
    ("maker", "name", "kind", "note"),
    [
        ("torch", "model.safetensors", "pt", "a torch zip archive, not a safetensors file"),
        ("safetensors", "model.pt", "safetensors", "a safetensors file, not a torch zip archive"),
        ("npy", "w.npz", "npy", "a .npy file, not a .npz archive"),
        ("npz", "w.npy", "npz", "a .npz archive, not a .npy file"),
    ],
)
def test_files_are_read_by_content_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], maker: str, name: str, kind: str, note: str
) -> None:
    path, x = tmp_path / name, torch.arange(6, dtype=torch.int16)
    with open(path, "wb") as f:
        if maker == "torch":
            torch.save({"x": x}, f)
        elif maker == "safetensors":
            from safetensors.torch import save

            f.write(save({"x": x}))
        elif maker == "npy":
            np.save(f, x.numpy())
        else:
            np.savez(f, x=x.numpy())
    assert detect(path) == kind
    got = tb.load(path)
    assert bits(got if isinstance(got, np.ndarray) else got["x"]) == bits(x)
    with tb.open(path) as f:
        assert f.notes[0].startswith(f"{name} is {note}; read it as such (rename it to ")
    rc, _, err = run(capsys, "inspect", path)
    assert rc == 0 and err.startswith(f"note: {name} is {note}")


@pytest.mark.filterwarnings("ignore:`torch.jit.(script|save)` is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:`torch.jit.(script|save)` is deprecated:FutureWarning")  # 2.15
def test_torchscript_is_refused_and_pickled_modules_give_their_state_dict(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    torch.jit.save(torch.jit.script(model), tmp_path / "scripted.pt")
    with pytest.raises(tb.FormatError) as e:
        tb.open(tmp_path / "scripted.pt")
    assert str(e.value) == (
        f"'{tmp_path / 'scripted.pt'}' is a TorchScript archive (torch.jit.save): it holds a "
        "program, not a state dict; if you trust it, torch.jit.load(path).state_dict() gives "
        "its weights"
    )
    for legacy in (False, True):
        path = tmp_path / f"whole{legacy}.pt"
        torch.save(model, path, _use_new_zipfile_serialization=not legacy)
        with tb.open(path) as f:  # the module is never built: its pickled state is read
            assert f.keys() == ["weight", "bias"] and f.unsupported() == {}
            assert f["weight"].tolist() == model.weight.tolist()
            assert any("torch.nn.modules.linear.Linear" in n for n in f.notes)


def test_an_empty_gguf_is_read_and_plain_pickles_are_refused(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(16))
    with tb.open(tmp_path / "m.gguf") as f:  # no tensors, no metadata: nothing wrong
        assert f.keys() == [] and f.metadata == {}
    (tmp_path / "p.pt").write_bytes(pickle.dumps({"w": [1, 2]}, protocol=4))
    with pytest.raises(tb.FormatError, match=r"not a torch\.save archive: it starts with 80 04"):
        tb.open(tmp_path / "p.pt")


# --- .npz with members that are not tensors, and np.save'd ml_dtypes arrays ----------------------


def test_npz_with_unsupported_members(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mixed.npz"
    w = np.arange(6, dtype=np.float32)
    np.savez(path, w=w, names=np.array(["abc", "de"]), i=np.arange(3))
    with tb.open(path) as f:
        assert f.keys() == ["w", "names", "i"]  # everything listed
        assert list(f.unsupported()) == ["names"]
    with pytest.raises(tb.UnsupportedDtypeError) as e:
        tb.load(path)
    assert "member 'names.npy': string dtype <U3" in str(e.value)
    assert str(e.value).endswith(
        "; read the other entries with keys= (command line: --exclude names, or --skip-unsupported)"
    )
    assert sorted(tb.load(path, keys=["w", "i"])) == ["i", "w"]

    rc, out, _ = run(capsys, "inspect", path)
    assert rc == 0 and out.splitlines()[0] == f"{path}: 2 tensors, 48 B, 1 unsupported"
    assert "names  unsupported" in out and "unsupported: " in out
    dst = tmp_path / "out.safetensors"
    rc, _, err = run(capsys, "convert", path, dst)
    assert rc == 1 and not dst.exists()
    assert error_line(err, "convert").endswith(
        "1 entry cannot be converted: pass --exclude names or --skip-unsupported"
    )
    rc, out, err = run(capsys, "convert", path, dst, "--skip-unsupported")
    assert rc == 0 and err.startswith("skipped names: ")
    assert out.startswith("converted 2 tensors (")
    assert sorted(tb.load(dst)) == ["i", "w"]
    rc, out, err = run(capsys, "convert", path, dst, "--exclude", "names", "--overwrite")
    assert (rc, err) == (0, "") and sorted(tb.load(dst)) == ["i", "w"]


RAW = [r.name for r in tb.dtype_table() if r.numpy.type.__module__.startswith("ml_dtypes")]
RAW = [n for n in RAW if n != "complex32"]  # np.save writes complex32 as '<c4': covered below


@pytest.mark.parametrize("name", RAW)
def test_np_saved_ml_dtypes_arrays_read_with_dtype(tmp_path: Path, name: str) -> None:
    dt = getattr(ml_dtypes, name)
    width = np.dtype(dt).itemsize
    every = np.arange(256, dtype=np.uint8) if width == 1 else np.arange(65536, dtype=np.uint16)
    a = every.view(dt)  # every bit pattern, NaN payloads included
    np.save(tmp_path / "a.npy", a)
    np.savez(tmp_path / "a.npz", a=a, idx=np.arange(3))
    with pytest.raises(tb.UnsupportedDtypeError) as e:
        tb.load(tmp_path / "a.npy")
    kinds = ", ".join(r.name for r in tb.dtype_table() if r.carried and r.itemsize == width)
    assert str(e.value).endswith(f"the {width}-byte types are {kinds}")
    assert "--as-dtype" in str(e.value) and "bfloat16 view" not in str(e.value)
    got = tb.load(tmp_path / "a.npy", dtype=name)
    assert got.dtype == dt and bits(got) == bits(a)
    both = tb.load(tmp_path / "a.npz", dtype=name)
    assert both["a"].dtype == dt and bits(both["a"]) == bits(a)
    assert both["idx"].dtype == np.int64  # other members keep their own dtype
    other = "bfloat16" if width == 1 else "float8_e4m3fn"
    with pytest.raises(tb.UnsupportedDtypeError, match=rf"dtype='{other}' does not fit raw"):
        tb.load(tmp_path / "a.npy", dtype=other)


def test_as_dtype_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = np.arange(100, dtype=np.uint16).view(ml_dtypes.bfloat16)
    np.save(tmp_path / "w.npy", a)
    rc, out, err = run(capsys, "convert", tmp_path / "w.npy", tmp_path / "w.safetensors",
                       "--as-dtype", "bf16", "--verify")  # fmt: skip
    assert (rc, err) == (0, "") and out.splitlines()[-1] == "verify: bit-exact"
    with tb.open(tmp_path / "w.safetensors") as f:
        assert f.info("w")[0].name == "bfloat16" and bits(f["w"]) == bits(a)
    with pytest.raises(ValueError, match=r"is a safetensors file: to cast values pass float_dt"):
        tb.load(tmp_path / "w.safetensors", dtype="bf16")


# --- nothing dropped: metadata and tied weights --------------------------------------------------


def test_convert_keeps_metadata(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import save_file

    src = tmp_path / "lora.safetensors"  # as LoRA trainers write them: modelspec metadata
    meta = {"modelspec.architecture": "stable-diffusion-xl", "ss_epoch": "3"}
    save_file({"w": torch.ones(2)}, src, metadata=meta)
    rc, _, err = run(capsys, "convert", src, tmp_path / "copy.safetensors")
    assert (rc, err) == (0, "")
    with tb.open(tmp_path / "copy.safetensors") as f:
        assert f.metadata == {"format": "pt", **meta}  # the writer's "format" mark is added
    rc, _, err = run(capsys, "convert", src, tmp_path / "copy.pt")
    assert (rc, err) == (0, "")
    assert torch.load(tmp_path / "copy.pt", weights_only=True)["ss_epoch"] == "3"

    ckpt = tmp_path / "train.pt"
    torch.save({"model": {"w": torch.ones(2)}, "epoch": 7, "lr": 0.5}, ckpt)
    rc, _, err = run(capsys, "convert", ckpt, tmp_path / "t.safetensors")
    assert (rc, err) == (0, "")
    with tb.open(tmp_path / "t.safetensors") as f:
        assert f.metadata == {"format": "pt", "epoch": "7", "lr": "0.5"}
    rc, _, err = run(capsys, "convert", ckpt, tmp_path / "t2.pt")
    again = torch.load(tmp_path / "t2.pt", weights_only=True)
    assert (rc, err) == (0, "") and (again["epoch"], again["lr"]) == (7, 0.5)  # typed
    rc, out, err = run(capsys, "convert", ckpt, tmp_path / "t.npz", "--json")
    assert rc == 0 and json.loads(out)["dropped_metadata"] == ["epoch", "lr"]
    assert err == (
        "note: dropped metadata epoch, lr: .npz files have no place for it (convert to "
        ".safetensors or .pt or .gguf or .zarr or .h5 or .onnx to keep it; --no-metadata leaves it "
        "out "
        "without this note)\n"
    )


def test_tied_weights_from_transformers_round_trip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    transformers = pytest.importorskip("transformers", reason="from_pretrained is the oracle")
    cfg = transformers.LlamaConfig(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    torch.save(model.state_dict(), theirs / "pytorch_model.bin")  # both names, one storage
    hf = tmp_path / "hf"
    model.save_pretrained(hf)  # transformers' own safetensors: the tie written once
    capsys.readouterr()  # transformers' progress bar
    ours = tmp_path / "ours"
    cfg.save_pretrained(ours)
    rc, out, err = run(capsys, "convert", theirs, ours / "model.safetensors", "--verify")
    assert (rc, err) == (0, "")
    n = len(model.state_dict())
    assert out.startswith(f"converted {n} tensors (")
    with tb.open(ours / "model.safetensors") as f:
        assert f.aliases == {"lm_head.weight": "model.embed_tokens.weight"}
        assert len(f) == n
    with tb.open(hf / "model.safetensors") as f:
        assert len(f) == n - 1  # transformers drops lm_head.weight and re-ties on load
    # the same tensors written once: the files differ only by the header's few bytes
    size, hf_size = (
        os.path.getsize(ours / "model.safetensors"),
        os.path.getsize(hf / "model.safetensors"),
    )
    assert abs(size - hf_size) < 200, (size, hf_size)
    loaded = transformers.LlamaForCausalLM.from_pretrained(ours)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


# --- destinations ------------------------------------------------------------------------------


@pytest.fixture
def src(tmp_path: Path) -> Path:
    path = tmp_path / "src.safetensors"
    tb.save(state_dict(), path)
    return path


@pytest.mark.parametrize("dst", ["weights.json", "out/config.json"])
def test_json_destinations_are_refused(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], dst: str
) -> None:
    rc, _, err = run(capsys, "convert", src, tmp_path / dst)
    assert rc == 2 and not (tmp_path / dst).exists()
    assert error_line(err, "convert").endswith(
        "a .json destination holds no tensors; write NAME.safetensors, or "
        "NAME.safetensors.index.json for a sharded checkpoint in that directory"
    )


def test_an_index_destination_means_a_sharded_checkpoint(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index = tmp_path / "out" / "model.safetensors.index.json"
    rc, out, err = run(capsys, "convert", src, index, "--verify")
    assert (rc, err) == (0, "") and f"-> {index} in " in out
    assert sorted(os.listdir(tmp_path / "out")) == [
        "model-00001-of-00001.safetensors",
        "model.safetensors.index.json",
    ]
    same(tb.load(index), state_dict())


@pytest.mark.parametrize("shard", [[], ["--max-shard-size", "1500"]], ids=["one", "sharded"])
@pytest.mark.parametrize("exists", [False, True], ids=["new", "existing"])
def test_directory_destinations_follow_one_rule(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], shard: list[str], exists: bool
) -> None:
    out = tmp_path / "outdir"
    if exists:
        out.mkdir()
    rc, _, err = run(capsys, "convert", src, f"{out}/", *shard)
    assert (rc, err) == (0, "")
    names = sorted(os.listdir(out))
    assert names == ["model.safetensors"] if not shard else names[-1].endswith(".index.json")
    same(tb.load(out), state_dict())


def test_a_path_without_a_suffix_is_not_guessed(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, err = run(capsys, "convert", src, tmp_path / "newdir")
    assert rc == 2 and not (tmp_path / "newdir").exists()
    assert "has no format suffix and is not a directory; end it with / " in err


def test_nothing_is_overwritten_unasked(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = src.read_bytes()
    rc, _, err = run(capsys, "convert", src, src, "--float-dtype", "float8_e5m2")
    assert rc == 1 and src.read_bytes() == before
    assert error_line(err, "convert") == (
        f"{src} exists; pass --overwrite to replace it"  # the option, not a Python argument
    )
    rc, _, err = run(capsys, "convert", src, src, "--float-dtype", "bf16", "--overwrite")
    assert (rc, err) == (0, "")
    assert tb.load(src)["layers.0.weight"].dtype == ml_dtypes.bfloat16
    with pytest.raises(tb.DestinationExistsError) as e:
        tb.save({"x": torch.ones(1)}, src)  # the Python API refuses by default too
    assert isinstance(e.value, FileExistsError) and "overwrite=True" in str(e.value)
    tb.save({"x": torch.ones(1)}, src, overwrite=True)
    assert list(tb.load(src)) == ["x"]
    sharded = tmp_path / "sh"
    tb.save(state_dict(), f"{sharded}/", max_shard_size=1500)
    with pytest.raises(tb.DestinationExistsError, match=r"and \d+ more files of that checkpoint"):
        tb.save(state_dict(), sharded / "model.safetensors")


def test_temporary_names_never_reach_the_user(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(tb.DestinationError) as e:
        tb.save({"x": torch.ones(1)}, tmp_path / "m.safetensors")
    assert isinstance(e.value, OSError) and e.value.errno == errno.ENOSPC
    assert str(e.value) == (
        f"[Errno {errno.ENOSPC}] cannot write {tmp_path / 'm.safetensors'}: No space left on "
        "device; free space (or raise the file size limit) or save to another disk"
    )
    assert ".tmp" not in str(e.value) and os.listdir(tmp_path) == ["src.safetensors"]


# --- command-line contract ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--float-dtype", "bfloat17"], "--float-dtype bfloat17 is not a floating-point dtype"),
        (["--float-dtype", "int8"], "--float-dtype int8 is not a floating-point dtype"),
        (["--max-shard-size", "5XB"], "max_shard_size='5XB' is not a positive size"),
        (["--as-dtype", "nope"], "--as-dtype nope is not a dtype"),
    ],
)
def test_usage_errors_exit_2(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    rc, _, err = run(capsys, "convert", src, tmp_path / "o.safetensors", *argv)
    assert rc == 2 and error_line(err, "convert").startswith(message)
    assert not (tmp_path / "o.safetensors").exists()


def test_float_dtype_error_lists_floats_and_aliases(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, err = run(capsys, "convert", src, tmp_path / "o.npz", "--float-dtype", "int8")
    listed = error_line(err, "convert").split("pass one of ")[1].split(", ")
    assert {"bfloat16", "float32", "float8_e4m3fn", "bf16", "f16", "f32", "f64"} <= set(listed)
    assert not {"int8", "bool", "uint8", "int64", "complex64"} & set(listed)


def test_negative_tolerances_are_usage_errors(
    src: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for option in ("--rtol", "--atol"):
        rc, _, err = run(capsys, "compare", src, src, option, "-1")
        assert rc == 2
        assert error_line(err, "compare") == f"{option} -1.0 is not a tolerance; pass a number >= 0"


def test_empty_npz_holds_no_arrays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.savez(tmp_path / "empty.npz")
    rc, _, err = run(capsys, "convert", tmp_path / "empty.npz", tmp_path / "o.safetensors")
    assert rc == 1
    assert error_line(err, "convert").endswith("empty.npz holds no arrays or tensors; nothing to "
                                               "convert")  # fmt: skip


def test_compare_across_dtypes_says_where_ulps_are_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x = torch.linspace(-3, 3, 101)
    tb.save({"x": x}, tmp_path / "f32.safetensors")
    tb.save({"x": x.to(torch.bfloat16)}, tmp_path / "bf16.safetensors")
    rc, out, _ = run(capsys, "compare", tmp_path / "f32.safetensors", tmp_path / "bf16.safetensors")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split() == ["tensor", "dtype", "max", "abs", "max", "rel", "max", "ulp",
                                "ulps", "of", "mismatches", "verdict"]  # fmt: skip
    assert lines[2].split()[1] == "float32/bfloat16" and lines[2].split()[5] == "bfloat16"
    assert lines[-1] == (
        "verdict: within tolerance (max abs err 0.0075, max rel err 0.00337; max ulp 0 counted "
        "in bfloat16)"
    )  # the cast's own loss shown beside the ULPs, which are counted in the coarser dtype


def test_verify_after_a_cast_says_what_it_checked(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = run(capsys, "convert", src, tmp_path / "o.safetensors", "--float-dtype",
                     "float8_e4m3fn", "--verify")  # fmt: skip
    assert rc == 0
    assert out.splitlines()[-1] == (
        "verify: bit-exact to the source cast to float8_e4m3fn (torch's kernel); the cast "
        "itself may round: see tensorbridge cast-report"
    )


def test_summary_reports_bytes_in_and_out(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = run(capsys, "convert", src, tmp_path / "o.safetensors", "--float-dtype", "f32",
                     "--json")  # fmt: skip
    summary = json.loads(out)
    assert rc == 0 and summary["bytes_out"] == os.path.getsize(tmp_path / "o.safetensors")
    assert summary["bytes_in"] == sum(v.numel() * v.element_size() for v in state_dict().values())
    rc, out, _ = run(capsys, "convert", src, tmp_path / "one.npz", "--include", "steps")
    assert out.startswith("converted 1 tensor (40 B in, ")


# --- one writability rule ------------------------------------------------------------------------


def test_load_writability_does_not_depend_on_storage(tmp_path: Path) -> None:
    a = np.arange(6, dtype=np.float32)
    np.savez(tmp_path / "plain.npz", a=a, empty=np.zeros(0))
    np.savez_compressed(tmp_path / "packed.npz", a=a, empty=np.zeros(0))
    np.save(tmp_path / "big.npy", a.astype(">f4"))
    torch.save({"a": torch.from_numpy(a)}, tmp_path / "t.pt")
    tb.save({"a": a, "empty": np.zeros(0)}, tmp_path / "s.safetensors")
    for name in ("plain.npz", "packed.npz", "big.npy", "t.pt", "s.safetensors"):
        path = tmp_path / name
        for mmap, writable in ((True, False), (False, True)):
            got = tb.load(path, mmap=mmap)
            arrays = [got] if isinstance(got, np.ndarray) else list(got.values())
            assert [x.flags.writeable for x in arrays] == [writable] * len(arrays), (name, mmap)
        tensors = tb.load(path, framework="torch")
        for t in [tensors] if isinstance(tensors, torch.Tensor) else tensors.values():
            t.add_(0)  # torch results are always writable


def test_npz_members_named_like_zip_paths(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "nested.npz", "w") as zf, zf.open("dir/a.npy", "w") as f:
        np.save(f, np.arange(3))
    assert tb.load(tmp_path / "nested.npz")["dir/a"].tolist() == [0, 1, 2]


@pytest.mark.parametrize("order", ["kept-first", "kept-last"])
def test_ties_survive_sharding(tmp_path: Path, order: str) -> None:
    w = torch.randn(64, 64)
    names = ["embed.weight", "mid", "lm_head.weight"]
    sd = {"embed.weight": w, "mid": torch.ones(64, 64), "lm_head.weight": w}
    if order == "kept-last":
        sd = {"mid": torch.ones(64, 64), "embed.weight": w, "lm_head.weight": w}
    tb.save(sd, f"{tmp_path}/", max_shard_size=64 * 64 * 4)
    with tb.open(tmp_path) as f:
        assert sorted(f.keys()) == sorted(names)
        assert f.aliases == {"lm_head.weight": "embed.weight"}
        assert "lm_head.weight" not in f.metadata
        assert np.shares_memory(f["embed.weight"], f["lm_head.weight"])
        assert bits(f["lm_head.weight"]) == bits(w)


def test_progress_bars_show_when_asked_and_stay_quiet_otherwise(
    src: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    x = {"w": torch.randn(1000)}
    tb.compare(x, x, progress=True)
    assert "comparing" in capsys.readouterr().err  # tqdm's bar, on stderr
    tb.compare(x, x)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr("tensorbridge._progress.SHOW_AFTER", 0.0)  # every work is "long"
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    rc, _, err = run(capsys, "inspect", src, "--stats")
    assert rc == 0 and "stats src.safetensors" in err
    rc, _, err = run(capsys, "inspect", src, "--stats", "--quiet")
    assert (rc, err) == (0, "")
