"""Computed chunks made by worker threads while the writer writes the previous ones.

A streamed save of computed values (dequantized weights) costs compute plus write
when the two run one after the other. :func:`pipelined` overlaps them: *tasks*
(each fills one reusable output buffer, a :class:`Slot`, and returns the bytes to
write) run in a few worker threads while the caller writes the chunk before, in
the order they were given; the kernels (torch's) and the write (``os.write``)
both release the GIL.

Memory stays bounded: ``workers + 1`` slots, reused, whatever the size of the
file (``workers`` computing, one being written), plus each task's own
temporaries. Each worker runs torch single-threaded: a few threads computing
whole pieces side by side scale, where torch's intra-op threads on pieces this
small wait on each other at every operation, and worse still when other
processes hold the CPUs. A task's exception is raised in the caller; the workers
are joined before :func:`pipelined` returns or raises, so nothing is left running.

>>> import numpy as np
>>> def task(i):
...     def fill(slot):
...         buf = slot.reserve(2)
...         buf[:2] = i
...         return buf[:2].data
...     return fill
>>> [bytes(v) for _, v in pipelined([("a", task(1)), ("b", b"xy"), ("c", task(3))])]
[b'\\x01\\x01', b'xy', b'\\x03\\x03']
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

import numpy as np

__all__ = ["MAX_WORKERS", "STREAM_CHUNK", "Slot", "Task", "pipelined", "serial_workers", "workers"]

# about how many bytes one task fills: large enough that a write and a task's Python
# overhead are small beside its kernels, small enough that workers + 1 of them stay
# a few MiB
STREAM_CHUNK = 4 << 20
MAX_WORKERS = 8  # past this, memory (a slot and temporaries each) grows for nothing

T = TypeVar("T")


class Slot:
    """One reusable output buffer: a task fills it, the writer writes it, the next task
    reuses it (grown, never shrunk, so steady state allocates nothing)."""

    def __init__(self) -> None:
        self.buf = np.empty(0, np.uint8)

    def reserve(self, nbytes: int, keep: int = 0) -> np.ndarray:
        """The buffer, at least ``nbytes`` long; its first ``keep`` bytes kept if it grows."""
        if self.buf.size < nbytes:
            grown = np.empty(max(nbytes, self.buf.size * 5 // 4), np.uint8)
            grown[:keep] = self.buf[:keep]
            self.buf = grown
        return self.buf


# fills a slot and returns the bytes to write (a view of the slot's buffer)
Task = Callable[[Slot], memoryview]
Unit = Task | memoryview | bytes


def workers() -> int:
    """How many worker threads a pipeline runs: torch's intra-op thread count, at most
    :data:`MAX_WORKERS` (``OMP_NUM_THREADS=1`` or ``torch.set_num_threads(1)``: one
    worker, which still overlaps its compute with the writes)."""
    import torch  # the tasks run torch's kernels

    return max(1, min(MAX_WORKERS, torch.get_num_threads()))


def _serial() -> None:
    # Settle this thread's torch thread count before making it 1: torch initialises a
    # thread's count from the process-wide one at its first parallel kernel, which
    # would undo the 1 once the caller restores that (see serial_workers).
    import torch

    torch.empty(1 << 16).fill_(0)
    torch.arange(2)
    torch.set_num_threads(1)


@contextlib.contextmanager
def serial_workers(count: int) -> Iterator[ThreadPoolExecutor]:
    """``count`` started worker threads that run torch single-threaded; joined on exit.

    ``torch.set_num_threads`` sets the calling thread's count and a process-wide
    default that threads read when they first run a parallel kernel; each worker
    sets its own to 1, then the caller's count is put back as the default once all
    of them are running, so that no other thread is changed.
    """
    import torch

    restore = torch.get_num_threads()
    started = threading.Barrier(count)
    pool = ThreadPoolExecutor(count, thread_name_prefix="tensorbridge-stream", initializer=_serial)
    try:
        # every worker blocks on the barrier until all exist, so the pool starts count threads
        for f in [pool.submit(started.wait, 60) for _ in range(count)]:
            f.result()
        torch.set_num_threads(restore)
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        torch.set_num_threads(restore)


def pipelined(
    units: Iterable[tuple[T, Unit]], count: int | None = None
) -> Iterator[tuple[T, memoryview]]:
    """Each unit's bytes in order, tagged as given: tasks computed ahead by ``count``
    worker threads (default :func:`workers`) into reused slots, plain chunks passed
    through.

    A yielded view is valid until the next one is pulled. A plain chunk (bytes, a
    memoryview) may be a buffer its producer reuses, so ``units`` is never advanced
    while one is waiting to be yielded.
    """
    n = workers() if count is None else max(1, count)
    with serial_workers(n) as pool:
        yield from Pipeline(units, pool, n)


class Pipeline(Generic[T]):
    """The queue of :func:`pipelined`: at most ``n`` tasks running, each in its own slot
    of ``n + 1`` (the one before them is the chunk being written)."""

    def __init__(self, units: Iterable[tuple[T, Unit]], pool: ThreadPoolExecutor, n: int) -> None:
        self.source = iter(units)
        self.pool, self.n = pool, n
        self.slots = [Slot() for _ in range(n + 1)]
        self.next_slot = 0
        self.pending: collections.deque[tuple[T, Future[memoryview] | memoryview]] = (
            collections.deque()
        )
        self.running = 0  # tasks submitted and not yet yielded
        self.plain = 0  # plain chunks waiting: the source may not advance
        self.done = False

    def top_up(self) -> None:
        """Pull units until ``n`` tasks run, the source ends, or a plain chunk waits."""
        while not self.done and self.running < self.n and not self.plain:
            try:
                tag, unit = next(self.source)
            except StopIteration:
                self.done = True
                return
            if callable(unit):
                slot = self.slots[self.next_slot]
                self.next_slot = (self.next_slot + 1) % len(self.slots)
                self.pending.append((tag, self.pool.submit(unit, slot)))
                self.running += 1
            else:
                self.pending.append((tag, memoryview(unit)))
                self.plain += 1

    def __iter__(self) -> Iterator[tuple[T, memoryview]]:
        try:
            while True:
                self.top_up()
                if not self.pending:
                    return
                tag, head = self.pending.popleft()
                if isinstance(head, Future):
                    view = head.result()
                    self.running -= 1
                    self.top_up()  # keep n running while this one is written
                else:
                    view = head
                    self.plain -= 1
                yield tag, view
        finally:
            for _, p in self.pending:
                if isinstance(p, Future):
                    p.cancel()
