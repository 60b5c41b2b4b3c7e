"""Memory safety under stress: zero-copy views across threads, read-only mapped files.

* :func:`stress`: threads each convert random dtypes (every row of the dtype table),
  shapes (0-dim, empty) and strides (negative, zero, transposed, sliced) both ways,
  drop the source at once, churn memory (allocate and free buffers filled with a
  pattern), then compare the result's bytes with a copy taken before. A view whose
  owner was freed would read the churn's pattern (or crash). Run by hand::

      PYTHONPATH=src python tests/test_stress.py --threads 8 --iterations 10000

  CI runs a bounded slice, and a smaller one under ``PYTHONMALLOC=debug`` (freed
  memory poisoned) with ``faulthandler`` in a child process.
* Every reader that maps a file hands out read-only NumPy views: writing raises
  ``ValueError`` (never a segfault), and cannot be switched back on. A file
  truncated by another process after it was opened gives a ``FormatError`` for the
  next tensor read; a view handed out *before* the truncation cannot be protected
  (touching its vanished pages is SIGBUS, which faulthandler reports): that limit
  is asserted too, so the documentation stays true.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tensorbridge as tb
from conftest import ROWS  # the rows torch has (NumPy-only ones: their own tests)

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}


# --- threads x conversions ------------------------------------------------------------------


def torch_bytes(t: torch.Tensor, row: tb.DTypeRow) -> bytes:
    """``t``'s values in C order as bytes, by torch alone (the reference)."""
    if row.carrier is not None:  # on the carrier: torch cannot copy int4 and its kin
        t = t.view(row.carrier)
    c = torch.empty(t.shape, dtype=t.dtype).copy_(t).reshape(-1)  # fresh, stride 1
    return bytes(c.view(torch.uint8).numpy().tobytes())


def numpy_bytes(a: np.ndarray, row: tb.DTypeRow) -> bytes:
    """``a``'s values in C order as bytes, by NumPy alone (the reference)."""
    return bytes(np.ascontiguousarray(a.view(row.carrier_numpy)).tobytes())


def _shape(rng: np.random.Generator) -> tuple[int, ...]:
    ndim = int(rng.integers(0, 4))
    return tuple(int(n) for n in rng.integers(0 if rng.random() < 0.1 else 1, 9, ndim))


def _numpy_source(rng: np.random.Generator, row: tb.DTypeRow) -> np.ndarray:
    """A random array of ``row``: sliced with random (negative) steps, maybe transposed."""
    base_shape = tuple(n * 2 + 1 for n in _shape(rng))
    raw = rng.integers(0, 256, max(1, int(np.prod(base_shape))) * row.itemsize, np.uint8)
    if row.name == "bool":
        raw &= 1
    a = raw[: int(np.prod(base_shape)) * row.itemsize].view(row.carrier_numpy)
    a = a.reshape(base_shape).view(row.numpy)
    if a.ndim:
        steps = rng.choice([1, 2, -1, -2, 3], a.ndim)
        a = a[tuple(slice(None, None, int(s)) for s in steps)]
        if a.ndim > 1 and rng.random() < 0.5:
            a = a.transpose(*rng.permutation(a.ndim))
    return a


def _torch_source(rng: np.random.Generator, row: tb.DTypeRow) -> torch.Tensor:
    """A random tensor of ``row``: sliced, transposed or expanded (stride 0)."""
    a = np.ascontiguousarray(_numpy_source(rng, row).view(row.carrier_numpy))
    t = torch.from_numpy(a.copy())
    if row.carrier is not None or a.dtype != row.numpy:
        t = t.view(row.torch)
    kind = rng.random()
    if t.ndim and kind < 0.3:
        t = t[tuple(slice(None, None, int(s)) for s in rng.choice([1, 2, 3], t.ndim))]
    elif t.ndim > 1 and kind < 0.6:
        t = t.transpose(0, t.ndim - 1)
    elif t.ndim and kind < 0.8 and t.shape[-1] == 1:
        t = t.expand(*t.shape[:-1], 4)  # stride 0
    return t


