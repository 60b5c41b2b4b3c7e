"""The ``tensorbridge`` command line: every command and error path, through ``main(argv)``.

Most tests run :func:`tensorbridge.cli.main` in-process and assert what it prints and
returns: the numbers in a table (checked against values worked out by hand on tiny
files), the bytes of a converted file, the one stderr line of an error. A few run the
installed console script and ``python -m tensorbridge`` in a subprocess.
"""

from __future__ import annotations

import io as pyio
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tensorbridge import diagnostics
from tensorbridge import io as tbio
from tensorbridge._versions import torch_e4m3fn_saturates
from tensorbridge.cli import main
from tensorbridge.dtypes import dtype_table, resolve_dtype
from tensorbridge.errors import FormatError

BF16 = resolve_dtype("bfloat16").numpy
FP8 = resolve_dtype("float8_e4m3fn").numpy
FORMATS = ["safetensors", "npz", "npy", "pt"]
COMMANDS = ["inspect", "convert", "compare", "cast-report", "demo"]
CAST_HEADER = ["tensor", "from", "to", "inf", "saturated", "to", "NaN", "to", "zero"]
CAST_HEADER += ["subnormal", "NaN", "changed", "max", "rel", "mean", "rel", "verdict"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    """``main(argv)`` with its exit status, stdout and stderr."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_error_line(err: str, command: str) -> str:
    """The message of the single ``tensorbridge COMMAND: error: ...`` line on stderr."""
    lines = err.splitlines()
    assert len(lines) == 1, err
    prefix = f"tensorbridge {command}: error: "
    assert lines[0].startswith(prefix), err
    assert "Traceback" not in err
    return lines[0][len(prefix) :]


def table(out: str) -> dict[str, list[str]]:
    """The rows of the (last) table in ``out``, split on whitespace, by their first cell."""
    lines = out.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("---")) + 1
    rows = [line.split() for line in lines[start:]]
    return {r[0]: r for r in rows if r and not r[0].startswith(("verdict:", "only", "kernel:"))}


def bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8).tobytes()


def assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    assert bits(got) == bits(want)


def bf16(values: Any) -> np.ndarray:
    return torch.tensor(values, dtype=torch.bfloat16).view(torch.int16).numpy().view(BF16)


@pytest.fixture
def small(tmp_path: Path) -> Path:
    """A bf16 2x2 [[1, 2], [3, 4]] and an int64 [0, 1, 2], with metadata."""
    path = tmp_path / "small.safetensors"
    tensors = {"w": bf16([[1.0, 2.0], [3.0, 4.0]]), "i": np.arange(3, dtype=np.int64)}
    tbio.save(tensors, path, metadata={"who": "test"})
    return path


# --- inspect ----------------------------------------------------------------------------------


def test_inspect_safetensors_table(capsys: pytest.CaptureFixture[str], small: Path) -> None:
    rc, out, err = run(capsys, "inspect", small)
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"{small}: 2 tensors, 32 B"
    assert lines[1].startswith("metadata: ")
    assert json.loads(lines[1].removeprefix("metadata: "))["who"] == "test"
    assert lines[2].split() == ["name", "dtype", "shape", "size"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[4:]}
    assert rows == {"w": ["bfloat16", "(2,", "2)", "8", "B"], "i": ["int64", "(3,)", "24", "B"]}


def test_inspect_stats_hand_computed(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    x = np.array([1.0, np.nan, np.inf, -np.inf, 3.0, 2.0], np.float32)
    tbio.save({"x": x, "w": bf16([[1.0, 2.0], [3.0, 4.0]])}, path)

    rc, out, err = run(capsys, "inspect", path, "--stats")
    assert (rc, err) == (0, "")
    rows = table(out)
    # finite x values 1, 3, 2: mean 2, population std sqrt(2/3); one NaN, two infinities
    assert rows["x"] == ["x", "float32", "(6,)", "24", "B", "1", "3", "2", "0.8165", "1", "2"]
    # 1, 2, 3, 4: mean 2.5, std sqrt(1.25) = 1.118
    assert rows["w"][-6:] == ["1", "4", "2.5", "1.118", "0", "0"]

    rc, out, _ = run(capsys, "inspect", path, "--stats", "--json")
    stats = {t["name"]: t["stats"] for t in json.loads(out)[0]["tensors"]}
    sx = stats["x"]
    assert (sx["numel"], sx["finite"], sx["nan_count"]) == (6, 3, 1)
    assert (sx["posinf_count"], sx["neginf_count"]) == (1, 1)
    assert (sx["min"], sx["max"], sx["mean"], sx["sum"]) == (1.0, 3.0, 2.0, 6.0)
    assert sx["std"] == pytest.approx(math.sqrt(2 / 3), rel=1e-12)
    assert stats["w"]["std"] == pytest.approx(math.sqrt(1.25), rel=1e-12)


def test_inspect_json(capsys: pytest.CaptureFixture[str], small: Path, tmp_path: Path) -> None:
    rc, out, err = run(capsys, "inspect", small, "--json")
    assert (rc, err) == (0, "")
    [report] = json.loads(out)  # a list, one entry a file, however many files
    assert report["file"] == str(small)
    assert report["metadata"]["who"] == "test"
    assert {t["name"]: t for t in report["tensors"]} == {
        "w": {"name": "w", "dtype": "bfloat16", "shape": [2, 2], "nbytes": 8},
        "i": {"name": "i", "dtype": "int64", "shape": [3], "nbytes": 24},
    }

    other = tmp_path / "other.npz"
    tbio.save({"z": np.zeros((2, 3), np.float16)}, other)
    rc, out, _ = run(capsys, "inspect", small, other, "--json")
    both = json.loads(out)
    assert [r["file"] for r in both] == [str(small), str(other)]
    assert both[1]["tensors"] == [{"name": "z", "dtype": "float16", "shape": [2, 3], "nbytes": 12}]


def test_inspect_sharded(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    tensors = {f"layer{i}.weight": np.full(300, i, np.float32) for i in range(3)}
    tbio.save(tensors, ckpt / "model.safetensors", max_shard_size=2000)
    assert len(list(ckpt.glob("model-0000?-of-00003.safetensors"))) == 3

    for target in (ckpt, ckpt / "model.safetensors.index.json"):
        rc, out, err = run(capsys, "inspect", target)
        assert (rc, err) == (0, "")
        assert out.splitlines()[0] == f"{target}: 3 tensors, 3.5 KiB"
        assert sorted(table(out)) == sorted(tensors)

    rc, out, _ = run(capsys, "inspect", ckpt, "--stats", "--json")
    means = {t["name"]: t["stats"]["mean"] for t in json.loads(out)[0]["tensors"]}
    assert means == {f"layer{i}.weight": float(i) for i in range(3)}


@pytest.mark.parametrize("fmt", ["npz", "npy", "pt"])
def test_inspect_other_formats(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fmt: str
) -> None:
    path = tmp_path / f"t.{fmt}"
    w = bf16([[1.0, -2.0, 3.0]])
    tbio.save(w if fmt == "npy" else {"w": w}, path)
    rc, out, err = run(capsys, "inspect", path, "--stats")
    assert (rc, err) == (0, "")
    name = "t" if fmt == "npy" else "w"
    assert out.splitlines()[0] == f"{path}: 1 tensor, 6 B"
    row = out.splitlines()[-1].split()
    assert row == [name, "bfloat16", "(1,", "3)", "6", "B", "-2", "3", "0.6667", "2.055", "0", "0"]


# --- convert ----------------------------------------------------------------------------------


def _patterns() -> dict[str, np.ndarray]:
    return {
        "w_bf16": np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(BF16),
        "w_fp8": np.arange(256, dtype=np.uint16).astype(np.uint8).view(FP8).reshape(16, 16),
        "n": np.arange(-3, 3, dtype=np.int64),
    }


@pytest.mark.parametrize("dst_fmt", FORMATS)
@pytest.mark.parametrize("src_fmt", FORMATS)
def test_convert_every_pair_bit_exact(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, src_fmt: str, dst_fmt: str
) -> None:
    src, dst = tmp_path / f"src.{src_fmt}", tmp_path / f"dst.{dst_fmt}"
    tensors = _patterns()
    if src_fmt == "npy":  # one array: every float8_e4m3fn bit pattern, named after the file
        tensors = {"src": tensors["w_fp8"]}
        tbio.save(tensors["src"], src)
    else:
        tbio.save(tensors, src)
    extra = ["--include", "w_bf16"] if dst_fmt == "npy" and src_fmt != "npy" else []

    rc, out, err = run(capsys, "convert", src, dst, "--verify", "--no-progress", *extra)
    assert (rc, err) == (0, "")
    assert out.splitlines()[-1] == "verify: bit-exact"
    expected = {"w_bf16": tensors["w_bf16"]} if extra else tensors
    assert f"converted {len(expected)} tensor{'s' if len(expected) > 1 else ''} (" in out
    got = tbio.load(dst)
    if dst_fmt == "npy":
        got = {next(iter(expected)): got}
    assert sorted(got) == sorted(expected)
    for name, want in expected.items():
        assert_same_bits(np.asarray(got[name]), want)


def _destinations() -> list[tuple[str, str, list[str]]]:
    """Every destination convert writes: (source kind, destination, extra options).

    Each suffix of each writable format row, a directory, a shard index, and what a DCP
    checkpoint converts to (a directory of .npy files, sharded safetensors, a Zarr store).
    """
    from tensorbridge.io._formats import FORMATS

    out = []
    for f in FORMATS:
        for suffix in f.suffixes if f.writes else ():
            extra = ["--include", "w"] if not f.many_arrays else []
            extra += [f"--metadata={k}=llama" for k in f.required_metadata]
            out.append(("file", f"out{suffix}", extra))
    out += [("file", "out/", []), ("file", "out.safetensors.index.json", [])]
    out += [("dcp", "out/", ["--format", "npy"]), ("dcp", "out/", []), ("dcp", "out.zarr", [])]
    return out


@pytest.mark.parametrize(
    ("source", "dst", "extra"), _destinations(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_what_convert_writes_inspect_and_load_read_back(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, source: str, dst: str, extra: list[str]
) -> None:
    for suffix, module in (
        (".zarr", "zarr"),
        (".h5", "h5py"),
        (".hdf5", "h5py"),
        (".onnx", "onnx"),
    ):
        if dst.endswith(suffix):
            pytest.importorskip(module, reason=f"{suffix} is an extra's format ({module})")
    w, b = np.arange(6, dtype=np.float32).reshape(2, 3), bf16([1.0, -2.0])
    if source == "dcp":
        import torch.distributed.checkpoint as dcp

        src = tmp_path / "dcp"
        with pytest.warns(UserWarning, match="torch.distributed"):  # no process group: one rank
            dcp.save({"w": torch.from_numpy(w), "b": tb_torch(b)}, checkpoint_id=src)
    else:
        src = tmp_path / "src.safetensors"
        tbio.save({"w": w, "b": b}, src)
    out = f"{tmp_path}{os.sep}{dst}"  # a Path would drop a directory's trailing /
    rc, _, err = run(capsys, "convert", src, out, "--no-progress", *extra)
    assert (rc, err) == (0, "")
    expected = {"w": w, "b": b}
    if "--include" in extra:  # one bare array, named after its file
        expected = {"out": w}
    rc, listing, err = run(capsys, "inspect", out, "--json")
    assert (rc, err) == (0, "")
    (doc,) = json.loads(listing)
    assert sorted(t["name"] for t in doc["tensors"]) == sorted(expected)
    got = tbio.load(out)
    if not isinstance(got, dict):
        got = {"out": got}
    assert sorted(got) == sorted(expected)
    for name, want in expected.items():
        assert_same_bits(np.asarray(got[name]), want)


def test_convert_pt_to_pt_keeps_the_nesting(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """{global_step, model: {...}, config_dict: {...}} stays that checkpoint: the code that
    loads it (ckpt["config_dict"]) still finds its keys."""
    model = {f"layers.{i}.{w}": torch.randn(2, 2) for i in range(3) for w in ("q", "k")}
    ckpt = {"global_step": 7, "model": model, "config_dict": {"dim": 2, "heads": [1, 2]}}
    torch.save(ckpt, tmp_path / "src.pt")
    rc, out, err = run(capsys, "convert", tmp_path / "src.pt", tmp_path / "dst.pt", "--verify")
    assert (rc, err) == (0, "") and "verify: bit-exact" in out
    got = torch.load(tmp_path / "dst.pt", weights_only=True)
    assert list(got) == ["global_step", "model", "config_dict"]
    assert got["config_dict"] == {"dim": 2, "heads": [1, 2]} and got["global_step"] == 7
    assert all(torch.equal(got["model"][k], v) for k, v in model.items())
    assert list(got["model"]) == list(model)  # dotted keys of the source stay single keys
    rc, _, err = run(capsys, "convert", tmp_path / "src.pt", tmp_path / "m.pt", "--metadata",
                     "global_step=8", "--metadata", "note=resumed")  # fmt: skip
    again = torch.load(tmp_path / "m.pt", weights_only=True)
    assert (rc, again["global_step"], again["note"], list(again)[:3]) == (
        0, 8, "resumed", ["global_step", "model", "config_dict"]
    )  # fmt: skip
    rc, _, err = run(capsys, "convert", tmp_path / "src.pt", tmp_path / "w.pt", "--no-metadata",
                     "--exclude", "model.layers.2.*")  # fmt: skip
    assert (rc, err) == (0, "")
    assert list(torch.load(tmp_path / "w.pt", weights_only=True)) == ["model"]
    rc, _, err = run(capsys, "convert", tmp_path / "src.pt", tmp_path / "x.pt",
                     "--exclude", "config_dict.heads.0")  # fmt: skip
    assert rc == 0  # plain values are metadata: the selection picks tensors
    torch.save({"layers": [torch.ones(1), torch.zeros(1)]}, tmp_path / "list.pt")
    rc, _, err = run(capsys, "convert", tmp_path / "list.pt", tmp_path / "y.pt",
                     "--exclude", "layers.0")  # fmt: skip
    assert rc == 2
    assert one_error_line(err, "convert") == (
        "list.pt: layers is a list, and leaving out its item 'layers.0' would "
        "renumber the items after it; keep all of its items or none (--include / --exclude), "
        "or convert to .safetensors / .npz / .gguf / .zarr / .h5 / .onnx, which keep flat names"
    )


def test_metadata_that_names_tensors_and_no_metadata(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """compressed-tensors' hadamards.safetensors: metadata keys equal to tensor names."""
    import tensorbridge as tb

    src = tmp_path / "hadamards.safetensors"
    tbio.save({"h1": np.eye(2), "h2": np.eye(2)}, src, metadata={"h1": "1", "h2": "2"})
    rc, _, err = run(capsys, "convert", src, tmp_path / "h.pt")
    assert rc == 1
    assert one_error_line(err, "convert") == (
        f"metadata key 'h1' of {src.name} is also a tensor's name; a torch zip archive cannot "
        "hold both: write .safetensors or .gguf or .zarr or .h5 or .onnx, or pass --no-metadata "
        "to leave the metadata out"
    )
    rc, _, err = run(capsys, "convert", src, tmp_path / "h.pt", "--no-metadata")
    assert (rc, err) == (0, "")
    assert sorted(torch.load(tmp_path / "h.pt", weights_only=True)) == ["h1", "h2"]
    rc, _, err = run(capsys, "convert", src, tmp_path / "h.npz")  # the hint names only homes
    homes = ".safetensors or .gguf or .zarr or .h5 or .onnx"
    assert rc == 0 and f"(convert to {homes} to keep it;" in err
    with tb.open(src) as f:
        with pytest.raises(tb.TensorBridgeError, match=r"or pass metadata=False to leave"):
            tb.save(f, tmp_path / "api.pt")
        tb.save(f, tmp_path / "api.pt", metadata=False)
        with pytest.warns(
            UserWarning, match=r"save to .safetensors or .gguf or .zarr or .h5 or .onnx to keep"
        ):
            tb.save(f, tmp_path / "api.npz")
        tb.save(f, tmp_path / "quiet.npz", metadata=False)  # no warning: asked for
    assert sorted(tbio.load(tmp_path / "api.pt")) == ["h1", "h2"]


def test_convert_help_says_what_each_destination_keeps(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tensorbridge.io._formats import FORMATS

    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps
    assert "destinations (by DST's suffix) and what each keeps:" in text
    for f in FORMATS:
        if f.writes:
            assert f"{', '.join(f.suffixes)} {f.keeps}" in text, f.name
    assert "--no-metadata leave SRC's metadata out" in text


def tb_torch(a: np.ndarray) -> torch.Tensor:
    from tensorbridge import to_torch

    return to_torch(a)


def test_convert_float_dtype_casts_floats_only(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    src, dst = tmp_path / "f32.safetensors", tmp_path / "bf16.npz"
    w = np.array([1.0, 0.1, -3.3e38, np.inf, 1e-40], np.float32)
    h = np.array([0.5, -65504.0], np.float16)
    n = np.array([2**62, -1], np.int64)
    tbio.save({"w": w, "h": h, "n": n}, src)

    rc, out, err = run(capsys, "convert", src, dst, "--float-dtype", "bf16", "--verify")
    assert (rc, err) == (0, "")
    assert "verify: bit-exact" in out
    got = tbio.load(dst)
    want_w = torch.from_numpy(w).to(torch.bfloat16).view(torch.int16).numpy().view(BF16)
    want_h = torch.from_numpy(h).to(torch.bfloat16).view(torch.int16).numpy().view(BF16)
    assert_same_bits(got["w"], want_w)
    assert_same_bits(got["h"], want_h)
    assert_same_bits(got["n"], n)  # integers keep their dtype and values


def test_convert_float_dtype_errors(capsys: pytest.CaptureFixture[str], small: Path) -> None:
    dst = small.parent / "out.safetensors"
    rc, _, err = run(capsys, "convert", small, dst, "--float-dtype", "bfloat17")
    msg = one_error_line(err, "convert")
    assert rc == 2  # a usage error
    assert "--float-dtype bfloat17 is not a floating-point dtype; pass one of " in msg
    assert "bfloat16" in msg and "float8_e4m3fn" in msg and "bf16" in msg and "int8" not in msg
    assert not dst.exists()

    rc, _, err = run(capsys, "convert", small, dst, "--float-dtype", "int8")
    msg = one_error_line(err, "convert")
    assert rc == 2
    assert "--float-dtype int8 is not a floating-point dtype" in msg and "bfloat16" in msg
    assert not dst.exists()


def test_convert_max_shard_size(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    src, dst = tmp_path / "one.npz", tmp_path / "out" / "model.safetensors"
    dst.parent.mkdir()
    tensors = {f"t{i}": np.full(300, i, np.float32) for i in range(3)}  # 1200 B each
    tbio.save(tensors, src)

    rc, out, err = run(capsys, "convert", src, dst, "--max-shard-size", "2KB", "--verify")
    assert (rc, err) == (0, "")
    index = tmp_path / "out" / "model.safetensors.index.json"
    assert f"-> {index} " in out
    assert out.splitlines()[-1] == "verify: bit-exact"
    shards = sorted(p.name for p in dst.parent.glob("*.safetensors"))
    assert shards == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    weight_map = json.loads(index.read_text())["weight_map"]
    assert sorted(set(weight_map.values())) == shards
    got = tbio.load(index)
    for name, want in tensors.items():
        assert_same_bits(got[name], want)

    rc, _, err = run(capsys, "convert", src, tmp_path / "x.npz", "--max-shard-size", "2KB")
    assert rc == 2
    assert "--max-shard-size needs a .safetensors destination" in one_error_line(err, "convert")


def test_convert_include_exclude(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    src, dst = tmp_path / "m.pt", tmp_path / "sel.safetensors"
    names = ["enc.0.weight", "enc.0.bias", "enc.1.weight", "dec.weight", "embed"]
    tbio.save({n: torch.full((2,), float(i)) for i, n in enumerate(names)}, src)

    rc, out, err = run(
        capsys, "convert", src, dst, "--include", "enc.*", "--include", "embed",
        "--exclude", "*.bias", "--json",
    )  # fmt: skip
    assert (rc, err) == (0, "")
    summary = json.loads(out)
    assert summary["tensors"] == 3 and summary["dst"] == str(dst)
    assert summary["bytes_in"] == 24
    with tbio.open(dst) as f:
        assert sorted(f.keys()) == ["embed", "enc.0.weight", "enc.1.weight"]

    rc, _, err = run(capsys, "convert", src, dst, "--include", "nothing*", "--overwrite")
    assert rc == 2
    assert "matches --include/--exclude" in one_error_line(err, "convert")


def test_convert_json_verify(capsys: pytest.CaptureFixture[str], small: Path) -> None:
    rc, out, err = run(capsys, "convert", small, small.parent / "o.pt", "--verify", "--json")
    assert (rc, err) == (0, "")
    summary = json.loads(out)
    assert summary["verified"] is True and summary["problems"] == []
    assert summary["tensors"] == 2 and summary["bytes_in"] == 32


def test_convert_verify_reports_mismatch(
    capsys: pytest.CaptureFixture[str], small: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_save = tbio.save

    def wrong_save(obj: Any, path: Any, **kwargs: Any) -> None:  # writes other values
        real_save({"w": bf16([[1.0, 2.0], [3.0, 5.0]])}, path, **kwargs)

    monkeypatch.setattr(tbio, "save", wrong_save)
    rc, out, err = run(capsys, "convert", small, small.parent / "o.safetensors", "--verify")
    assert (rc, err) == (1, "")
    assert "verify: 2 mismatches" in out
    assert "  w: the bytes differ" in out
    assert "  i: missing from the output" in out


def test_convert_npy_needs_one_tensor(capsys: pytest.CaptureFixture[str], small: Path) -> None:
    dst = small.parent / "x.npy"
    rc, out, err = run(capsys, "convert", small, dst)
    assert (rc, out) == (2, "")
    msg = one_error_line(err, "convert")
    assert "2 tensors were selected" in msg and "--include" in msg
    assert not dst.exists()


# --- compare ----------------------------------------------------------------------------------


def _perturbed(tmp_path: Path) -> tuple[Path, Path, int]:
    """Two files whose 'x' differs at one element by 4 float32 ULPs beyond the tolerance."""
    a = np.linspace(1000, 1001, 16, dtype=np.float32)
    rtol, atol = diagnostics.default_tolerances("float32")
    b = a.copy()
    edge = np.float32(a[5] + (atol + rtol * abs(float(a[5]))))
    for _ in range(4):
        edge = np.nextafter(edge, np.float32(np.inf))
    b[5] = edge
    assert abs(float(b[5]) - float(a[5])) > atol + rtol * abs(float(a[5]))
    ulps = int(b[5:6].view(np.int32)[0] - a[5:6].view(np.int32)[0])
    same = np.arange(4, dtype=np.int32)
    pa, pb = tmp_path / "ref.safetensors", tmp_path / "out.safetensors"
    tbio.save({"x": a, "k": same}, pa)
    tbio.save({"x": b, "k": same}, pb)
    return pa, pb, ulps


def test_compare_identical(capsys: pytest.CaptureFixture[str], small: Path) -> None:
    copy = small.parent / "copy.npz"
    tbio.save(tbio.load(small), copy)
    rc, out, err = run(capsys, "compare", small, copy)
    assert (rc, err) == (0, "")
    rows = table(out)
    assert rows["w"] == ["w", "bfloat16", "0", "0", "0", "0", "ok"]
    assert rows["i"] == ["i", "int64", "0", "0", "0", "0", "ok"]
    assert out.splitlines()[-1] == (
        "verdict: within tolerance (max abs err 0, max rel err 0; max ulp 0 counted in "
        "bfloat16; integers: max difference 0)"
    )


def test_compare_beyond_tolerance(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    a, b, ulps = _perturbed(tmp_path)
    rc, out, err = run(capsys, "compare", a, b)
    assert (rc, err) == (1, "")
    rows = table(out)
    assert rows["x"][-1] == "DIFF" and rows["x"][-3:-1] == [str(ulps), "1"]
    assert rows["k"][-1] == "ok"
    loss = f"max abs err 0.001526, max rel err 1.525e-06; max ulp {ulps} counted in float32"
    assert out.splitlines()[-1] == (
        f"verdict: 1 tensor differs ({loss}; integers: max difference 0)"
    )

    rc, out, _ = run(capsys, "compare", a, b, "--json")
    assert rc == 1
    result = json.loads(out)
    assert result["ok"] is False and result["max_ulp"] == ulps
    leaf = result["leaves"]["x"]  # tensor names, never Python reprs
    assert (leaf["ok"], leaf["mismatches"], leaf["worst_index"]) == (False, 1, [5])


@pytest.mark.parametrize("loosen", [["--rtol", "1e-5"], ["--atol", "0.01"]])
def test_compare_tolerance_flags(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, loosen: list[str]
) -> None:
    a, b, ulps = _perturbed(tmp_path)
    rc, out, err = run(capsys, "compare", a, b, *loosen)
    assert (rc, err) == (0, "")
    assert "DIFF" not in out
    assert out.splitlines()[-1] == (
        "verdict: within tolerance (max abs err 0.001526, max rel err 1.525e-06; "
        f"max ulp {ulps} counted in float32; integers: max difference 0)"
    )


def test_compare_missing_keys(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    a, b = tmp_path / "a.npz", tmp_path / "b.pt"
    tbio.save({"x": np.ones(3, np.float32), "only_a": np.zeros(1, np.float32)}, a)
    tbio.save({"x": np.ones(3, np.float32), "only_b": np.zeros(1, np.float32)}, b)
    rc, out, err = run(capsys, "compare", a, b)
    assert (rc, err) == (1, "")
    assert f"only in {a}: only_a\n" in out
    assert f"only in {b}: only_b\n" in out
    assert out.splitlines()[-1] == (
        "verdict: 2 tensors in only one file (max abs err 0, max rel err 0; max ulp 0 "
        "counted in float32)"
    )

    rc, out, _ = run(capsys, "compare", a, b, "--json")
    result = json.loads(out)
    assert rc == 1 and result["ok"] is False
    assert (result["missing"], result["extra"]) == (["only_a"], ["only_b"])


def test_compare_single_arrays(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    tbio.save(bf16([1.0, 2.0]), a)
    tbio.save(bf16([1.0, 2.015625]), b)  # one bf16 ULP above 2: within bf16's tolerance
    rc, out, err = run(capsys, "compare", a, b)
    assert (rc, err) == (0, "")
    # |2.015625 - 2| = 2**-6, relative 2**-7, one ULP; a renamed single array is "tensor"
    assert table(out)["tensor"] == ["tensor", "bfloat16", "0.01562", "0.007812", "1", "0", "ok"]


def _png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 5000


def test_compare_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    a, b, _ = _perturbed(tmp_path)
    png = tmp_path / "errors.png"
    rc, out, err = run(capsys, "compare", a, b, "--plot", png)
    assert (rc, err) == (1, "")
    assert "verdict: 1 tensor differs" in out
    assert f"plot: {png}: 2 tensors of 2, the worst by the most mismatches, then the " in out
    _png(png)


def test_compare_plot_complex(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    a, b, png = tmp_path / "a.npz", tmp_path / "b.npz", tmp_path / "c.png"
    tbio.save({"c": np.array([1 + 2j, 3 - 1j], np.complex64)}, a)
    tbio.save({"c": np.array([1 + 2j, 3 - 1.5j], np.complex64)}, b)
    rc, out, err = run(capsys, "compare", a, b, "--plot", png)  # no ComplexWarning (an error)
    assert (rc, err) == (1, "")
    assert table(out)["c"][:4] == ["c", "complex64", "0.5", "0.5"]
    _png(png)


# --- cast-report ------------------------------------------------------------------------------


def test_cast_report_fp8_saturates(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "c.safetensors"
    tbio.save({"w": np.array([1.0, 1e6, np.inf, np.nan], np.float32)}, path)
    rc, out, err = run(capsys, "cast-report", path, "--dtype", "float8_e4m3fn")
    assert (rc, err) == (1, "")
    lines = out.splitlines()
    assert lines[0].split() == CAST_HEADER
    # 1e6 and inf become ±448 (NaN before torch 2.13); 1.0 is exact; the NaN's bits change
    # (0x7fc00000 -> 0x7f)
    saturates = torch_e4m3fn_saturates()
    sat, nan, inf = ("2", "0", "±448 (saturates)") if saturates else ("0", "2", "NaN")
    assert table(out)["w"][:8] == ["w", "float32", "0", sat, nan, "0", "0", "1"]
    assert table(out)["w"][-1] == "LOSSY"
    assert lines[3].startswith("kernel: torch (") and f"±inf -> {inf}" in lines[3]
    assert lines[-1] == "verdict: lossy in float8_e4m3fn"

    rc, out, _ = run(capsys, "cast-report", path, "--dtype", "float8_e4m3fn", "--json")
    report = json.loads(out)
    assert rc == 1 and report["dtype"] == "float8_e4m3fn" and report["safe"] is False
    w = report["tensors"]["w"]
    assert (w["saturated"], w["exact"], w["overflow_inf"], w["nan_changed"]) == (int(sat), 1, 0, 1)


def test_cast_report_bf16_safe(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "s.npz"
    # 0.1 rounds (inexact, still safe); 1e-30 is a normal bf16 number (f32's exponent range)
    tbio.save({"w": np.array([0.5, 1.0, -2.0, 0.1, 1e-30], np.float32)}, path)
    rc, out, err = run(capsys, "cast-report", path, "--dtype", "bf16")
    assert (rc, err) == (0, "")
    assert table(out)["w"][:-3] == ["w", "float32", "0", "0", "0", "0", "0", "0"]
    assert out.splitlines()[-1] == (
        "verdict: safe to store in bfloat16 (max rel err 0.001598; pass --rtol to bound the "
        "rounding)"
    )

    rc, out, _ = run(capsys, "cast-report", path, "--dtype", "bf16", "--json")
    w = json.loads(out)["tensors"]["w"]
    assert rc == 0 and w["safe"] is True
    assert (w["exact"], w["inexact"]) == (3, 2)


@pytest.mark.parametrize(
    ("values", "dtype", "column"),
    [
        ([1.0, 1e-30], "f16", "flushed_to_zero"),  # below f16's smallest subnormal
        ([1.0, np.nan], "bf16", "nan_changed"),  # torch's f32->bf16 makes every NaN 0xffff
    ],
)
def test_cast_report_small_lossy(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, values: list[float], dtype: str, column: str
) -> None:
    path = tmp_path / "v.pt"
    tbio.save({"v": torch.tensor(values, dtype=torch.float32)}, path)
    rc, out, _ = run(capsys, "cast-report", path, "--dtype", dtype, "--json")
    report = json.loads(out)
    assert rc == 1 and report["safe"] is False
    assert report["tensors"]["v"][column] == 1


def test_cast_report_nan_and_imaginary_columns(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "v.safetensors"
    tbio.save({"v": torch.tensor([1.0, 1e6, float("inf")])}, path)
    rc, out, _ = run(capsys, "cast-report", path, "--dtype", "float8_e4m3fnuz")
    assert rc == 1
    assert table(out)["v"][:5] == ["v", "float32", "0", "0", "2"]  # no inf in fnuz: NaN

    tbio.save({"c": torch.tensor([1 + 2j, 3 + 0j], dtype=torch.complex64)}, path, overwrite=True)
    rc, out, _ = run(capsys, "cast-report", path, "--dtype", "float32")
    assert rc == 1
    assert "  NaN changed  imag dropped  max rel" in out.splitlines()[0]
    assert table(out)["c"][2:10] == ["0", "0", "0", "0", "0", "0", "1", "0"]


def test_cast_report_e8m0_zero_and_sign_columns(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    if "float8_e8m0fnu" not in {r.name for r in dtype_table()}:
        pytest.skip(reason="this torch or ml_dtypes has no float8_e8m0fnu")
    path = tmp_path / "scales.safetensors"
    tbio.save({"s": torch.tensor([0.0, -1.0, -4.0, 0.5])}, path)
    rc, out, _ = run(capsys, "cast-report", path, "--dtype", "e8m0")
    assert rc == 1
    header = out.splitlines()[0]
    assert "  NaN changed  zero replaced  sign dropped  max rel" in header
    # 0 -> 2^-127, -1 -> 1, -4 -> 4: one zero replaced, two signs dropped
    assert table(out)["s"][2:10] == ["0", "0", "0", "0", "0", "0", "1", "2"]
    assert "0 -> 5.87747e-39 (0x00); -1 -> 1" in out and out.endswith("lossy in float8_e8m0fnu\n")


NUMPY_ONLY_FLOATS = [r.name for r in dtype_table() if not r.in_torch and r.category == "float"]


@pytest.mark.parametrize("dtype", NUMPY_ONLY_FLOATS)
def test_cast_report_into_a_type_torch_lacks(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, dtype: str
) -> None:
    path = tmp_path / "w.npz"
    w = np.array([0.5, 1.0, 3e5, -2.0, np.nan], np.float32)
    tbio.save({"w": w}, path)
    want = diagnostics.cast_report(w, dtype)  # ml_dtypes' astype, as to_numpy runs it

    rc, out, err = run(capsys, "cast-report", path, "--dtype", dtype)

    assert (rc, err) == (1, "")  # 3e5 is beyond every one of these types
    lines = out.splitlines()
    assert lines[0].split() == CAST_HEADER
    counts = ["overflow_inf", "saturated", "nan_created", "flushed_to_zero", "subnormal"]
    counts.append("nan_changed")
    assert table(out)["w"][2:8] == [str(getattr(want, c)) for c in counts]
    assert lines[3] == f"kernel: ml_dtypes ({want.semantics})"
    assert lines[3].startswith(f"kernel: ml_dtypes (ml_dtypes' astype float32 -> {dtype} (torch")
    assert lines[-1] == f"verdict: lossy in {dtype}"

    rc, out, _ = run(capsys, "cast-report", path, "--dtype", dtype, "--json")
    report = json.loads(out)["tensors"]["w"]
    assert rc == 1 and report["kernel"] == "ml_dtypes" and report["exact"] == want.exact


def test_new_rows_in_a_file_inspect_compare_and_cast_report(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import ml_dtypes

    if not hasattr(ml_dtypes, "bcomplex32"):
        pytest.skip(reason="this ml_dtypes has no bcomplex32 (0.7 has)")
    ref, low = tmp_path / "ref.npz", tmp_path / "low.npz"
    w = np.array([0.25, 1.0, -3.0, 9.0], np.float32)
    q = np.array([0x07, 0x08, 0x18, 0x0F], np.uint8).view(ml_dtypes.int4)  # 7, -8, -8, -1
    c = np.array([1 + 2j, -0.5j], np.complex64)
    tbio.save({"w": w, "q": q, "c": c}, ref)
    tbio.save({"w": w.astype(ml_dtypes.float6_e2m3fn), "q": q, "c": c.astype("bcomplex32")}, low)

    rc, out, err = run(capsys, "inspect", low, "--stats")
    assert (rc, err) == (0, "")
    rows = table(out)  # name, dtype, shape, size ("4 B"), min, max, mean, std, nan, inf
    assert rows["w"][1:2] + rows["w"][5:] == [
        "float6_e2m3fn",
        "-3",
        "7.5",
        "1.438",
        "3.809",
        "0",
        "0",
    ]
    assert rows["q"][1:2] + rows["q"][5:7] == ["int4", "-8", "7"]  # the low 4 bits of each byte
    assert rows["c"][1:2] + rows["c"][5:7] == ["bcomplex32", "-0.5", "2"]
    rc, out, _ = run(capsys, "inspect", low, "--stats", "--json")
    stats = {t["name"]: t["stats"] for t in json.loads(out)[0]["tensors"]}
    assert (stats["w"]["subnormals"], stats["q"]["subnormals"], stats["c"]["subnormals"]) == (
        1,  # 0.25 is below float6_e2m3fn's smallest normal, 1.0
        None,
        0,
    )

    rc, out, err = run(capsys, "compare", ref, low)
    assert (rc, err) == (1, "")  # 9.0 became 7.5: 3 ULPs of float6_e2m3fn past its largest
    rows = table(out)  # tensor, dtype, max abs, max rel, max ulp, ulps of, mismatches, verdict
    want = ["float32/float6_e2m3fn", "1.5", "0.1667", "3", "float6_e2m3fn", "1", "DIFF"]
    assert rows["w"][1:] == want
    assert rows["q"][1:] == ["int4", "0", "0", "0", "integers", "(exact)", "0", "ok"]
    assert rows["c"][1:] == ["complex64/bcomplex32", "0", "0", "0", "bfloat16", "0", "ok"]
    assert run(capsys, "compare", low, low)[0] == 0

    rc, out, err = run(capsys, "cast-report", low, "--dtype", "f32")
    assert (rc, err) == (1, "") and "q" not in table(out)  # float tensors only
    assert table(out)["w"][-1] == "safe" and table(out)["c"][-1] == "LOSSY"  # -0.5j dropped
    kernels = [line for line in out.splitlines() if line.startswith("kernel:")]
    assert kernels == [
        "kernel: ml_dtypes (ml_dtypes' astype float6_e2m3fn -> float32 (torch has no "
        "float6_e2m3fn), as tb.to_numpy(x, dtype=...) runs it; widening: every value is kept "
        "exactly)",
        "kernel: ml_dtypes (ml_dtypes' astype bcomplex32 -> float32 (torch has no bcomplex32), "
        "as tb.to_numpy(x, dtype=...) runs it; the imaginary part is dropped; widening: every "
        "value is kept exactly; NaN -> 0x7fc00000)",
    ]

    rc, _, err = run(capsys, "cast-report", low, "--dtype", "int4")
    assert rc == 2 and "float6_e2m3fn" in one_error_line(err, "cast-report")


def test_cast_report_scheme_of_a_weight_torch_has_no_dtype_for(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # a float8_e4m3 weight is widened exactly (ml_dtypes) before it is quantized
    path = tmp_path / "w.npz"
    w = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
    e4m3 = resolve_dtype("float8_e4m3").numpy
    tbio.save({"a.weight": w.astype(e4m3), "b.weight": w.astype(e4m3).astype(np.float32)}, path)

    rc, out, err = run(capsys, "cast-report", path, "--scheme", "mxfp4", "--json")

    report = json.loads(out)
    assert (rc, err) == (0, "")
    a, b = report["weights"]["a.weight"], report["weights"]["b.weight"]
    assert a["max_rel_err"] == b["max_rel_err"] and a["stats"] == b["stats"]  # the same values


def test_cast_report_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "c.safetensors"
    rng = np.random.default_rng(0)
    a = rng.standard_normal(500).astype(np.float32)
    # c has no finite result to plot: its histogram is empty (no log scale for it)
    tbio.save({"a": a, "b": np.array([1e6], np.float32), "c": np.full(2, np.nan)}, path)
    png = tmp_path / "ulps.png"
    rc, out, err = run(capsys, "cast-report", path, "--dtype", "float8_e4m3fn", "--plot", png)
    assert (rc, err) == (1, "")
    assert out.splitlines()[-1] == "verdict: lossy in float8_e4m3fn"
    _png(png)


def test_compare_of_a_cast_copy_shows_the_cast_loss(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # 8224 is the bfloat16 tie between 8192 and 8256: it becomes 8192, 0 bfloat16 ULPs from
    # its own rounding but 32 away; an integer tensor beside it keeps the ULP dtype named
    a, b = tmp_path / "orig.pt", tmp_path / "bf16.pt"
    w = torch.tensor([8224.0, 1.0, -3.0])
    torch.save({"w": w, "step": torch.arange(3)}, a)
    torch.save({"w": w.to(torch.bfloat16), "step": torch.arange(3)}, b)
    rc, out, err = run(capsys, "compare", a, b)
    assert (rc, err) == (0, "")
    assert out.splitlines()[-1] == (
        "verdict: within tolerance (max abs err 32, max rel err 0.003891; max ulp 0 counted "
        "in bfloat16; integers: max difference 0)"
    )

    rc, out, _ = run(capsys, "compare", a, b, "--json")
    leaves = json.loads(out)["leaves"]
    assert rc == 0 and leaves["w"]["max_abs_err"] == 32.0
    assert sorted(leaf["path"] for leaf in leaves.values()) == ["step", "w"]  # not reprs


def test_compare_json_paths_are_tensor_names(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    a = tmp_path / "a.safetensors"
    tbio.save({"lm_head.weight": np.ones(2, np.float32), "b": np.zeros(1, np.float32)}, a)
    rc, out, _ = run(capsys, "compare", a, a, "--json")
    leaves = json.loads(out)["leaves"]
    assert rc == 0 and leaves["lm_head.weight"]["path"] == "lm_head.weight"
    assert leaves["b"]["path"] == "b"


def test_cast_report_rtol_decides_the_verdict(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "w.safetensors"
    # 0.3 becomes 0.3125 in float8_e4m3fn: 4.2 % off, nothing overflowed or flushed
    tbio.save({"w": np.array([1.0, 0.3], np.float32), "e": np.ones(2, np.float32)}, path)
    rc, out, err = run(capsys, "cast-report", path, "--dtype", "float8_e4m3fn")
    assert (rc, err) == (0, "")
    assert table(out)["w"][-3:] == ["0.04167", "0.02083", "safe"]
    lines = out.splitlines()
    assert lines[-2] == (
        "safe: nothing overflowed, saturated, flushed to zero, lost its zero or sign, or "
        "became or changed a NaN; rounding is not judged (pass --rtol to bound max rel)"
    )
    assert lines[-1] == (
        "verdict: safe to store in float8_e4m3fn (max rel err 0.04167; pass --rtol to bound "
        "the rounding)"
    )

    rc, out, err = run(capsys, "cast-report", path, "--dtype", "float8_e4m3fn", "--rtol", "0.01")
    assert (rc, err) == (1, "")
    assert table(out)["w"][-1] == "BEYOND-RTOL" and table(out)["e"][-1] == "ok"
    assert out.splitlines()[-2].endswith("; ok: safe, and max rel <= --rtol 0.01")
    assert out.splitlines()[-1] == (
        "verdict: 1 tensor beyond --rtol 0.01 in float8_e4m3fn (max rel err 0.04167)"
    )

    rc, out, _ = run(capsys, "cast-report", path, "--dtype", "float8_e4m3fn", "--rtol", "0.05")
    assert rc == 0
    assert (
        out.splitlines()[-1] == "verdict: within --rtol 0.05 in float8_e4m3fn (max rel err 0.04167)"
    )

    rc, out, _ = run(
        capsys, "cast-report", path, "--dtype", "float8_e4m3fn", "--rtol", "0.01", "--json"
    )
    doc = json.loads(out)
    assert rc == 1 and (doc["safe"], doc["ok"], doc["rtol"]) == (True, False, 0.01)
    assert doc["meaning"].startswith("safe: nothing overflowed")
    w = doc["tensors"]["w"]
    assert (w["safe"], w["ok"], w["rtol"]) == (True, False, 0.01)

    rc, _, err = run(capsys, "cast-report", path, "--dtype", "bf16", "--rtol", "-1")
    assert rc == 2 and one_error_line(err, "cast-report") == (
        "--rtol -1.0 is not a tolerance; pass a number >= 0"
    )


def test_cast_report_plot_picks_the_worst_and_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path, png = tmp_path / "m.safetensors", tmp_path / "ulps.png"
    rng = np.random.default_rng(0)
    # in float8_e4m3fn: values in [1, 2) round by at most 1/16; 1.3 * 2**-8 becomes the
    # subnormal 3 * 2**-9, 15 % off
    tensors = {f"t{i}": rng.uniform(1, 2, 64).astype(np.float32) for i in range(7)}
    tensors["tiny"] = np.full(64, 1.3 * 2.0**-8, np.float32)  # last in the file
    tbio.save(tensors, path)
    rc, out, err = run(capsys, "cast-report", path, "--dtype", "float8_e4m3fn", "--plot", png)
    assert (rc, err) == (0, "")
    assert table(out)["tiny"][6] == "64"  # the subnormal column
    plot = next(line for line in out.splitlines() if line.startswith("plot: "))
    assert plot == (
        f"plot: {png}: 6 tensors of 8, the worst by most values lost (overflowed, saturated, "
        "flushed to zero, NaN), then the largest max rel err, then the most subnormals "
        "(2 left out)"
    )
    _png(png)

    rc, out, _ = run(
        capsys, "cast-report", path, "--dtype", "float8_e4m3fn", "--plot", png, "--json"
    )
    drawn = json.loads(out)["plot"]
    assert drawn["tensors"][0] == "tiny" and drawn["left_out"] == 2 and len(drawn["tensors"]) == 6


@pytest.mark.parametrize("command", ["compare", "cast-report"])
def test_progress_follows_the_work_not_the_bytes(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    """A checkpoint of 12,000 small tensors (a few MiB) is seconds of work: a bar on a
    terminal; a few small tensors are not."""
    from tensorbridge import _progress

    assert _progress.expected_seconds(12_000 * 1024, 12_000, work="check") >= 1.0
    assert _progress.expected_seconds(20 * 4 << 12, 20, work="check") < 1.0
    path = tmp_path / "m.safetensors"
    tbio.save({f"t{i}": np.ones(4, np.float32) for i in range(20)}, path)
    argv = [path, path] if command == "compare" else [path, "--dtype", "bf16"]
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    rc, _, err = run(capsys, command, *argv)
    assert (rc, err) == (0, "")
    monkeypatch.setitem(_progress.WORK_RATES, "check", (32 << 20, 0.1))  # 20 tensors: 2 s
    rc, _, err = run(capsys, command, *argv)
    assert rc == 0 and ("comparing" if command == "compare" else "cast-report") in err
    rc, _, err = run(capsys, command, *argv, "--quiet")
    assert (rc, err) == (0, "")


def test_cast_report_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    ints = tmp_path / "ints.npz"
    tbio.save({"i": np.arange(3)}, ints)
    rc, _, err = run(capsys, "cast-report", ints, "--dtype", "bf16")
    assert rc == 2
    assert "has no floating-point or complex tensors" in one_error_line(err, "cast-report")

    floats = tmp_path / "f.npz"
    tbio.save({"f": np.ones(2, np.float32)}, floats)
    for bad in ("int8", "nope"):  # usage errors, in command-line syntax
        rc, _, err = run(capsys, "cast-report", floats, "--dtype", bad)
        assert rc == 2
        msg = one_error_line(err, "cast-report")
        assert msg.startswith(f"--dtype {bad} is not a floating-point dtype; pass one of ")
        assert "float32" in msg and "bf16" in msg and "int8," not in msg


# --- demo -------------------------------------------------------------------------------------


def test_demo(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "demo")
    assert (rc, err) == (0, "")
    assert "bit-exact round trip: True" in out
    assert "zero-copy: True" in out
    assert "  bytes: 1,579,520 (the usual .float().numpy() route: 3,159,040)" in out
    for name in ("model.safetensors", "model.npz"):
        line = next(line for line in out.splitlines() if line.startswith(name))
        assert "reloaded as torch.bfloat16, bit-exact: True, compare: ok=True max_ulp=0" in line


# --- errors -----------------------------------------------------------------------------------


def test_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "nope.safetensors"
    rc, out, err = run(capsys, "inspect", path)
    assert (rc, out) == (1, "")
    msg = one_error_line(err, "inspect")
    assert "No such file or directory" in msg and str(path) in msg


def test_unknown_suffix(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "model.txt"
    path.write_text("hello")
    rc, _, err = run(capsys, "inspect", path)
    assert rc == 1
    assert "model.txt': the first bytes match no format tensorbridge reads" in one_error_line(
        err, "inspect"
    )


def test_corrupt_safetensors(capsys: pytest.CaptureFixture[str], small: Path) -> None:
    small.write_bytes(small.read_bytes()[:40])  # truncated inside the header
    with pytest.raises(FormatError) as expected:
        tbio.open(small)
    for argv in (["inspect", small], ["compare", small, small], ["convert", small, "x.npz"]):
        rc, out, err = run(capsys, *argv)
        assert (rc, out) == (1, "")
        assert one_error_line(err, str(argv[0])) == str(expected.value)


def test_debug_reraises(capsys: pytest.CaptureFixture[str], small: Path) -> None:
    small.write_bytes(b"not a safetensors file at all")
    with pytest.raises(FormatError):
        main(["--debug", "inspect", str(small)])
    with pytest.raises(FileNotFoundError):
        main(["--debug", "inspect", str(small.parent / "missing.npz")])


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "the following arguments are required: COMMAND"),
        (["compare", "a.npz"], "the following arguments are required: B"),
        (["compare", "a.npz", "b.npz", "--rtol", "loose"], "invalid float value: 'loose'"),
    ],
)
def test_usage_errors(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert needle in err and err.startswith("usage: tensorbridge")


@pytest.mark.parametrize("command", ["compare", "cast-report"])
def test_plot_without_matplotlib(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    path = tmp_path / "f.npz"
    tbio.save({"f": np.ones(2, np.float32)}, path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    png = tmp_path / "p.png"
    argv = [path, path] if command == "compare" else [path, "--dtype", "bf16"]
    rc, _, err = run(capsys, command, *argv, "--plot", png)
    assert rc == 1  # a missing extra is no usage error (MissingExtraError)
    assert "pip install 'tensorbridge[plot]'" in one_error_line(err, command)
    assert not png.exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_an_example(capsys: pytest.CaptureFixture[str], command: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: tensorbridge {command}")
    assert "example" in out and f"  tensorbridge {command}" in out


def test_main_reads_sys_argv(
    capsys: pytest.CaptureFixture[str], small: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["tensorbridge", "inspect", str(small), "--json"])
    assert main() == 0
    assert json.loads(capsys.readouterr().out)[0]["file"] == str(small)


def test_top_level_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert all(c in out for c in COMMANDS)
    assert "example:\n  tensorbridge demo" in out


# --- colour -----------------------------------------------------------------------------------


class _Terminal(pyio.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_only_on_a_terminal(
    capsys: pytest.CaptureFixture[str], small: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    rc, out, _ = run(capsys, "compare", small, small)
    assert rc == 0 and "\033[" not in out

    term = _Terminal()
    monkeypatch.setattr(sys, "stdout", term)
    assert main(["compare", str(small), str(small)]) == 0
    coloured = term.getvalue()
    assert "\033[32mwithin tolerance\033[0m" in coloured
    # the escapes do not count towards the column widths
    header, rule = coloured.splitlines()[:2]
    assert len(header) == len(rule)

    monkeypatch.setenv("NO_COLOR", "1")
    term = _Terminal()
    monkeypatch.setattr(sys, "stdout", term)
    assert main(["compare", str(small), str(small)]) == 0
    assert "\033[" not in term.getvalue()


# --- subprocesses -----------------------------------------------------------------------------


def _console_script() -> str:
    script = shutil.which("tensorbridge", path=os.path.dirname(sys.executable))
    if script is None:
        pytest.skip(reason="the tensorbridge console script is not installed next to python")
    return script


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "NO_COLOR"} | {"PYTHONWARNINGS": "error"}


def test_console_script(small: Path) -> None:
    proc = subprocess.run(
        [_console_script(), "inspect", str(small), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert (proc.returncode, proc.stderr) == (0, "")
    assert "\033[" not in proc.stdout  # a pipe is not a terminal
    assert sorted(t["name"] for t in json.loads(proc.stdout)[0]["tensors"]) == ["i", "w"]

    proc = subprocess.run(
        [_console_script(), "inspect", str(small.parent / "missing.npz")],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert proc.returncode == 1 and proc.stdout == ""
    one_error_line(proc.stderr, "inspect")


def test_python_m_demo() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tensorbridge", "demo"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert (proc.returncode, proc.stderr) == (0, "")
    assert "bit-exact round trip: True" in proc.stdout


def test_broken_pipe_is_quiet(tmp_path: Path) -> None:
    path = tmp_path / "many.safetensors"
    tbio.save({f"tensor_{i:05d}": np.zeros(1, np.float32) for i in range(4000)}, path)
    proc = subprocess.Popen(
        [_console_script(), "inspect", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # like `| head -1`: the reader goes away, 150 KB still to write
    err = proc.stderr.read()
    proc.stderr.close()
    # 141 (128 + SIGPIPE, as a shell reports it): not 1, which means "outside tolerance"
    assert proc.wait(timeout=120) == 141
    assert first.startswith(str(path).encode())
    assert err == b""


# --- the command line as new users meet it (issue 27 section 3) --------------------------------


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import tensorbridge

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"tensorbridge {tensorbridge.__version__}\n"


def test_inspect_reports_every_file(
    capsys: pytest.CaptureFixture[str], small: Path, tmp_path: Path
) -> None:
    missing = tmp_path / "missing.pt"
    rc, out, err = run(capsys, "inspect", small, missing)
    assert rc == 1
    assert out.startswith(f"{small}: 2 tensors")  # the good file is listed all the same
    assert one_error_line(err, "inspect") == f"{missing}: No such file or directory"
    rc, out, err = run(capsys, "inspect", missing, small, "--json")
    doc = json.loads(out)  # one valid JSON list, an entry a file
    assert rc == 1 and err == ""
    assert doc[0] == {"file": str(missing), "error": f"{missing}: No such file or directory"}
    assert doc[1]["file"] == str(small) and len(doc[1]["tensors"]) == 2


def test_an_unexpected_error_is_one_line(
    capsys: pytest.CaptureFixture[str], small: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any) -> int:
        raise RuntimeError("boom")

    monkeypatch.setattr("tensorbridge.cli.inspect.run", broken)
    rc, out, err = run(capsys, "inspect", small)
    assert (rc, out) == (1, "")
    assert one_error_line(err, "inspect") == (
        "unexpected RuntimeError: boom (a bug in tensorbridge: rerun with --debug for the "
        "traceback and report it)"
    )
    with pytest.raises(RuntimeError, match="boom"):
        main(["--debug", "inspect", str(small)])


@pytest.mark.parametrize("below", ["x.safetensors", "d/x.safetensors", "d/e/x.pt", "d/e/"])
def test_a_destination_under_a_file_has_one_message(
    capsys: pytest.CaptureFixture[str], small: Path, tmp_path: Path, below: str
) -> None:
    (tmp_path / "f").write_bytes(b"a file")
    dst = f"{tmp_path / 'f'}/{below}"
    rc, _, err = run(capsys, "convert", small, dst)
    written = dst + "model.safetensors" if dst.endswith("/") else dst
    assert rc == 1
    assert one_error_line(err, "convert") == (
        f"cannot write {written}: {tmp_path / 'f'} is a file, not a directory; a file stands "
        "where a directory is needed; save to another path"
    )


def test_convert_says_which_directory_it_created(
    capsys: pytest.CaptureFixture[str], small: Path, tmp_path: Path
) -> None:
    dst = tmp_path / "new" / "deeper" / "o.safetensors"
    rc, out, err = run(capsys, "convert", small, dst)
    assert (rc, err) == (0, "")
    assert out.rstrip().endswith(f" s (created the directory {dst.parent}/)")
    rc, out, _ = run(capsys, "convert", small, dst.parent / "p.safetensors", "--json")
    assert rc == 0 and "created_directory" not in json.loads(out)  # it existed this time
    rc, out, _ = run(capsys, "convert", small, tmp_path / "n2" / "q.npz", "--json")
    assert json.loads(out)["created_directory"] == str(tmp_path / "n2")


# (.npz is not among them: from one NumPy file to another, strings are copied as they are)
@pytest.mark.parametrize("suffix", [".safetensors", ".pt", ".gguf"])
def test_nothing_to_write_is_an_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, suffix: str
) -> None:
    src = tmp_path / "strings.npz"
    np.savez(src, a=np.array(["x", "y"]), b=np.array([b"z"]))
    dst = tmp_path / f"out{suffix}"
    meta = ["--metadata", "general.architecture=llama"] if suffix == ".gguf" else []
    rc, _, err = run(capsys, "convert", src, dst, "--skip-unsupported", *meta)
    assert rc == 1 and not dst.exists()
    assert err.splitlines()[-1] == (
        f"tensorbridge convert: error: every selected entry of {src} is unsupported (2 entries "
        "skipped); nothing to convert, so nothing was written"
    )


def test_progress_is_estimated_from_the_work(monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorbridge._progress import SHOW_AFTER, expected_seconds, progress_bar
    from tensorbridge.io import safetensors

    assert safetensors.progress_bar is progress_bar  # the formats' bar is the one estimate's

    assert expected_seconds(12_000 * 64, 12_000) >= SHOW_AFTER  # many small tensors: a bar
    assert expected_seconds(41 << 20, 8, work="check") >= SHOW_AFTER  # 41 MiB compared
    assert expected_seconds(1 << 20, 4, work="check") < SHOW_AFTER
    assert expected_seconds(8 << 20, 100) < SHOW_AFTER  # a small copy: no bar flashes past
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    bar = progress_bar(12_000 * 64, "x", None, tensors=12_000)
    try:
        assert "tqdm" in type(bar).__name__  # under 64 MiB, shown all the same
    finally:
        bar.close()
    assert type(progress_bar(1024, "x", None, tensors=1)).__name__ == "NoBar"


def test_errors_name_options_not_python_calls(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    src = tmp_path / "wide.npz"
    np.savez(src, x=np.zeros(2, np.longdouble), s=np.array(["a"]), o=np.array([1, None]))
    rc, _, err = run(capsys, "convert", src, tmp_path / "o.safetensors")
    line = one_error_line(err, "convert")
    assert rc == 1 and line.endswith("3 entries cannot be converted: pass --exclude x (each) "
                                     "or --skip-unsupported")  # fmt: skip
    rc, out, _ = run(capsys, "inspect", src)
    said = [x for x in out.splitlines() if x.startswith("unsupported:")] + [line]
    assert len(said) == 4
    assert "float128 (16 bytes) has no torch dtype" in said[0]  # what and why stay
    for text in said:  # the Python fix (a.astype(...), np.frombuffer(...)) goes
        assert not any(p in text for p in ("astype", "np.", "(a", "pass a", "dtype="))


def _help_texts() -> dict[str, list[tuple[str, str | None]]]:
    import argparse

    from tensorbridge.cli import _parser

    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {
        name: [(a.dest, a.help) for a in p._actions if not isinstance(a, argparse._HelpAction)]
        for name, p in sub.choices.items()
    }


def test_every_argument_has_help() -> None:
    texts = _help_texts()
    assert sorted(texts) == sorted(COMMANDS)
    for command, args in texts.items():
        for dest, text in args:
            assert text, f"{command} {dest} has no help text"
    quiet = dict(texts["inspect"])
    assert "--no-progress" in str(quiet["quiet"]) and "--quiet" in str(quiet["no_progress"])


def test_convert_help_lists_what_each_suffix_keeps(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    out = capsys.readouterr().out
    listing = out[out.index("\ndestinations (") : out.index("examples:")]
    rows: dict[str, str] = {}  # a row starts two spaces in; its continuation lines further
    last = ""
    for line in listing.splitlines():
        if line.startswith("   "):
            rows[last] += " " + line.strip()
        elif line.startswith("  "):
            last = line.split("  ")[1].strip()
            rows[last] = line
    assert set(rows) == {
        ".safetensors", ".npy", ".npz", ".pt, .pth, .bin", ".gguf", ".zarr", ".h5, .hdf5",
        ".onnx", "DIR/", "NAME.safetensors.index.json", "DIR/ --format npy",
    }  # fmt: skip
    assert "--into MODEL" in rows[".onnx"]
    assert "--into MODEL" in out and "(.onnx destinations)" in out  # the row's own option
    assert "metadata as text" in rows[".safetensors"] and "shards" in rows[".safetensors"]
    assert "one array, of any dtype of the table; no metadata" in rows[".npy"]
    assert "of any dtype of the table (int4, float6, ...)" in rows[".npz"]  # issue 29
    assert "general.architecture required" in rows[".gguf"]
    assert "nesting and plain values" in rows[".pt, .pth, .bin"]


def test_cast_report_without_dtype_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], small: Path
) -> None:
    rc, out, err = run(capsys, "cast-report", small)
    assert (rc, out) == (2, "")
    assert "pass --dtype DTYPE" in one_error_line(err, "cast-report")


def test_plurals() -> None:
    from tensorbridge.cli import _plural

    assert [_plural(n, "entry") for n in (1, 2)] == ["1 entry", "2 entries"]
    assert _plural(3, "mismatch") == "3 mismatches" and _plural(2, "key") == "2 keys"
    assert _plural(1_000, "tensor") == "1,000 tensors"


def test_json_metadata_keeps_gguf_types(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    meta = {"general.architecture": "llama", "flag": True, "ids": [1, 2, 3], "names": ["a"]}
    tbio.save({"w": np.ones(2, np.float32)}, path, metadata={**meta, "eps": 0.5})
    rc, out, _ = run(capsys, "inspect", path, "--json")
    assert rc == 0
    assert json.loads(out)[0]["metadata"] == {**meta, "eps": 0.5}


_FOREIGN_FILES = {
    "model.tflite": (b"\x1c\x00\x00\x00TFL3" + bytes(40), "a TensorFlow Lite model"),
    "model.mlmodel": (b"\x08\x04\x12\x08\x0a\x06\x0a\x04in_x", "a Core ML model (.mlmodel)"),
    "saved_model.pb": (b"\x08\x01\x12\x04\x0a\x02\x0a\x00", "a TensorFlow SavedModel"),
}


@pytest.mark.parametrize("name", sorted(_FOREIGN_FILES))
def test_other_toolkits_files_are_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str
) -> None:
    data, what = _FOREIGN_FILES[name]
    (tmp_path / name).write_bytes(data)
    _check_foreign(capsys, tmp_path / name, what)


def _check_foreign(capsys: pytest.CaptureFixture[str], path: Path, what: str) -> None:
    rc, _, err = run(capsys, "inspect", path)
    line = one_error_line(err, "inspect")
    named_like_torch = path.suffix in (".pt", ".pth", ".bin", ".ckpt")  # says it is none too
    said = f"not a torch.save archive: it is {what}" if named_like_torch else what
    assert rc == 1 and line.startswith(f"'{path}' is {said}, a format tensorbridge does not read")
    assert "a legacy (pre-1.6) torch.save file" in line  # among the formats read


def test_other_toolkits_directories_are_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    saved = tmp_path / "saved"
    (saved / "variables").mkdir(parents=True)
    (saved / "saved_model.pb").write_bytes(_FOREIGN_FILES["saved_model.pb"][0])
    _check_foreign(capsys, saved, "a TensorFlow SavedModel")
    package = tmp_path / "m.mlpackage"
    (package / "Data" / "com.apple.CoreML").mkdir(parents=True)
    (package / "Manifest.json").write_text("{}")
    _check_foreign(capsys, package, "a Core ML package (.mlpackage)")


def test_help_imports_neither_torch_nor_the_readers() -> None:
    code = (
        "import sys\n"
        "from tensorbridge.cli import _parser\n"
        "p = _parser()\n"
        "assert 'torch' not in sys.modules and 'tensorbridge.io' not in sys.modules\n"
        "try:\n"
        "    p.parse_args(['convert', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_env()
    )
    assert done.returncode == 0, done.stderr
    assert "  .gguf " in done.stdout  # the destinations, made when the help is printed


def test_library_hints_become_the_options_they_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    np.save(tmp_path / "w.npy", bf16([1.0, 2.0]))  # plain np.save: raw |V2 bytes
    rc, out, _ = run(capsys, "inspect", tmp_path / "w.npy")  # listed as unsupported, with why
    line = next(x for x in out.splitlines() if x.startswith("unsupported: "))
    assert rc == 0 and "; name it with --as-dtype bfloat16; the 2-byte types are" in line
    assert "tb.load" not in line and "dtype=" not in line
    rc, out, _ = run(capsys, "inspect", tmp_path / "w.npy", "--as-dtype", "bfloat16")
    assert rc == 0 and "bfloat16" in out


def test_help_text_is_the_format_tables() -> None:
    """``convert --help`` prints a stored copy of the destinations and of the formats' own
    save options (no torch import): current."""
    from tensorbridge import _help_text, cli

    assert cli.destinations_from_table() == _help_text.DESTINATIONS
    assert cli.save_options_from_table() == _help_text.SAVE_OPTIONS
