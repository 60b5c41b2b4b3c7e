"""Saves that are killed, or whose disk fills, never leave a partial checkpoint under its name.

The kill-trial harness is ``tests/crash.py`` (run by hand with ``--trials``); here a
bounded slice of it runs once per kind, then the failures a save can meet: a file
size limit (``RLIMIT_FSIZE``: disk full as the writer sees it), a directory it may
not write, a directory where the file should go, and a source that changes size
while it is converted. Each must raise a clear tensorbridge error and leave the
previous file (or nothing) under the final name, and no temporary file behind.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import tensorbridge as tb
from tensorbridge.io import npy as npy_io
from tensorbridge.io import pt as pt_io
from tensorbridge.io import safetensors as st

sys.path.insert(0, str(Path(__file__).parent))
import crash

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}


def _files(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())


def _bytes(d: Path) -> dict[str, bytes]:
    return {name: (d / name).read_bytes() for name in _files(d)}


# --- the kill harness, one trial per kind -----------------------------------------------------


# the DCP kinds start a process group of two gloo ranks a trial: slow
@pytest.mark.parametrize(
    "kind",
    [pytest.param(k, marks=pytest.mark.slow) if k.startswith("dcp-") else k for k in crash.KINDS],
)
def test_killed_save_leaves_the_previous_or_the_new_checkpoint(kind: str, tmp_path: Path) -> None:
    if "zarr" in kind:
        pytest.importorskip("zarr", reason="the zarr extra is not installed")
    if kind == "convert-dequantize":  # its source is a quantized GGUF file
        pytest.importorskip("gguf", reason="the gguf extra is not installed")
    trials = 1 if kind.startswith("dcp-") else 2  # two gloo ranks a trial: slower
    tally = crash.run_trials(trials, (kind,), ("s",), seed=len(kind), work=tmp_path)
    assert tally.trials[kind] == trials
    assert tally.lost == []
    assert tally.hangs == []


def test_judge_notices_a_partial_file(tmp_path: Path) -> None:
    """The harness is not blind: a truncated file under the final name is LOST."""
    sc = crash.Scenario("safetensors", "s", tmp_path)
    ref = tmp_path / "ref"
    tb.save(crash.state_dict("safetensors", "s", 2), ref / "model.safetensors")
    new = crash.Version(crash.snapshot(ref), crash.fingerprint(ref / "model.safetensors"), 1, 0)
    root = tmp_path / "t"
    root.mkdir()
    data = (ref / "model.safetensors").read_bytes()
    (root / "model.safetensors").write_bytes(data[: len(data) // 2])
    state, _ = crash.judge(sc, root, None, new)
    assert state == "LOST"


def _sharded_versions(tmp_path: Path) -> tuple[crash.Scenario, crash.Version, crash.Version]:
    sc = crash.Scenario("sharded", "s", tmp_path)
    versions = []
    for v in (1, 2):
        ref = tmp_path / f"ref{v}"
        sd = crash.state_dict("sharded", "s", v)
        tb.save(sd, str(ref) + os.sep, max_shard_size=crash.shard_size("sharded", "s", v))
        versions.append(crash.Version(crash.snapshot(ref), crash.fingerprint(ref), 1, 0))
    return sc, versions[0], versions[1]


def test_judge_counts_a_missing_index_over_a_previous_version_as_lost(tmp_path: Path) -> None:
    """No index where a checkpoint was: the previous version is lost, not "uncommitted"."""
    sc, old, new = _sharded_versions(tmp_path)
    root = tmp_path / "t"
    shutil.copytree(tmp_path / "ref2", root)
    (root / crash.INDEX).unlink()
    assert crash.judge(sc, root, old, new)[0] == "LOST"
    assert crash.judge(sc, root, None, new)[0] == "uncommitted"  # nothing was there


def test_judge_reads_an_index_naming_hidden_shards_as_the_new_version(tmp_path: Path) -> None:
    """The instant after the commit, before the final names: the index names hidden files."""
    sc, old, new = _sharded_versions(tmp_path)
    root = tmp_path / "t"
    shutil.copytree(tmp_path / "ref1", root)  # the previous shards keep their names
    index = json.loads((tmp_path / "ref2" / crash.INDEX).read_text())
    for name in sorted(set(index["weight_map"].values())):
        shutil.copy(tmp_path / "ref2" / name, root / f".{name}.abcd1234.tmp")
    index["weight_map"] = {k: f".{v}.abcd1234.tmp" for k, v in index["weight_map"].items()}
    (root / crash.INDEX).write_text(json.dumps(index))
    assert crash.judge(sc, root, old, new) == ("new", "")
    (root / f".{name}.abcd1234.tmp").write_bytes(b"partial")  # a named shard damaged
    assert crash.judge(sc, root, old, new)[0] == "LOST"


# --- the write protocol, step by step ---------------------------------------------------------


def _sd(seed: int, n: int = 3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"w{i}": torch.randn(64, 16, generator=g) for i in range(n)}


def test_sharded_save_touches_nothing_until_every_shard_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tb.save(_sd(1), tmp_path, max_shard_size=4096)
    before = _bytes(tmp_path)
    assert len(before) == 4  # three shards and the index
    real, calls = st._write_file, []

    def fail_on_third(*a: Any) -> None:
        calls.append(1)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(*a)

    monkeypatch.setattr(st, "_write_file", fail_on_third)
    with pytest.raises(tb.DestinationError, match="No space left on device; free space"):
        tb.save(_sd(2), tmp_path, max_shard_size=4096, overwrite=True)
    assert _bytes(tmp_path) == before  # no shard replaced, no temporary left
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_killed_saves_temporaries_are_ignored_then_removed(tmp_path: Path) -> None:
    tb.save(_sd(1), tmp_path / "model.safetensors")
    litter = tmp_path / ".model.safetensors.ab_cd123.tmp"
    litter.write_bytes(b"half a file")
    other = tmp_path / ".model.safetensors.notes.tmp"  # not a temporary's name: kept
    other.write_bytes(b"mine")
    with tb.open(tmp_path) as f:  # readers ignore the temporary
        assert f.keys() == ["w0", "w1", "w2"]
    tb.save(_sd(2), tmp_path / "model.safetensors", overwrite=True)
    assert not litter.exists()
    assert other.read_bytes() == b"mine"


def test_shards_without_their_index_are_refused(tmp_path: Path) -> None:
    tb.save(_sd(1), tmp_path, max_shard_size=4096)
    (tmp_path / "model.safetensors.index.json").unlink()
    with pytest.raises(tb.UncommittedCheckpointError, match="no index naming them"):
        tb.open(tmp_path)
    for p in list(tmp_path.iterdir())[1:]:
        p.unlink()  # one shard alone is not the checkpoint either
    with pytest.raises(tb.UncommittedCheckpointError, match="pass one shard's path"):
        tb.open(tmp_path)


# --- disk full, no permission, a directory in the way -------------------------------------------

SAVES = {
    "safetensors": "tb.save(sd, out / 'model.safetensors', overwrite=True)",
    "npy": "tb.save(sd['w0'], out / 'x.npy', overwrite=True)",
    "npz": "tb.save(sd, out / 'x.npz', overwrite=True)",
    "pt": "tb.save(sd, out / 'model.pt', overwrite=True)",
    "gguf": "tb.save(sd, out / 'm.gguf', metadata={'general.architecture': 'llama'}, "
    "overwrite=True)",
    "zarr": "tb.save(sd, out / 's.zarr', overwrite=True)",
    "sharded": "tb.save(sd, out, max_shard_size=300_000, overwrite=True)",
    "convert": "cli(['convert', str(src), str(out / 'c.safetensors'), '--overwrite'])",
    "convert-dcp": "cli(['convert', str(dcp_src), str(out) + '/', '--max-shard-size', "
    "'300000', '--overwrite'])",
}

CHILD = """
import json, os, resource, signal, sys, contextlib, io, tempfile
from pathlib import Path
import torch, tensorbridge as tb
from tensorbridge.cli import main
kinds, base, src, dcp_src = json.loads(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
src, dcp_src = Path(src), Path(dcp_src)
g = torch.Generator().manual_seed(5)
sd = {{f"w{{i}}": torch.randn(256, 256, generator=g) for i in range(4)}}
def cli(argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(argv)
    return {{"rc": rc, "stderr": err.getvalue()}}
tb.save(sd, Path(tempfile.mkdtemp()) / "warm.safetensors")  # imports what saves need
{setup}
results = {{}}
for kind, save in kinds.items():
    out = base / kind
    try:
        results[kind] = eval(save) or {{"ok": True}}
    except Exception as e:
        results[kind] = {{"type": type(e).__name__, "errno": getattr(e, "errno", None),
                         "msg": str(e), "dest": isinstance(e, tb.DestinationError)}}
print(json.dumps(results))
"""

LIMIT = """
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit raises EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
"""


def _run_child(
    setup: str, kinds: dict[str, str], base: Path, src: Path, dcp_src: Path
) -> dict[str, Any]:
    code = CHILD.format(setup=textwrap.dedent(setup))
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(kinds), str(base), str(src), str(dcp_src)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
    )
    text = (proc.stdout.strip() or proc.stderr.strip()).splitlines()
    assert text, proc.stderr
    result: dict[str, Any] = json.loads(text[-1])
    return result


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    import torch.distributed.checkpoint as dcp

    d = tmp_path_factory.mktemp("sources")
    sd = _sd(9, 4)
    big = {k: v.repeat(64, 4) for k, v in sd.items()}  # 1 MiB each
    tb.save(big, d / "src.pt")
    dcp.save(big, checkpoint_id=str(d / "dcp"))
    return d / "src.pt", d / "dcp"


def test_disk_full_raises_and_keeps_the_previous_checkpoint(
    tmp_path: Path, sources: tuple[Path, Path]
) -> None:
    kinds = dict(SAVES)
    try:
        import zarr  # noqa: F401
    except ImportError:
        del kinds["zarr"]
    before = {}
    for kind in kinds:
        (tmp_path / kind).mkdir()
        (tmp_path / kind / "keep.txt").write_bytes(b"previous")  # the previous checkpoint
        before[kind] = _bytes(tmp_path / kind)
    results = _run_child(LIMIT, kinds, tmp_path, *sources)
    for kind, r in results.items():
        if "rc" in r:  # the command line: one line on stderr, status 1
            assert r["rc"] == 1, (kind, r)
            assert "File too large; free space" in r["stderr"], (kind, r)
            assert r["stderr"].count("\n") == 1, (kind, r)
        else:
            assert r.get("dest"), (kind, r)
            assert r["errno"] == errno.EFBIG, (kind, r)
            assert "File too large; free space (or raise the file size limit)" in r["msg"]
        assert _bytes(tmp_path / kind) == before[kind], kind  # no partial file, no temporary
    assert sorted(results) == sorted(kinds)


def test_unwritable_directory(tmp_path: Path) -> None:
    base = Path(tempfile.mkdtemp())  # pytest's own directory is private to its user
    base.chmod(0o755)
    out = base / "ro"
    out.mkdir()
    out.chmod(0o555)
    setup = ""
    if os.geteuid() == 0:  # root ignores permission bits: the child drops to nobody
        setup = "os.setgid(65534); os.setuid(65534)"
    try:
        r = _run_child(setup, {"ro": SAVES["safetensors"]}, base, tmp_path, tmp_path)["ro"]
    finally:
        out.chmod(0o755)
        shutil.rmtree(base)
    assert r.get("dest"), r
    assert r["errno"] == errno.EACCES
    assert "Permission denied; make the directory writable" in r["msg"]


@pytest.mark.parametrize(
    "save",
    [
        lambda p: npy_io.save(torch.ones(3), p / "x.npy"),
        lambda p: pt_io.save({"w": torch.ones(3)}, p / "x.pt"),
        lambda p: tb.save(_sd(2), p, max_shard_size=8192, overwrite=True),
    ],
    ids=["npy", "pt", "sharded"],
)
def test_a_directory_where_the_file_goes(save: Any, tmp_path: Path) -> None:
    tb.save(_sd(1), tmp_path, max_shard_size=4096)  # three shards
    (tmp_path / "model-00002-of-00002.safetensors").mkdir()  # the new save's second shard
    (tmp_path / "x.npy").mkdir()
    (tmp_path / "x.pt").mkdir()
    before = _bytes(tmp_path)
    with pytest.raises(tb.DestinationError, match="Is a directory; a directory has that name"):
        save(tmp_path)
    assert _bytes(tmp_path) == before  # the previous index and shards untouched
    assert tb.load(tmp_path)["w2"].shape == (64, 16)


# --- a source that changes size while it is converted -----------------------------------------

CONVERT_RESIZED = """
import json, os, sys, faulthandler, contextlib, io
faulthandler.enable()
import tensorbridge.io as tbio
from tensorbridge.cli import main
real = tbio.open
results = {}
for src, dst, size in json.loads(sys.argv[1]):
    def opened_then_resized(*a, _src=src, _size=size, **k):
        f = real(*a, **k)
        os.truncate(_src, _size)  # another writer, after the header was read
        return f
    tbio.open = opened_then_resized
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["convert", src, dst, "--no-progress"])
    results[src] = [rc, err.getvalue()]
print(json.dumps(results))
"""


def test_a_source_that_changes_size_during_convert(tmp_path: Path) -> None:
    cases = []
    for suffix in (".safetensors", ".npy", ".gguf", ".pt", ".npz"):
        for change in ("shrinks", "grows"):
            src = tmp_path / f"{change}{suffix}"
            sd = {"w": torch.randn(512, 256)}
            meta = {"general.architecture": "llama"} if suffix == ".gguf" else None
            tb.save(sd["w"] if suffix == ".npy" else sd, src, metadata=meta)
            size = src.stat().st_size
            new = size // 2 if change == "shrinks" else size + 4096
            cases.append((str(src), str(tmp_path / "out" / f"{src.name}.safetensors"), new))
    proc = subprocess.run(
        [sys.executable, "-c", CONVERT_RESIZED, json.dumps(cases)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr  # no signal killed the converting process
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for src, (rc, err) in results.items():
        assert rc == 1, (src, err)
        assert "changed size since it was opened" in err, (src, err)
        assert "open it again" in err, (src, err)
    out = tmp_path / "out"
    assert not out.exists() or list(out.iterdir()) == []


def test_destination_error_is_an_oserror_and_a_tensorbridge_error() -> None:
    assert issubclass(tb.DestinationError, OSError)
    assert issubclass(tb.DestinationError, tb.TensorBridgeError)
    err = tb.DestinationError(errno.ENOSPC, "cannot write x: no space")
    assert err.errno == errno.ENOSPC
