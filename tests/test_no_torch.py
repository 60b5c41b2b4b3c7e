"""Commands that need no torch do not import it (about 2.7 s of every command otherwise).

``tensorbridge inspect`` of a file, and ``convert`` between the formats NumPy can hold
without a cast (safetensors, .npy, .npz, GGUF, Zarr, ONNX, in every direction; bfloat16 and
float8 through ml_dtypes) run in a fresh interpreter in which ``import torch`` raises,
and must still succeed, writing the source's bytes unchanged. Reading or writing a
``.pt`` file and casting (``--float-dtype``) still import torch and still work.

Inspecting a safetensors file and copying it to ``.npz``, ``.npy`` or safetensors do not
import ml_dtypes either (about 0.8 s): no value of a bfloat16 array is needed, only its
header and bytes, and the files written are byte for byte those of the arrays.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import tensorbridge as tb

# The commands given as JSON in argv[1], run one after another by the command line's
# main() in this interpreter; with NO_TORCH, importing torch raises (the command then
# fails with that error) and torch must be absent at the end. Prints which of torch and
# ml_dtypes were loaded.
RUNNER = r"""
import json, sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"{name} imported by a command that needs no torch")
        return None

commands, no_torch = json.loads(sys.argv[1]), sys.argv[2] == "NO_TORCH"
if no_torch:
    sys.meta_path.insert(0, NoTorch())
from tensorbridge.cli import main

for argv in commands:
    status = main(["--debug", *argv])
    if status:
        sys.exit(f"tensorbridge {' '.join(argv)} exited with {status}")
print(json.dumps([m for m in ("torch", "ml_dtypes") if m in sys.modules]))
"""

FLOAT = np.array([[1.5, -0.0, np.inf], [np.nan, 3.25e-3, -7.0]], np.float32)
ARRAYS: dict[str, np.ndarray] = {
    "f32": FLOAT,
    "bf16": FLOAT.astype(ml_dtypes.bfloat16),
    "fp8": FLOAT[:, :2].astype(ml_dtypes.float8_e4m3fn),  # no inf in e4m3fn
    "i32": np.arange(-3, 3, dtype=np.int32).reshape(3, 2),
}
FORMATS = ("safetensors", "npy", "npz", "gguf", "zarr", "onnx")
EXTRAS = {"zarr": "Zarr stores", "onnx": "writing ONNX models"}  # formats of an optional package
NO_FP8 = ("gguf",)  # GGUF has no float8 tensor type
ARCH = ["--metadata", "general.architecture=llama"]  # what a GGUF file must name


def run(commands: list[list[str]], no_torch: bool) -> bool:
    """Run ``commands`` in a fresh interpreter; whether torch was imported by the end."""
    return "torch" in loaded_by(commands, no_torch)


def loaded_by(commands: list[list[str]], no_torch: bool) -> list[str]:
    """Run ``commands`` in a fresh interpreter; which of torch and ml_dtypes it imported."""
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, json.dumps(commands), "NO_TORCH" if no_torch else "-"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


def needs(fmt: str) -> None:
    """Skip where the format's optional package is missing."""
    if fmt in EXTRAS:
        pytest.importorskip(fmt, reason=f"{EXTRAS[fmt]} need pip install tensorbridge[{fmt}]")


def held(fmt: str) -> dict[str, np.ndarray]:
    """The arrays a file of ``fmt`` holds in these tests."""
    if fmt == "npy":
        return {"bf16": ARRAYS["bf16"]}
    return {k: v for k, v in ARRAYS.items() if not (fmt in NO_FP8 and k == "fp8")}


def source(tmp_path: Path, fmt: str) -> Path:
    """A file of ``fmt`` holding :func:`held`'s arrays."""
    needs(fmt)
    path = tmp_path / f"source.{fmt}"
    arrays = held(fmt)
    if fmt == "npy":
        tb.save(arrays["bf16"], path)
    else:
        meta = {"general.architecture": "llama"} if fmt == "gguf" else None
        tb.save(arrays, path, metadata=meta)
    return path


def read_back(path: Path) -> dict[str, Any]:
    with tb.open(path) as f:
        return {name: np.array(f[name]) for name in f}


def same_bytes(got: dict[str, Any], want: dict[str, np.ndarray]) -> None:
    if len(want) == 1 and len(got) == 1:  # a .npy names its one array after nothing
        got = {next(iter(want)): next(iter(got.values()))}
    assert sorted(got) == sorted(want)
    for name, a in want.items():
        assert got[name].dtype == a.dtype, name
        assert got[name].shape == a.shape, name
        assert got[name].tobytes() == a.tobytes(), name


