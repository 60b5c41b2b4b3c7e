"""Section: reading a model larger than the memory a process may use (issue 30's rows).

An ONNX model with external data and an HDF5 file, each 3 GiB of float32 weights
(``--quick``: 256 MiB) written by ``tb.save``, are read whole, every page of every array
touched, by a child process inside a memory cgroup limited to a third of that (1 GiB;
quick: 96 MiB), the page cache emptied of the files first (``posix_fadvise``), so the
file pages the read brings in count against the limit as well. tensorbridge's mapped
read (``tb.load``) against the reference reader (``onnx.load`` + ``numpy_helper.to_array``,
h5py's ``ds[()]``). Targets: tensorbridge reads every byte, its anonymous memory under
64 MiB. Needs a writable memory cgroup (v1 or v2); the section says so and skips without.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import tensorbridge as tb

from .core import MIB, Context, Section, fmt_mib

TITLE = "Reading past the memory budget: ONNX and HDF5 in a memory cgroup"

N_TENSORS = 64

_CHILD = r"""
import os, sys, time
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))  # into the cgroup before anything is read
import numpy as np

def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) << 10 for l in f if l.startswith(key + ":"))

reader, path = sys.argv[2], sys.argv[3]
if reader == "tb":
    import tensorbridge as tb, tensorbridge.io.hdf5, tensorbridge.io.onnx
    t0 = time.perf_counter()
    arrays = tb.load(path)
elif reader == "h5py":
    import h5py
    t0 = time.perf_counter()
    arrays = {}
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda n, o: arrays.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None
        )
else:
    import onnx
    from onnx import numpy_helper
    t0 = time.perf_counter()
    model = onnx.load(path)
    arrays = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
touched = sum(int(a.reshape(-1).view(np.uint8)[::4096].sum()) for a in arrays.values())
print(sum(a.nbytes for a in arrays.values()), time.perf_counter() - t0,
      status("VmHWM"), status("RssAnon"))
"""


class _Cgroup:
    """A memory cgroup of one limit (v1 or v2), made for the section and removed after."""

    def __init__(self, limit: int) -> None:
        v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
        root = Path("/sys/fs/cgroup") if v2 else Path("/sys/fs/cgroup/memory")
        self.path = root / f"tensorbridge-bench-{os.getpid()}"
        self.v2 = v2
        self.path.mkdir()
        (self.path / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(limit))

    @property
    def procs(self) -> str:
        return str(self.path / "cgroup.procs")

    def reset(self) -> None:
        if not self.v2:
            (self.path / "memory.max_usage_in_bytes").write_text("0")

    def peak(self) -> int | None:
        name = "memory.peak" if self.v2 else "memory.max_usage_in_bytes"
        p = self.path / name
        return int(p.read_text()) if p.exists() else None

    def remove(self) -> None:
        self.path.rmdir()


def _cgroup(limit: int) -> _Cgroup | str:
    """The cgroup, or why there is none."""
    try:
        return _Cgroup(limit)
    except OSError as e:
        return f"no writable memory cgroup here ({e.strerror})"


def _drop_cache(directory: Path) -> None:
    for p in directory.iterdir():
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


@dataclass(frozen=True)
class _Read:
    """One read in the cgroup: what it read, or how it died."""

    died: str | None
    nbytes: int = 0
    seconds: float = 0.0
    peak_rss: int = 0
    anon: int = 0
    group_peak: int | None = None

    def cells(self) -> tuple[str, str, str]:
        group = "" if self.group_peak is None else f"; the cgroup's peak {fmt_mib(self.group_peak)}"
        if self.died is not None:
            return self.died + group, "", ""
        done = f"read {fmt_mib(self.nbytes)} in {self.seconds:.1f} s{group}"
        return done, fmt_mib(self.peak_rss), fmt_mib(self.anon)


def _read(cg: _Cgroup, reader: str, path: Path) -> _Read:
    _drop_cache(path.parent)
    cg.reset()
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, cg.procs, reader, str(path)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    peak = cg.peak()
    if done.returncode != 0:
        why = "killed (out of memory)" if done.returncode == -9 else f"exit {done.returncode}"
        return _Read(why, group_peak=peak)
    nbytes, seconds, hwm, anon = done.stdout.split()
    return _Read(None, int(nbytes), float(seconds), int(hwm), int(anon), peak)


def run(ctx: Context, sec: Section) -> None:
    total = ctx.pick(3 << 30, 256 * MIB, 128 * MIB)
    limit = ctx.pick(1 << 30, 96 * MIB, 96 * MIB)  # the interpreter and NumPy fit
    sec.intro(
        f"""{N_TENSORS} float32 tensors, {fmt_mib(total)} in all, written by `tb.save` as an
        ONNX model with external data and as an HDF5 file, each read whole (every page of
        every array touched) by a fresh process in a memory cgroup limited to
        {fmt_mib(limit)}, the files dropped from the page cache before each read: file
        pages count against the limit too, so a reader that keeps them (or copies them)
        is stopped. *peak RSS* includes mapped file pages; *anon* is the process's
        anonymous memory at the end."""
    )
    cg = _cgroup(limit)
    if isinstance(cg, str):
        sec.text(f"*Skipped: {cg}.*")
        return
    try:
        _section(ctx, sec, cg, total, limit)
    finally:
        cg.remove()


def _section(ctx: Context, sec: Section, cg: _Cgroup, total: int, limit: int) -> None:
    per = total // N_TENSORS // 4
    base = np.random.default_rng(0).standard_normal(per, dtype=np.float32)
    weights = {f"layers.{i}.weight": base for i in range(N_TENSORS)}
    rows: list[tuple[str, ...]] = []
    cases = (
        ("onnx", "m.onnx", "onnx", "onnx.load + to_array"),
        ("h5py", "m.h5", "h5py", "h5py ds[()]"),
    )
    for extra, name, reader, theirs in cases:
        if importlib.util.find_spec(extra) is None:
            rows.append((name, "—", f"skipped: {extra} is absent", "", "", ""))
            continue
        directory = ctx.scratch / f"budget-{reader}"
        directory.mkdir()
        path = directory / name
        tb.save(weights, path, progress=False)
        ours = _read(cg, "tb", path)
        ok = ours.died is None and ours.nbytes == total and ours.anon <= 64 * MIB
        label = f"{name}: tb.load reads {fmt_mib(total)} within {fmt_mib(limit)}, anon <= 64 MiB"
        rows.append((name, "tb.load (mapped)", *ours.cells(), ctx.check(sec, label, ok)))
        rows.append((name, theirs, *_read(cg, reader, path).cells(), ""))
        for p in directory.iterdir():
            p.unlink()
        directory.rmdir()
    sec.table(["file", "reader", "result", "peak RSS", "anon", "target met"], rows)
