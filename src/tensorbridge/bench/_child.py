"""Rows measured in a child process, their memory sampled from outside (from bench_io.py).

A row that reports memory runs in a process of its own, so that what it allocates is
not hidden by memory an earlier row freed but the allocator kept. The parent samples
the child's ``/proc/<pid>/status`` (``RssAnon``, ``VmRSS``) every millisecond from the
outside, where code holding the child's GIL cannot starve the sampler, and the child
reports the kernel's own high-water mark (``VmHWM``, reset just before the timed step
by writing 5 to ``/proc/self/clear_refs``), so no peak between two samples is missed.
Growth is the peak minus the level measured once the inputs exist, just before the
timed step.

A fresh interpreter spends seconds importing torch, so children are forked from one
server process (``python -m tensorbridge.bench._child``) that imported numpy, torch,
ml_dtypes and tensorbridge once: a row starts in milliseconds and still runs in a fresh
process with its own heap. The server must never run a torch computation itself: a
process whose OpenMP thread pool has started hangs its forked children at their first
parallel operation. Data that rows share (:meth:`ChildRunner.exec`) is built with
NumPy only (``torch.from_numpy`` is fine); rows build everything else in their setup.
Linux only (``fork`` and ``/proc``).
"""

from __future__ import annotations

import contextlib
import gc
import json
import mmap
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any


class ChildError(RuntimeError):
    """A child row failed: its setup or step raised, it was killed, or it timed out."""


@dataclass
class ChildRun:
    """One timed step in a child process."""

    seconds: float
    anon_growth: int  # peak RssAnon during the step minus RssAnon just before it
    rss_growth: int  # peak resident set (file pages included) minus VmRSS just before it
    extra: dict[str, Any]  # what the step stored in its ``extra`` dict


def _status(pid: int) -> tuple[int, int]:
    """(RssAnon, VmRSS) of a process, in bytes."""
    anon = rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                anon = int(line.split()[1]) * 1024
            elif line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    return anon, rss


class ChildRunner:
    """The parent's side: start the fork server, run rows in children, sample their memory."""

    def __init__(self, scratch: Path, timeout: float = 3600.0) -> None:
        self._timeout = timeout
        self._log_path = scratch / "children.log"
        self._log = open(self._log_path, "wb")  # noqa: SIM115 - closed in close()
        env = dict(os.environ)
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        env["PYTHONWARNINGS"] = "ignore"  # a child's warnings are not results
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tensorbridge.bench._child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            cwd=scratch,
            env=env,
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._in: IO[bytes] = self._proc.stdin
        self._fd = self._proc.stdout.fileno()
        self._buf = b""
        self._peak = (0, 0)  # (RssAnon, VmRSS) peaks of the child being sampled
        self._running: int | None = None  # the pid of a child whose step is running
        self._recv(300.0)  # the server's hello, once its imports are done

    # --- protocol: one JSON object per line each way -------------------------------------

    def _send(self, msg: dict[str, Any]) -> None:
        self._in.write(json.dumps(msg).encode() + b"\n")
        self._in.flush()

    def _recv(self, timeout: float, sample: int | None = None) -> dict[str, Any]:
        """The next message; while waiting, sample process ``sample``'s memory every ms."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            wait = min(left, 0.001) if sample is not None else left
            ready, _, _ = select.select([self._fd], [], [], wait)
            if ready:
                data = os.read(self._fd, 1 << 16)
                if not data:
                    raise ChildError(f"the child-process server exited{self._log_tail()}")
                self._buf += data
            elif sample is not None:
                self._sample(sample)
        line, self._buf = self._buf.split(b"\n", 1)
        result: dict[str, Any] = json.loads(line)
        return result

    def _sample(self, pid: int) -> None:
        with contextlib.suppress(OSError):  # the child may just have exited
            anon, rss = _status(pid)
            self._peak = (max(self._peak[0], anon), max(self._peak[1], rss))

    def _log_tail(self) -> str:
        self._log.flush()
        tail = self._log_path.read_bytes()[-2000:].decode(errors="replace").strip()
        return f"; its stderr ends with:\n{tail}" if tail else ""

    # --- API --------------------------------------------------------------------------------

    def exec(self, code: str) -> None:
        """Run ``code`` in the server, so every later child inherits what it defines.

        NumPy only: a torch computation here would hang every later child (see above).
        """
        msg = self._recv_after({"op": "exec", "code": code})
        if "error" in msg:
            raise ChildError(f"shared setup failed:\n{msg['error']}")

    def _recv_after(self, msg: dict[str, Any]) -> dict[str, Any]:
        self._send(msg)
        return self._recv(self._timeout)

    def run(self, setup: str, step: str, timeout: float | None = None) -> ChildRun:
        """Run ``setup`` then the timed ``step`` in a fresh child (names: see ``serve``)."""
        limit = self._timeout if timeout is None else timeout
        ready = self._recv_after({"op": "fork", "setup": setup, "step": step})
        if "pid" not in ready:
            self._finish(ready)
        pid = int(ready["pid"])
        anon0, rss0 = _status(pid)
        self._peak = (anon0, rss0)
        self._send({"op": "go"})
        self._running = pid
        try:
            result = self._recv(limit, sample=pid)
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)  # our own child, by pid
            self._recv(60.0)  # the server's report of its exit
            raise ChildError(f"timed out after {limit:.0f} s: {step.strip()[:200]}") from None
        finally:
            self._running = None
        if "seconds" not in result:
            self._finish(result)
        self._finish(self._recv(60.0))
        peak_rss = max(self._peak[1], int(result["hwm"] or 0))
        return ChildRun(
            float(result["seconds"]), self._peak[0] - anon0, peak_rss - rss0, result["extra"]
        )

    def _finish(self, msg: dict[str, Any]) -> None:
        """Raise for an error report; consume the exit report that follows it."""
        if "error" in msg:
            self._recv(60.0)
            raise ChildError(msg["error"])
        code = msg.get("exit")
        if code not in (0, None):
            why = " (killed: out of memory?)" if code == -signal.SIGKILL else ""
            raise ChildError(f"a child exited with status {code}{why}{self._log_tail()}")

    def close(self) -> None:
        if self._running is not None:  # interrupted mid-step: stop that child, by its pid
            with contextlib.suppress(OSError):
                os.kill(self._running, signal.SIGKILL)
        with contextlib.suppress(OSError, ValueError):
            self._send({"op": "quit"})
            self._in.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._log.close()


# --- helpers the rows' code can call -----------------------------------------------------------


def fsync(path: str) -> None:
    """Flush a file to disk, so a writer that does not fsync is timed like one that does."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def touch(values: Any) -> int:
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


