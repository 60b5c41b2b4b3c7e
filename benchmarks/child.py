"""Rows measured in a child process, their memory sampled from outside.

A row that reports memory runs in a process of its own, so that what it allocates is
not hidden by memory an earlier row freed but the allocator kept. A row is a
:class:`Task`: two importable functions, ``prepare(*args)`` that builds the inputs
(untimed) and ``step(inputs)``, the timed call, which may return a dict of extra
results. The parent starts the child with :mod:`multiprocessing`, waits until the
inputs exist, measures the child's memory level, lets the step run and samples the
child's memory every millisecond while it does, from the outside, where code holding
the child's GIL cannot starve the sampler. Growth is the peak minus that level.

Start method: ``forkserver`` where the platform has it (Linux, macOS), with numpy,
torch, ml_dtypes and tensorbridge preloaded, so a child starts in milliseconds yet
runs in a fresh process with its own heap; ``spawn`` elsewhere (each child then
imports torch itself, which only costs time). The server only imports: a process
whose OpenMP thread pool has started hangs its forked children at their first
parallel operation, so no torch computation ever runs in it.

How memory is read (:func:`memory_of`, :func:`reset_peak`, :func:`own_peak`):

- Linux: ``/proc/<pid>/status`` (``RssAnon``, ``VmRSS``), sampled from the parent;
  the child also reports the kernel's own high-water mark (``VmHWM``, reset just
  before the step by writing 5 to ``/proc/self/clear_refs``), so no peak between
  two samples is missed.
- Elsewhere: ``psutil`` for the samples when it is installed (the resident set then
  stands in for anonymous memory: an upper bound), and the child's ``resource`` peak
  when the step raised it; with neither, growth is how far the step raised that peak
  (a lower bound).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import mmap
import multiprocessing
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# Imported once by the fork server, so that its children start with them loaded.
PRELOAD = [
    "numpy",
    "ml_dtypes",
    "torch",
    "tensorbridge.convert",
    "tensorbridge.tree",
    "tensorbridge.io",
    "tensorbridge.diagnostics",
    "safetensors.numpy",  # optional: a module that fails to import is skipped
    "safetensors.torch",
    "onnx",
    "tensorbridge.io.onnx",
    "benchmarks.child",
]


class ChildError(RuntimeError):
    """A child row failed: its setup or step raised, it was killed, or it timed out."""


@dataclass(frozen=True)
class Task(Generic[T]):
    """One row for a child process: ``prepare(*args)`` untimed, then ``step(inputs)`` timed.

    Both must be module-level functions (the child imports them by name), and ``args``
    plain values (paths, sizes, names).

    >>> Task(list, len, ((1, 2),))  # doctest: +ELLIPSIS
    Task(prepare=<class 'list'>, step=<built-in function len>, args=((1, 2),))
    """

    prepare: Callable[..., T]
    step: Callable[[T], Mapping[str, Any] | None]
    args: tuple[Any, ...] = ()


@dataclass
class ChildRun:
    """One timed step in a child process."""

    seconds: float
    anon_growth: int  # peak anonymous memory during the step minus the level just before it
    rss_growth: int  # peak resident set (file pages included) minus the level just before it
    extra: dict[str, Any] = field(default_factory=dict)  # what the step returned


# --- memory, as each platform allows -----------------------------------------------------------


def _proc_status(pid: int | str) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                out[name] = int(rest.split()[0]) * 1024
    return out


def _psutil() -> Any:
    try:
        return importlib.import_module("psutil")
    except ImportError:
        return None


def memory_of(pid: int) -> tuple[int, int] | None:
    """(anonymous, resident) bytes of process ``pid`` now, or None where neither is known."""
    if os.path.exists(f"/proc/{pid}/status"):
        status = _proc_status(pid)
        rss = status.get("VmRSS", 0)
        return status.get("RssAnon", rss), rss
    psutil = _psutil()
    if psutil is None:
        return None
    try:
        rss = int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:  # the process has just exited
        return None
    return rss, rss


def reset_peak() -> bool:
    """Reset this process's high-water mark to its current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def own_peak() -> int:
    """This process's peak resident set, in bytes (since :func:`reset_peak` where it worked)."""
    with contextlib.suppress(OSError):
        return _proc_status("self")["VmHWM"]
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, else KiB


# --- helpers the rows call ---------------------------------------------------------------------


def fsync(path: str | os.PathLike[str]) -> None:
    """Flush a file to disk, so a writer that does not fsync is timed like one that does."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_buffer(src: str, dst: str, nbytes: int) -> tuple[Any, str, int]:
    """The prepare step of :func:`raw_write`: a 64 MiB block (``src`` is unused)."""
    import numpy as np  # in the child: the server itself imports no numpy

    return np.ones(64 << 20, np.uint8), dst, nbytes


def raw_write(inputs: tuple[Any, str, int]) -> None:
    """Write ``nbytes`` sequentially in 64 MiB blocks, then fsync: the disk's limit."""
    buf, dst, left = inputs
    with open(dst, "wb") as f:
        while left > 0:
            k = min(left, buf.size)
            f.write(buf[:k].data)
            left -= k
        f.flush()
        os.fsync(f.fileno())