def churn(rng: np.random.Generator) -> None:
    """Allocate and free buffers full of 0xAB: freed memory a dangling view sees changes."""
    junk = [np.full(int(rng.integers(1, 1 << 16)), 0xAB, np.uint8) for _ in range(4)]
    junk.append(torch.full((int(rng.integers(1, 1 << 14)),), -1, dtype=torch.int32))
    del junk


def one(rng: np.random.Generator) -> str | None:
    """One conversion, checked; the problem found, or None."""
    row = ROWS[int(rng.integers(len(ROWS)))]
    if rng.random() < 0.5:
        src_t = _torch_source(rng, row)
        want = torch_bytes(src_t, row)
        out: Any = tb.to_numpy(src_t)
        del src_t
        churn(rng)
        gc.collect(0)
        got = numpy_bytes(out, row)
        way = "to_numpy"
    else:
        src_a = _numpy_source(rng, row)
        want = numpy_bytes(src_a, row)
        out = tb.to_torch(src_a)
        del src_a
        churn(rng)
        gc.collect(0)
        got = torch_bytes(out, row)
        way = "to_torch"
    if got != want or (tuple(out.shape) == () and len(got) != row.itemsize):
        return f"{way} {row.name} {tuple(out.shape)}: bytes differ"
    return None


def stress(threads: int, iterations: int, seed: int = 0) -> tuple[int, list[str]]:
    """``threads`` threads x ``iterations`` checked conversions: (done, problems)."""
    done = [0] * threads
    problems: list[str] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        rng = np.random.default_rng([seed, i])
        for _ in range(iterations):
            problem = one(rng)
            done[i] += 1
            if problem:
                with lock:
                    problems.append(problem)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(worker, range(threads)))
    return sum(done), problems


def test_threads_convert_bit_exact_with_sources_dropped() -> None:
    n, problems = stress(8, 400, seed=1)
    assert n == 3200
    assert problems == []


def test_stress_under_debug_malloc_and_faulthandler() -> None:
    code = textwrap.dedent(
        """
        import faulthandler, sys
        faulthandler.enable()
        sys.path.insert(0, sys.argv[1])
        from test_stress import stress
        n, problems = stress(8, 60, seed=2)
        print(n, len(problems))
        """
    )
    env = {**ENV, "PYTHONMALLOC": "debug"}
    proc = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", code, str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["480", "0"]


def test_a_view_keeps_its_owner_alive() -> None:
    t = torch.arange(1 << 16, dtype=torch.int32)
    a = tb.to_numpy(t)
    assert a.__array_interface__["data"][0] == t.data_ptr()  # zero-copy
    del t
    gc.collect()
    churn(np.random.default_rng(0))
    assert (a == np.arange(1 << 16, dtype=np.int32)).all()
    b = np.arange(1 << 16, dtype=np.float32)[::-1]
    u = tb.to_torch(np.ascontiguousarray(b))
    del b
    gc.collect()
    churn(np.random.default_rng(1))
    assert torch.equal(u, torch.arange((1 << 16) - 1, -1, -1, dtype=torch.float32))


# --- read-only views of mapped files ------------------------------------------------------------


def _victim(kind: str, path: Path) -> Path:
    """The file of ``path`` that holds its last tensor."""
    if kind == "sharded":
        return path / "model-00002-of-00002.safetensors"
    if kind == "dcp":
        return next(path.glob("*.distcp"))
    return path


def _write(kind: str, path: Path, sd: dict[str, torch.Tensor]) -> Path:
    if kind == "npy":
        tb.save(sd["a"], path / "x.npy")
        return path / "x.npy"
    if kind == "dcp":
        import torch.distributed.checkpoint as dcp

        dcp.save(sd, checkpoint_id=str(path / "dcp"))
        return path / "dcp"
    if kind == "sharded":
        tb.save(sd, path, max_shard_size=4096)
        return path
    target = path / {"safetensors": "m.safetensors", "npz": "m.npz", "pt": "m.pt"}.get(
        kind, "m.gguf"
    )
    meta = {"general.architecture": "llama"} if kind == "gguf" else None
    tb.save(sd, target, metadata=meta)
    return target