# --- the server --------------------------------------------------------------------------------


def _hwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        return False
    return True


def _child(msg: dict[str, Any], ns: dict[str, Any], rfile: IO[bytes], send: Any) -> None:
    g = dict(ns)
    g["extra"] = {}
    try:
        exec(compile(msg["setup"], "<setup>", "exec"), g)
        step = compile(msg["step"], "<step>", "exec")
    except BaseException:
        send({"error": "setup failed:\n" + traceback.format_exc()})
        return
    gc.collect()
    send({"pid": os.getpid()})
    rfile.readline()  # "go": the parent has measured the level before the step
    reset = _reset_peak()
    t0 = time.perf_counter()
    try:
        exec(step, g)
    except BaseException:
        send({"error": traceback.format_exc()})
        return
    took = time.perf_counter() - t0
    send({"seconds": took, "hwm": _hwm() if reset else None, "extra": g["extra"]})


def serve() -> None:
    """Import once, then fork a child per row. Names a row's code sees: ``np``, ``torch``,
    ``tb``, ``ml_dtypes``, ``os``, ``sys``, ``time``, ``gc``, ``fsync``, ``touch``, ``extra``
    (a dict for results besides the time), and whatever :meth:`ChildRunner.exec` defined.
    """
    import ml_dtypes
    import numpy as np
    import torch

    import tensorbridge as tb

    with contextlib.suppress(ImportError):  # optional: rows that need it import it again
        import safetensors.numpy
        import safetensors.torch  # noqa: F401

    ns: dict[str, Any] = {
        "np": np,
        "torch": torch,
        "tb": tb,
        "ml_dtypes": ml_dtypes,
        "os": os,
        "sys": sys,
        "time": time,
        "gc": gc,
        "fsync": fsync,
        "touch": touch,
    }
    rfile, wfile = sys.stdin.buffer, sys.stdout.buffer

    def send(obj: dict[str, Any]) -> None:
        wfile.write(json.dumps(obj, default=str).encode() + b"\n")
        wfile.flush()

    send({"server": os.getpid()})
    while line := rfile.readline():
        msg = json.loads(line)
        if msg["op"] == "exec":
            try:
                exec(msg["code"], ns)
                send({"ok": True})
            except BaseException:
                send({"error": traceback.format_exc()})
        elif msg["op"] == "fork":
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                status = 0
                try:
                    _child(msg, ns, rfile, send)
                except BaseException:
                    status = 1
                finally:
                    sys.stderr.flush()
                    os._exit(status)
            _, status = os.waitpid(pid, 0)
            send({"exit": os.waitstatus_to_exitcode(status)})
        else:
            break


if __name__ == "__main__":
    serve()