def touch(values: Iterable[Any]) -> int:
    """Read one byte of every page of every array / tensor, so lazy (mapped) loads pay too."""
    import numpy as np
    import torch

    total = 0
    for v in values:
        if isinstance(v, torch.Tensor):
            total += int(v.reshape(-1).view(torch.uint8)[:: mmap.PAGESIZE].sum())
        else:
            flat = np.ascontiguousarray(v).reshape(-1).view(np.uint8)
            total += int(flat[:: mmap.PAGESIZE].sum())
    return total


# --- the child's side --------------------------------------------------------------------------


def serve(conn: Connection, task: Task[Any]) -> None:
    """The child process: prepare, report ready, wait for "go", run the step, report."""
    warnings.simplefilter("ignore")  # a child's warnings are not results
    try:
        inputs = task.prepare(*task.args)
    except BaseException:
        conn.send(("error", "setup failed:\n" + traceback.format_exc()))
        return
    gc.collect()
    conn.send(("ready", os.getpid()))
    conn.recv()  # "go": the parent has measured the level before the step
    reset = reset_peak()
    before = own_peak()
    t0 = time.perf_counter()
    try:
        extra = task.step(inputs)
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    took = time.perf_counter() - t0
    # With a reset, ``before`` is the level just before the step; without one, the
    # peak of everything before it (the step's own peak counts only if it is higher).
    conn.send(("done", took, before, own_peak(), reset, dict(extra or {})))


# --- the parent's side -------------------------------------------------------------------------


def start_method() -> str:
    """``forkserver`` where the platform has it, else ``spawn``."""
    methods = multiprocessing.get_all_start_methods()
    return "forkserver" if "forkserver" in methods else "spawn"


class ChildRunner:
    """Runs :class:`Task` rows in fresh child processes and samples their memory."""

    def __init__(self, timeout: float = 3600.0, method: str | None = None) -> None:
        self._timeout = timeout
        self._mp: BaseContext = multiprocessing.get_context(method or start_method())
        if self._mp.get_start_method() == "forkserver":
            self._mp.set_forkserver_preload(PRELOAD)
        self._running: BaseProcess | None = None

    def run(self, task: Task[Any], timeout: float | None = None) -> ChildRun:
        """Run ``task`` in a fresh child; ``timeout`` (seconds) limits its step."""
        limit = self._timeout if timeout is None else timeout
        parent, child = self._mp.Pipe()
        proc = self._mp.Process(target=serve, args=(child, task), daemon=True)  # type: ignore[attr-defined]
        proc.start()
        child.close()
        self._running = proc
        try:
            return self._drive(parent, proc, limit, task)
        finally:
            self._running = None
            if proc.is_alive():
                proc.kill()  # our own child, by its handle
            proc.join()
            parent.close()

    def _drive(
        self, conn: Connection, proc: BaseProcess, limit: float, task: Task[Any]
    ) -> ChildRun:
        msg = self._next(conn, proc, self._timeout, "setup")
        pid = int(msg[1])
        level = memory_of(pid)
        peak = level
        conn.send("go")
        deadline = time.monotonic() + limit
        while not conn.poll(0.001):
            if time.monotonic() > deadline:
                raise ChildError(f"timed out after {limit:.0f} s: {task.step.__qualname__}")
            if not proc.is_alive() and not conn.poll():
                self._died(proc)
            with contextlib.suppress(OSError, ProcessLookupError):  # it may just have exited
                now = memory_of(pid)
                if now is not None and peak is not None:
                    peak = (max(peak[0], now[0]), max(peak[1], now[1]))
        _, seconds, before, after, reset, extra = self._next(conn, proc, 60.0, "step")
        if level is None or peak is None:  # no samples: how far the step raised the peak
            growth = max(0, after - before)
            return ChildRun(float(seconds), growth, growth, extra)
        rss_peak = max(peak[1], after if reset or after > before else 0)
        return ChildRun(float(seconds), peak[0] - level[0], rss_peak - level[1], extra)

    def _next(self, conn: Connection, proc: BaseProcess, timeout: float, stage: str) -> Any:
        """The child's next message; raise for an error report, a death or a timeout."""
        if not wait([conn, proc.sentinel], timeout):
            raise ChildError(f"no answer from the child's {stage} in {timeout:.0f} s")
        if not conn.poll():
            self._died(proc)
        msg = conn.recv()
        if msg[0] == "error":
            raise ChildError(msg[1])
        return msg

    @staticmethod
    def _died(proc: BaseProcess) -> None:
        proc.join(5)
        code = proc.exitcode
        why = " (killed: out of memory?)" if code == -9 else ""
        raise ChildError(f"a child exited with status {code}{why}")

    def close(self) -> None:
        """Stop a child interrupted mid-step (the fork server ends with this process)."""
        if self._running is not None and self._running.is_alive():
            self._running.kill()