MAPPED = ["safetensors", "sharded", "npy", "npz", "pt", "gguf", "dcp"]


@pytest.mark.parametrize("kind", MAPPED)
def test_mapped_reads_are_read_only(kind: str, tmp_path: Path) -> None:
    sd = {"a": torch.arange(1024, dtype=torch.float32), "b": torch.ones(1024)}
    path = _write(kind, tmp_path, sd)
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with tb.open(path) as f:
        name = f.keys()[0]
        a = f.get(name)
        assert not a.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            a[0] = 7
        with pytest.raises(ValueError, match="WRITEABLE"):  # a read-only mapping, every format
            a.setflags(write=True)
        t = f.get(name, framework="torch")  # writable, copy-on-write: the file never changes
        t[0] = 7
        assert a[0] == 0
    assert {p: p.read_bytes() for p in files} == files


TRUNCATED = """
import os, subprocess, sys, faulthandler
faulthandler.enable()
import tensorbridge as tb
path, victim = sys.argv[1:]
f = tb.open(path)
first = f.get(f.keys()[0])
subprocess.run(["truncate", "-s", "64", victim], check=True)  # another process
print(float(first.sum()), flush=True)  # the earlier view's pages are gone: SIGBUS
"""


TRUNCATED_EACH = """
import json, subprocess, sys, faulthandler
faulthandler.enable()
import tensorbridge as tb
for kind, path, victim in json.loads(sys.argv[1]):
    f = tb.open(path)
    first = f.get(f.keys()[0])
    subprocess.run(["truncate", "-s", "64", victim], check=True)  # another process
    try:
        f.get(f.keys()[-1])
    except tb.FormatError as e:
        print(json.dumps([kind, f"FormatError: {e}"]), flush=True)
    else:
        print(json.dumps([kind, ""]), flush=True)
"""


@pytest.fixture(scope="module")
def truncated_reads(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """TRUNCATED's "next" mode for every kind in one child: (the child, kind -> its output)."""
    cases = []
    for kind in MAPPED:
        d = tmp_path_factory.mktemp(f"truncated-{kind}")
        path = _write(kind, d, {"a": torch.ones(4096), "b": torch.ones(4096)})
        cases.append([kind, str(path), str(_victim(kind, path))])
    proc = subprocess.run(
        [sys.executable, "-c", TRUNCATED_EACH, json.dumps(cases)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    lines = (json.loads(line) for line in proc.stdout.splitlines() if line.startswith("["))
    return proc, dict(lines)


@pytest.mark.parametrize("kind", MAPPED)
def test_a_file_truncated_while_open_gives_an_error(
    kind: str, truncated_reads: tuple[subprocess.CompletedProcess[str], dict[str, str]]
) -> None:
    proc, outputs = truncated_reads
    assert proc.returncode == 0, proc.stderr[-2000:]  # no SIGBUS
    stdout = outputs[kind]
    assert "FormatError:" in stdout
    assert "changed size since it was opened" in stdout or "truncated" in stdout


@pytest.mark.skipif(sys.platform != "linux", reason="SIGBUS on a truncated mapping is Linux's")
@pytest.mark.parametrize("kind", ["safetensors", "npy", "gguf"])
def test_a_view_handed_out_before_the_truncation_is_the_documented_limit(
    kind: str, tmp_path: Path
) -> None:
    sd = {"a": torch.ones(1 << 16), "b": torch.ones(4096)}
    path = _write(kind, tmp_path, sd)
    proc = subprocess.run(
        [sys.executable, "-c", TRUNCATED, str(path), str(_victim(kind, path))],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGBUS
    assert "Fatal Python error: Bus error" in proc.stderr  # faulthandler's traceback


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="threads x checked conversions")
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--iterations", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    t = time.perf_counter()
    n, problems = stress(args.threads, args.iterations, args.seed)
    print(f"{n} conversions in {time.perf_counter() - t:.0f} s, {len(problems)} corrupted")
    for problem in problems[:20]:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
