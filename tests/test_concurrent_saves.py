"""Concurrent saves to one destination: the last commit wins, whole, and none removes
another's files (_locks.py, _commit.py).

Several writers (threads, or spawned processes) save different versions of a
checkpoint to the same destination at once, with random sleeps around every rename,
link and exchange; afterwards the destination must read as exactly one writer's
version, every index must name files that exist, and nothing hidden may be left.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tensorbridge as tb
from tensorbridge import _commit as commit
from tensorbridge import _locks as locks
from tensorbridge._atomic import StagedFiles, atomic_write
from tensorbridge.errors import DestinationError

WRITERS = 3
KINDS = (
    "safetensors",
    "sharded",
    "npy",
    "npz",
    "pt",
    "gguf",
    "zarr",
    "npy-dir",
    "convert-sharded",
    "dcp-safetensors",
    "dcp-zarr",
)
NEEDS_ZARR = {"zarr", "dcp-zarr"}
DCP_KINDS = {"dcp-safetensors", "dcp-zarr"}  # torch's DCP: processes only (not thread-safe)


def version(v: int) -> dict[str, torch.Tensor]:
    """Version ``v``: 2 + v tensors of 4 KiB, each filled with a value naming v and itself."""
    return {f"t{i}": torch.full((64, 16), float(100 * v + i)) for i in range(2 + v)}


def dest_of(kind: str, root: Path) -> Path:
    names = {"safetensors": "m.safetensors", "npy": "x.npy", "npz": "m.npz", "pt": "m.pt"}
    names |= {"gguf": "m.gguf", "zarr": "m.zarr", "dcp-zarr": "m.zarr"}
    return root / names.get(kind, "ckpt")


def dcp_source(work: Path, v: int) -> Path:
    """A DCP checkpoint of version ``v`` (what npy-dir and convert-sharded convert)."""
    import torch.distributed.checkpoint as dcp

    path = work / f"dcp-v{v}"
    if not (path / ".metadata").exists():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(version(v), checkpoint_id=str(path), no_dist=True)
    return path


def save(kind: str, v: int, root: Path, work: Path) -> None:
    """Writer ``v``'s save of ``kind`` into ``root``."""
    dest, sd = dest_of(kind, root), version(v)
    if kind == "npy":
        tb.save(sd["t0"] + v, dest, overwrite=True)
    elif kind == "sharded":
        tb.save(sd, str(dest) + os.sep, max_shard_size=4096, overwrite=True)
    elif kind == "gguf":
        tb.save(sd, dest, metadata={"general.architecture": "llama"}, overwrite=True)
    elif kind == "npy-dir":
        with tb.open(dcp_source(work, v)) as f:
            tb.save(f, dest, format="npy", overwrite=True)
    elif kind == "convert-sharded":
        with tb.open(dcp_source(work, v)) as f:
            tb.save(f, str(dest) + os.sep, max_shard_size=4096, overwrite=True)
    elif kind in DCP_KINDS:
        import torch.distributed.checkpoint as dcp

        writer: Any = (
            tb.SafetensorsWriter(dest, max_shard_size=4096)
            if kind == "dcp-safetensors"
            else tb.ZarrWriter(dest)
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(sd, storage_writer=writer, no_dist=True)
    else:
        tb.save(sd, dest, overwrite=True)


@contextlib.contextmanager
def jitter(seed: int) -> Iterator[None]:
    """Random sleeps around every rename, link and exchange of the commits (this process)."""
    rng = random.Random(seed)
    saved = {n: getattr(os, n) for n in ("replace", "rename", "link")}
    saved_exchange = commit.exchange

    def slow(real: Any) -> Any:
        def call(*a: Any, **k: Any) -> Any:
            time.sleep(rng.uniform(0, 0.004))
            try:
                return real(*a, **k)
            finally:
                time.sleep(rng.uniform(0, 0.002))

        return call

    for n, real in saved.items():
        setattr(os, n, slow(real))
    commit.exchange = slow(saved_exchange)
    try:
        yield
    finally:
        for n, real in saved.items():
            setattr(os, n, real)
        commit.exchange = saved_exchange


def which(kind: str, root: Path, versions: list[int]) -> int:
    """The one version the destination reads as (every tensor of it), else -1."""
    dest = dest_of(kind, root)
    got = None if kind == "npy-dir" else tb.load(dest)
    for v in versions:
        want = {k: t.numpy() for k, t in version(v).items()}
        if kind == "npy":
            if np.array_equal(got, want["t0"] + v):
                return v
        elif kind == "npy-dir":
            # a directory of .npy files replaces the files of its names and keeps others
            # (those of an earlier save with more tensors): every file of one version
            if all(np.array_equal(np.load(dest / f"{k}.npy"), a) for k, a in want.items()):
                return v
        elif got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want):
            return v
    return -1


def hidden(root: Path) -> list[str]:
    """What saves leave behind if they leave anything: names starting with a dot."""
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*"))


def check(kind: str, root: Path, versions: list[int]) -> None:
    assert which(kind, root, versions) in versions, f"{kind}: not one writer's version"
    index = dest_of(kind, root) / "model.safetensors.index.json"
    if index.exists():
        named = set(json.loads(index.read_text())["weight_map"].values())
        assert all((index.parent / n).is_file() and not n.startswith(".") for n in named)
        shards = {p.name for p in index.parent.glob("model-*.safetensors")}
        assert shards == named, f"{kind}: shards of another version left beside the index"
    assert hidden(root) == [], f"{kind}: left behind"


