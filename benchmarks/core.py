"""The timing core every section shares: interleaved measurement, formatting, targets.

How a number is made: the candidates of one row are timed round-robin, the order rotated each
repeat, so that a noisy, shared machine slows them alike; each cell is the minimum and
the median over the repeats. Ratios are given from both; PASS or FAIL against a target
is decided on the ratio of the minima, the estimate least disturbed by other processes
(the medians show how noisy the run was, and the load average is printed with each
section). A call slower than a quarter of a sample is timed alone and its result freed
before the next call, so a copy into fresh memory pays its page faults every time, as a
user's call does; faster calls are looped and reported per call.

A :class:`Context` carries one run's state (its size profile, its scratch directory, the
targets checked so far, the spread of every timing, the child-process runner of
:mod:`.child`); a :class:`Section` collects one section's Markdown.
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, TypeVar

from . import plot
from .child import ChildError, ChildRun, ChildRunner, Task

MIB = 1 << 20
GIB = 1 << 30
NOISY = 1.5  # a median this many times the minimum means other load disturbed the timing
MODES = ("full", "quick", "tiny")
_T = TypeVar("_T")


# --- measuring --------------------------------------------------------------------------------


@dataclass
class Stats:
    """Seconds per call over the repeats."""

    samples: list[float]

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


def speedup(base: Stats, row: Stats) -> tuple[float, float]:
    """How many times faster ``row`` is than ``base``: (from the minima, from the medians)."""
    return base.min / row.min, base.median / row.median


def _calibrate(fn: Callable[[], Any], sample_s: float) -> int:
    """How many calls make one timing sample of about ``sample_s`` seconds (1 for slow calls)."""
    t0 = time.perf_counter()
    fn()  # warm-up: first-call costs (imports, caches, lazy init) are not what we measure
    if time.perf_counter() - t0 >= sample_s:
        return 1  # slow enough that three more calibration calls would only waste time
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    if best >= sample_s / 4:
        return 1
    return max(1, min(200_000, math.ceil(sample_s / max(best, 1e-8))))


def measure(
    candidates: dict[str, Callable[[], Any]], *, repeats: int, sample_s: float = 2e-3
) -> dict[str, Stats]:
    """Time each candidate ``repeats`` times, interleaved, with the garbage collector off."""
    names = list(candidates)
    numbers = {name: _calibrate(candidates[name], sample_s) for name in names}
    samples: dict[str, list[float]] = {name: [] for name in names}
    gc.collect()
    gc.disable()
    try:
        for rep in range(repeats):
            k = rep % len(names)
            for name in names[k:] + names[:k]:
                fn, number = candidates[name], numbers[name]
                if number == 1:
                    t0 = time.perf_counter()
                    result = fn()
                    elapsed = time.perf_counter() - t0
                    del result
                else:
                    t0 = time.perf_counter()
                    for _ in range(number):
                        fn()
                    elapsed = (time.perf_counter() - t0) / number
                samples[name].append(elapsed)
    finally:
        gc.enable()
    return {name: Stats(samples[name]) for name in names}


# --- formatting -------------------------------------------------------------------------------


def fmt_time(s: float) -> str:
    if s < 1e-6:
        return f"{s * 1e9:.0f} ns"
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs" if s < 1e-4 else f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def fmt_pair(st: Stats) -> str:
    return f"{fmt_time(st.min)} / {fmt_time(st.median)}"


def fmt_ratio(r: tuple[float, float], digits: int = 2) -> str:
    return f"{r[0]:.{digits}f} / {r[1]:.{digits}f}"


def fmt_bytes(n: float) -> str:
    if n < 1024:
        return f"{n:.0f} B"
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"  # pragma: no cover


def fmt_mib(n: float) -> str:
    return f"{n / MIB:,.0f} MiB" if abs(n) >= 10 * MIB else f"{n / MIB:,.1f} MiB"


def fmt_count(n: int) -> str:
    if n >= MIB and n % MIB == 0:
        return f"{n // MIB}M (2^{n.bit_length() - 1})" if n & (n - 1) == 0 else f"{n // MIB}Mi"
    exp = math.log10(n)
    return f"1e{exp:.0f}" if exp.is_integer() else f"{n:,}"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "**FAIL**"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (``|`` inside a cell is escaped)."""

    def cells(row: Sequence[Any]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |"

    lines = [cells(headers), "|" + "|".join("---" for _ in headers) + "|"]
    lines += [cells(r) for r in rows]
    return "\n".join(lines)


def thread_stall() -> tuple[float, float] | None:
    """Min time of a 4 MiB torch ``copy_`` with torch's threads and with one, when they differ.

    On a shared machine whose cores are busy, a multi-threaded torch kernel waits for a
    thread the scheduler has not run yet: milliseconds for a copy that takes 0.1 ms
    alone. Every torch kernel (and tensorbridge's copies and casts, which use them) is
    then slowed, while NumPy's single-threaded loops are not. Returns None when torch
    runs one thread or the two times are alike, else (with threads, with one).
    """
    import torch

    threads = torch.get_num_threads()
    if threads < 2:
        return None
    src, dst = torch.ones(1 << 20), torch.zeros(1 << 20)
    multi, single = math.inf, math.inf
    try:
        for _ in range(15):
            t0 = time.perf_counter()
            dst.copy_(src)
            multi = min(multi, time.perf_counter() - t0)
            torch.set_num_threads(1)
            t0 = time.perf_counter()
            dst.copy_(src)
            single = min(single, time.perf_counter() - t0)
            torch.set_num_threads(threads)
    finally:
        torch.set_num_threads(threads)
    return (multi, single) if multi > 3 * single and multi > 1e-3 else None


def load_average() -> str:
    """The 1-minute load average: above the CPU count, other processes compete with us."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except (AttributeError, OSError):  # not on every platform
        return "?"


# --- one run ----------------------------------------------------------------------------------


@dataclass
class Section:
    """One section of the report: its heading and Markdown blocks, in order."""

    number: int
    title: str
    blocks: list[str] = field(default_factory=list)
    seconds: float = 0.0
    conditions: str = ""  # the load on the machine when the section started
    skipped: str = ""  # why the section did not run here; a skipped section is left out

    def intro(self, text: str) -> None:
        """The section's opening paragraph, with the machine's load when it started."""
        self.blocks.append(f"{' '.join(text.split())} {self.conditions}".rstrip())

    def text(self, text: str) -> None:
        """A paragraph (its line breaks and indentation are folded into single spaces)."""
        self.blocks.append(" ".join(text.split()))

    def raw(self, markdown: str) -> None:
        """Markdown kept exactly as given (a fenced block, a list)."""
        self.blocks.append(markdown.strip("\n"))

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        self.blocks.append(table(headers, rows))

    @property
    def heading(self) -> str:
        return f"## {self.number}. {self.title}"

    def markdown(self) -> str:
        return "\n\n".join([self.heading, *self.blocks]) + "\n"


@dataclass
class Context:
    """One run: its mode, where it writes, and what it has found so far."""

    mode: str
    scratch: Path
    out_dir: Path | None = None  # where plots go; None: tables only (printed to stdout)
    log: TextIO | None = None  # progress lines (stderr for the command line)
    checks: list[tuple[str, bool]] = field(default_factory=list)
    highlights: list[str] = field(default_factory=list)  # what a user gains, for the summary
    spreads: list[float] = field(default_factory=list)  # median / min of every timing
    stalled: list[int] = field(default_factory=list)  # sections run while torch's threads stalled
    plots_missing: bool = False  # matplotlib could not be imported
    _children: ChildRunner | None = None

    def pick(self, full: _T, quick: _T, tiny: _T) -> _T:
        """The setting of the current mode: full run, ``--quick``, or the test suite's tiny run."""
        return {"full": full, "quick": quick, "tiny": tiny}[self.mode]

    def measure(
        self, candidates: dict[str, Callable[[], Any]], *, repeats: int, sample_s: float = 2e-3
    ) -> dict[str, Stats]:
        stats = measure(candidates, repeats=repeats, sample_s=sample_s)
        self.spreads.extend(st.median / st.min for st in stats.values() if st.min > 0)
        return stats

    def highlight(self, text: str) -> None:
        """One line for the report's opening summary: what a user gains, measured here."""
        self.highlights.append(" ".join(text.split()))

    def check(self, sec: Section, what: str, ok: bool) -> str:
        """Record a target's outcome for the summary; returns the table cell."""
        self.checks.append((f"{sec.number}. {what}", ok))
        return verdict(ok)

    def say(self, message: str) -> None:
        if self.log is not None:
            self.log.write(f"[bench] {message}\n")
            self.log.flush()

    @property
    def children(self) -> ChildRunner:
        """The runner for rows measured in a child process, made on first use."""
        if self._children is None:
            self._children = ChildRunner()
        return self._children

    def child(self, task: Task[Any]) -> ChildRun:
        """Run one task in a fresh child process (see :mod:`.child`)."""
        return self.children.run(task)

    def rounds(self, cases: dict[str, Task[Any]], repeats: int) -> dict[str, list[ChildRun]]:
        """Run each task in a fresh child ``repeats`` times, interleaved."""
        names = list(cases)
        runs: dict[str, list[ChildRun]] = {name: [] for name in names}
        for rep in range(repeats):
            k = rep % len(names)
            for name in names[k:] + names[:k]:
                try:
                    runs[name].append(self.child(cases[name]))
                except ChildError as e:
                    raise ChildError(f"{name}: {e}") from None
        return runs

    def close(self) -> None:
        if self._children is not None:
            self._children.close()
            self._children = None

    def plot(self, section: Section, name: str, alt: str, draw: Callable[[Any], Any]) -> None:
        """Draw a figure with ``draw(pyplot) -> figure`` into ``out_dir/name`` and link it.

        Without an output directory (tables printed to stdout) nothing is drawn;
        without matplotlib the section says so instead of showing the plot.
        """
        if self.out_dir is None:
            return
        plt = plot.pyplot()
        if plt is None:
            self.plots_missing = True
            section.text(f"*Plot `{name}` not drawn: {plot.MISSING}.*")
            return
        plot.save(plt, draw(plt), self.out_dir / name)
        section.text(f"![{alt}]({name})")