@pytest.mark.parametrize("src", FORMATS)
def test_inspect_and_convert_import_no_torch(tmp_path: Path, src: str) -> None:
    path = source(tmp_path, src)
    commands = [["inspect", str(path)], ["inspect", "--json", str(path)]]
    expected: dict[Path, dict[str, np.ndarray]] = {}
    for dst in FORMATS:
        needs(dst)
        out = tmp_path / f"out-{dst}.{dst}"
        argv = ["convert", str(path), str(out), "--quiet"]
        want = held(src)
        if dst == "npy" and len(want) > 1:  # one array a file
            argv += ["--include", "bf16"]
            want = {"bf16": want["bf16"]}
        if dst in NO_FP8 and "fp8" in want:
            argv += ["--exclude", "fp8"]
            want = {k: v for k, v in want.items() if k != "fp8"}
        if dst == "gguf":
            argv += ARCH
        commands.append(argv)
        expected[out] = want
    assert run(commands, no_torch=True) is False
    for out, want in expected.items():
        same_bytes(read_back(out), want)


def test_sharded_convert_and_the_numpy_api_import_no_torch(tmp_path: Path) -> None:
    path = source(tmp_path, "safetensors")
    shards = tmp_path / "sharded"
    commands = [
        ["convert", str(path), f"{shards}/", "--max-shard-size", "40", "--quiet"],
        ["inspect", f"{shards}/"],
        ["convert", f"{shards}/", str(tmp_path / "joined.npz"), "--quiet"],
    ]
    assert run(commands, no_torch=True) is False
    assert len(list(shards.glob("*.safetensors"))) > 1
    same_bytes(read_back(tmp_path / "joined.npz"), held("safetensors"))
    # tb.load / tb.save of NumPy arrays: the Python API without tensors
    code = (
        "import sys, tensorbridge as tb\n"
        f"arrays = tb.load({str(path)!r})\n"
        f"tb.save(arrays, {str(tmp_path / 'api.npz')!r})\n"
        "assert 'torch' not in sys.modules, 'tb.load / tb.save of arrays imported torch'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    same_bytes(read_back(tmp_path / "api.npz"), held("safetensors"))


def test_inspect_and_copies_of_a_safetensors_file_import_no_ml_dtypes(tmp_path: Path) -> None:
    path = source(tmp_path, "safetensors")  # bfloat16, float8_e4m3fn, float32, int32
    out = {suffix: tmp_path / f"out{suffix}" for suffix in (".npz", ".npy", ".safetensors")}
    commands = [
        ["inspect", str(path)],
        ["inspect", "--json", str(path)],
        ["convert", str(path), str(out[".npz"]), "--quiet"],
        ["convert", str(path), str(out[".npy"]), "--include", "bf16", "--quiet"],
        ["convert", str(path), str(out[".safetensors"]), "--quiet"],
    ]
    assert loaded_by(commands, no_torch=True) == []
    # the bytes the same save of the arrays themselves writes (ml_dtypes arrays, as before)
    arrays = tb.load(path)
    for suffix, values in ((".npz", arrays), (".npy", arrays["bf16"]), (".safetensors", arrays)):
        want = tmp_path / f"want{suffix}"
        tb.save(values, want)
        assert out[suffix].read_bytes() == want.read_bytes(), suffix
    assert out[".safetensors"].read_bytes() == path.read_bytes()
    same_bytes(read_back(out[".npz"]), held("safetensors"))
    # a cast still reads the values (torch's kernel, ml_dtypes' types)
    cast = ["convert", str(path), str(tmp_path / "cast.npz"), "--float-dtype", "f32", "--quiet"]
    assert loaded_by([cast], no_torch=False) == ["torch", "ml_dtypes"]


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda p, o: [["convert", p, o + ".pt", "--quiet"]], id="write-pt"),
        pytest.param(
            lambda p, o: [["convert", p, o + ".pt", "--quiet"], ["inspect", o + ".pt"]],
            id="read-pt",
        ),
        pytest.param(
            lambda p, o: [["convert", p, o + ".npz", "--float-dtype", "f32", "--quiet"]],
            id="cast",
        ),
    ],
)
def test_pt_files_and_casts_still_import_torch(tmp_path: Path, make: Any) -> None:
    path = source(tmp_path, "safetensors")
    out = str(tmp_path / "out")
    assert run(make(str(path), out), no_torch=False) is True
    if Path(out + ".npz").exists():  # the cast: every float as float32
        got = read_back(Path(out + ".npz"))
        assert {a.dtype for a in got.values()} == {np.dtype(np.float32), np.dtype(np.int32)}
    else:
        same_bytes(read_back(Path(out + ".pt")), held("safetensors"))
