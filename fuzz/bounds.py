"""Run one input against one reader, bounded in time and memory, and judge the outcome.

Every input runs in this process under a watchdog (``SIGPROF`` after ``TIME_LIMIT``
seconds of CPU time, or ``SIGALRM`` after ``WALL_LIMIT`` seconds, raises :class:`Hang` at
the next bytecode) with ``tracemalloc`` tracing: the
reader's peak of traced allocations (Python objects and NumPy buffers; torch's own
allocator is not traced, see :func:`child_rss`) must stay within the input's size times
the reader's ``expansion`` plus ``MARGIN``. The verdict is one of:

* ``"ok"``: read without an error;
* ``"refused"``: one of the reader's allowed exceptions, with a non-empty message;
* ``"failure"``: any other exception, an empty message, a hang, or an allocation over
  the bound. ``Outcome.detail`` says which.

>>> from fuzz.targets import READERS
>>> import tempfile, pathlib
>>> r = READERS["npy"]
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> run_one(r, b"not an npy", d).verdict
'refused'
"""

from __future__ import annotations

import functools
import signal
import subprocess
import sys
import tracemalloc
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import tensorbridge as tb

from .targets import Reader, read_all

__all__ = ["MARGIN", "TIME_LIMIT", "WALL_LIMIT", "Hang", "Outcome", "child_rss", "run_one"]

# A hang is judged on CPU time (ITIMER_PROF: all threads), so that other load on the machine
# does not turn a slow input into a "hang"; the wall-clock limit catches waits that use none.
TIME_LIMIT = 2.0  # CPU seconds per input
WALL_LIMIT = 30.0  # seconds per input
MARGIN = 16 << 20  # bytes a reader may allocate beyond its input (parsed headers, tables)


class Hang(BaseException):
    """The watchdog fired: one input ran past ``TIME_LIMIT``."""


@dataclass(frozen=True)
class Outcome:
    """What one input did: the verdict, a one-line detail, and the traced peak in bytes."""

    verdict: str  # "ok", "refused" or "failure"
    detail: str
    peak: int


@functools.cache
def warm_up() -> None:
    """Import everything a reader may import lazily, so no watchdog fires mid-import."""
    import gguf  # noqa: F401
    import h5py  # noqa: F401
    import safetensors  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401
    import zarr  # noqa: F401

    import tensorbridge.dcp
    import tensorbridge.io
    import tensorbridge.io.onnx
    import tensorbridge.quant.api  # noqa: F401
    from tensorbridge.io import zarr as tb_zarr

    tb_zarr.require_zarr()


def _alarm(signum: int, frame: FrameType | None) -> None:
    if signum == signal.SIGPROF:
        raise Hang(f"no answer within {TIME_LIMIT} s of CPU time")
    raise Hang(f"no answer within {WALL_LIMIT} s")


def run_one(reader: Reader, data: bytes, directory: Path, *, trace: bool = True) -> Outcome:
    """Place ``data`` for ``reader`` in ``directory``, read it all, and judge the outcome."""
    warm_up()
    reader.prepare(directory)
    path = reader.place(data, directory)
    allowed = tuple(getattr(tb, name) for name in reader.allowed)
    started = trace and not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    if trace:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
    previous = signal.signal(signal.SIGALRM, _alarm), signal.signal(signal.SIGPROF, _alarm)
    signal.setitimer(signal.ITIMER_PROF, TIME_LIMIT)
    signal.setitimer(signal.ITIMER_REAL, WALL_LIMIT)
    verdict, detail = "ok", ""
    try:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a warning is no verdict; exceptions are
                read_all(path, **reader.open_kwargs)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.setitimer(signal.ITIMER_PROF, 0)
            signal.signal(signal.SIGALRM, previous[0])
            signal.signal(signal.SIGPROF, previous[1])
    except allowed as err:
        verdict, detail = "refused", f"{type(err).__name__}: {err}"
        if not str(err).strip():
            verdict, detail = "failure", f"{type(err).__name__} with an empty message"
    except Hang as err:
        verdict, detail = "failure", f"hang: {err}"
    except MemoryError as err:
        verdict, detail = "failure", f"MemoryError: {err}"
    except Exception as err:  # every other exception is the finding itself
        verdict, detail = "failure", f"{type(err).__name__}: {err}"
    peak = 0
    if trace:
        peak = max(0, tracemalloc.get_traced_memory()[1] - base)
        if started:
            tracemalloc.stop()
        limit = len(data) * reader.expansion + MARGIN
        if peak > limit and verdict != "failure":
            verdict, detail = "failure", f"allocated {peak} bytes for a {len(data)}-byte input"
    return Outcome(verdict, detail[:500], peak)


_CHILD = """
import resource, sys, pathlib
from fuzz.targets import READERS
from fuzz.bounds import run_one
reader = READERS[sys.argv[1]]
data = pathlib.Path(sys.argv[2]).read_bytes()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = run_one(reader, data, pathlib.Path(sys.argv[3]), trace=False)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(out.verdict, (after - before) * 1024)
"""


def child_rss(reader: Reader, data: bytes, directory: Path) -> tuple[str, int]:
    """The verdict and the growth of peak RSS (bytes) reading ``data`` in a fresh process.

    Catches what ``tracemalloc`` cannot see: torch's allocator and mapped pages touched.
    """
    directory.mkdir(parents=True, exist_ok=True)
    src = directory / "input.bin"
    src.write_bytes(data)
    work = directory / "work"
    work.mkdir(exist_ok=True)
    root = Path(__file__).resolve().parent.parent
    env: dict[str, Any] = {"OMP_NUM_THREADS": "1"}
    import os

    env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([str(root), *sys.path])}
    # warm up the imports first so their memory is not counted as the reader's
    code = "import tensorbridge, torch, numpy, zarr, safetensors, gguf\n" + _CHILD
    out = subprocess.run(
        [sys.executable, "-c", code, reader.name, str(src), str(work)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    if out.returncode != 0:
        return f"crashed ({out.returncode}): {out.stderr.strip()[-300:]}", 0
    verdict, grown = out.stdout.split()[-2:]
    return verdict, int(grown)