def _skip_unless_installed(kind: str) -> None:
    if kind in NEEDS_ZARR:
        pytest.importorskip("zarr", reason="the zarr extra is not installed")


# --- threads ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [k for k in KINDS if k not in DCP_KINDS])
def test_threads_saving_one_destination_leave_one_whole_version(kind: str, tmp_path: Path) -> None:
    _skip_unless_installed(kind)
    trials = 3
    for trial in range(trials):
        root = tmp_path / f"t{trial}"
        root.mkdir()
        errors: list[BaseException] = []

        def run(v: int, root: Path = root, errors: list[BaseException] = errors) -> None:
            try:
                save(kind, v, root, tmp_path)
            except BaseException as err:
                errors.append(err)

        if kind in ("npy-dir", "convert-sharded"):
            for v in range(1, WRITERS + 1):
                dcp_source(tmp_path, v)
        threads = [threading.Thread(target=run, args=(v,)) for v in range(1, WRITERS + 1)]
        with jitter(trial):
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert errors == []  # the rule: every save succeeds; the last to commit wins
        check(kind, root, list(range(1, WRITERS + 1)))


# --- processes ----------------------------------------------------------------------------------


def _worker(kind: str, v: int, root: str, work: str, seed: int, start: float) -> str:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    time.sleep(max(0.0, start - time.time()))  # the writers begin together
    try:
        with jitter(seed):
            save(kind, v, Path(root), Path(work))
    except BaseException as err:
        return f"{type(err).__name__}: {err}"
    return ""


@pytest.fixture(scope="module")
def pool() -> Iterator[Any]:
    ctx = mp.get_context("spawn")
    with ctx.Pool(WRITERS) as p:
        yield p


def _processes(kind: str, pool: Any, work: Path, trials: int) -> None:
    _skip_unless_installed(kind)
    if kind in ("npy-dir", "convert-sharded"):
        for v in range(1, WRITERS + 1):
            dcp_source(work, v)
    for trial in range(trials):
        root = work / f"p{trial}"
        root.mkdir()
        start = time.time() + 0.3
        seeds = [31 * trial + v for v in range(1, WRITERS + 1)]
        args = [(kind, v, str(root), str(work), seeds[v - 1], start) for v in range(1, WRITERS + 1)]
        results = pool.starmap(_worker, args)
        assert results == [""] * WRITERS
        check(kind, root, list(range(1, WRITERS + 1)))


@pytest.mark.parametrize(
    "kind", [pytest.param("sharded", marks=pytest.mark.slow), "dcp-safetensors"]
)
def test_processes_saving_one_destination_leave_one_whole_version(
    kind: str, tmp_path: Path, pool: Any
) -> None:
    _processes(kind, pool, tmp_path, trials=2)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_processes_saving_one_destination_many_trials(kind: str, tmp_path: Path, pool: Any) -> None:
    _processes(kind, pool, tmp_path, trials=6)


# --- what a save may remove ----------------------------------------------------------------------


def test_a_running_saves_temporary_is_kept_a_dead_ones_removed(tmp_path: Path) -> None:
    target = tmp_path / "m.safetensors"
    claim = locks.Claim(tmp_path)  # a save still writing its temporary
    live = claim.temp(target)
    live.write_bytes(b"half written")
    tb.save({"a": torch.ones(2)}, target)
    assert live.read_bytes() == b"half written"  # not the next save's to remove
    claim.release()  # that save is gone (it would have removed its file): now it is litter
    tb.save({"a": torch.zeros(2)}, target, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]


def test_a_killed_saves_claim_and_temporaries_are_removed(tmp_path: Path) -> None:
    script = (
        "import os, signal, sys; from pathlib import Path; "
        "from tensorbridge._locks import Claim; "
        "d = Path(sys.argv[1]); c = Claim(d); c.temp(d / 'm.npz').write_bytes(b'x'); "
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, check=False)
    assert done.returncode == -signal.SIGKILL
    assert len(hidden(tmp_path)) == 2  # the claim and the temporary
    tb.save({"a": np.ones(2)}, tmp_path / "m.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.npz"]


def test_a_running_saves_staging_directory_is_kept(tmp_path: Path) -> None:
    pytest.importorskip("zarr", reason="the zarr extra is not installed")
    store = tmp_path / "m.zarr"
    staging = commit.begin_store(store, commit.new_save_id())  # another save, writing
    tb.save({"a": np.ones(2)}, store)
    assert staging.is_dir()
    commit.abandon(staging)
    assert hidden(tmp_path) == []


def test_a_temporary_removed_under_a_save_is_reported(tmp_path: Path) -> None:
    target = tmp_path / "x.bin"
    with StagedFiles() as staged:
        with staged.write(target) as f:
            f.write(b"abc")
        os.unlink(staged.temps[target])  # another program cleaned the directory
        with pytest.raises(DestinationError, match=r"was removed while this save was writing"):
            staged.commit()
    assert hidden(tmp_path) == [] and not target.exists()


def test_commits_into_one_directory_take_turns(tmp_path: Path) -> None:
    """Two commits never overlap: each holds the directory's lock from start to end."""
    inside, overlaps = [0], [0]

    def commit_once(i: int) -> None:
        with locks.commit_lock(tmp_path):
            inside[0] += 1
            overlaps[0] += inside[0] > 1
            time.sleep(0.002)
            with atomic_write(tmp_path / "x.bin") as f:  # re-enters the lock it holds
                f.write(bytes([i]))
            inside[0] -= 1

    threads = [threading.Thread(target=commit_once, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == [0] and sorted(p.name for p in tmp_path.iterdir()) == ["x.bin"]
