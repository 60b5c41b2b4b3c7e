"""Side-by-side timings of ``tb.to_numpy`` / ``tb.to_torch`` against the plain-torch calls.

Every table is measured in one run, the candidates of a row interleaved (round-robin,
the order rotated each repeat) so that a noisy, shared machine slows them alike. Each
cell is the minimum and median over the repeats. Ratios are given from both; PASS or
FAIL (against the targets of issue 2's "Speed" section) is decided on the ratio of the
minima, the estimate least disturbed by other processes on a shared machine (the
medians show how noisy the run was; the load average is printed with each section):

1. the seed article's case (a 1000x1000 bf16 tensor): at least 10x faster than
   ``t.float().numpy()`` with at most half its memory;
2. zero-copy time independent of size, 1e3 to 1e8 bf16 elements;
3. per-call overhead on 1,000 elements within 4x of the bare ``t.numpy()`` /
   ``torch.from_numpy(a)``, for every dtype in ``tb.dtype_table()``;
4. casts and copies: bf16 -> f32 at least 3x ``t.float().numpy()`` from 16M elements
   up and never slower below; f32 -> bf16 at least 0.9x torch's own cast; ``copy=True``
   and ``out=`` on 64 MiB+ at 80 % of ``np.copyto`` bandwidth or better.

Run ``python benchmarks/bench_convert.py`` (a few minutes) or ``--quick`` (seconds,
fewer sizes and repeats: a smoke test, not a measurement). The exit status is 0 even
when a target fails; the tables are the result.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import torch

import tensorbridge as tb

# torch warns whenever it allocates a complex32 tensor (section 3 makes some).
warnings.filterwarnings("ignore", "ComplexHalf support is experimental")

BF16 = np.dtype(ml_dtypes.bfloat16)
MIB = 1 << 20
NOISY = 1.5  # a median this many times the minimum means other load disturbed the timing
SPREADS: list[float] = []  # median / min of every timing, for the closing note on noise


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


def fmt_ratio(r: tuple[float, float], digits: int = 2) -> str:
    return f"{r[0]:.{digits}f} / {r[1]:.{digits}f}"


def _calibrate(fn: Callable[[], Any], sample_s: float) -> int:
    """How many calls make one timing sample of about ``sample_s`` seconds (1 for slow calls)."""
    fn()  # warm-up: first-call costs (imports, caches, lazy init) are not what we measure
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
    """Time each candidate ``repeats`` times, interleaved, with the garbage collector off.

    A call that takes longer than ``sample_s / 4`` is timed alone (its result is kept
    until the clock stops and freed before the next call, so a copy into fresh memory
    pays its page faults every time, as it does for a user); faster calls are timed in
    a loop of ``number`` calls and reported per call.
    """
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
    stats = {name: Stats(samples[name]) for name in names}
    SPREADS.extend(st.median / st.min for st in stats.values())
    return stats


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


def fmt_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    for unit, size in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"  # pragma: no cover


def fmt_count(n: int) -> str:
    if n >= MIB and n % MIB == 0:
        return f"{n // MIB}M (2^{n.bit_length() - 1})" if n & (n - 1) == 0 else f"{n // MIB}Mi"
    exp = math.log10(n)
    return f"1e{exp:.0f}" if exp.is_integer() else f"{n:,}"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "**FAIL**"


class Report:
    """Collects PASS/FAIL per target for the closing summary."""

    def __init__(self) -> None:
        self.results: list[tuple[str, bool]] = []

    def check(self, what: str, ok: bool) -> str:
        self.results.append((what, ok))
        return verdict(ok)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    print("| " + " | ".join(headers) + " |")
    print("|" + "|".join("---" for _ in headers) + "|")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
    print()


def load() -> str:
    """The 1-minute load average: above the CPU count, other processes compete with us."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except (AttributeError, OSError):  # not on every platform
        return "?"


def heading(title: str, note: str) -> None:
    print(f"## {title}\n")
    print(f"{note.strip()} Load average at the start: {load()} on {os.cpu_count()} CPUs.\n")
    sys.stdout.flush()


# --- 1. the seed article's case ---------------------------------------------------------------


def bench_article(report: Report, repeats: int) -> None:
    heading(
        "1. The seed article's case: a 1000x1000 bfloat16 tensor to NumPy",
        """
Time is min / median per call. *New memory* is what the call allocates (0 when the
result shares the tensor's memory). Speedup = time of `t.float().numpy()` / time of the
row, from the minima / from the medians. Target for `tb.to_numpy(t)`: >= 10x faster
(minima) and <= 1/2 the memory of `t.float().numpy()`.
""",
    )
    t = torch.randn(1000, 1000).to(torch.bfloat16)
    structured = np.dtype([("bf16", np.uint16)])  # the article's "custom dtype" (§3.2)
    candidates: dict[str, Callable[[], Any]] = {
        # Upcast to float32: a new 4-byte-per-element tensor, then a view of it.
        "`t.float().numpy()`": lambda: t.float().numpy(),
        # The article's "memory view" (§3.1): the bits, but typed as integers.
        "`t.view(torch.uint16).numpy()`": lambda: t.view(torch.uint16).numpy(),
        # The article's "custom dtype" (§3.2): the bits in a structured dtype (no arithmetic).
        "`t.view(torch.uint16).numpy().view([('bf16', np.uint16)])`": lambda: (
            t.view(torch.uint16).numpy().view(structured)
        ),
        # The hand-written bit-cast that tb's fast path performs (the floor for tb).
        "`t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)`": lambda: (
            t.view(torch.int16).numpy().view(BF16)
        ),
        "`tb.to_numpy(t)`": lambda: tb.to_numpy(t),
        # For reference: tb's float32 cast (section 4 measures it across sizes).
        "`tb.to_numpy(t, dtype=np.float32)`": lambda: tb.to_numpy(t, dtype=np.float32),
    }
    stats = measure(candidates, repeats=repeats)
    base_name = "`t.float().numpy()`"
    base = stats[base_name]
    base_bytes = candidates[base_name]().nbytes
    source = t.view(torch.int16).numpy()

    rows: list[list[Any]] = []
    try:
        t.numpy()
        direct = "returns (unexpected)"
    except (TypeError, RuntimeError) as e:
        direct = f"raises {type(e).__name__}: {str(e).splitlines()[0]}"
    rows.append(["`t.numpy()`", "—", direct, "—", "—", "—", "", ""])
    for name, st in stats.items():
        out = candidates[name]()
        new = 0 if np.shares_memory(out, source) else out.nbytes
        sp = speedup(base, st)
        target = result = ""
        if name == "`tb.to_numpy(t)`":
            target = ">= 10x, <= 1/2 memory"
            result = report.check(
                "1. article case: tb.to_numpy(t) >= 10x and <= 1/2 memory of .float().numpy()",
                sp[0] >= 10 and new <= base_bytes / 2,
            )
        rows.append(
            [
                name,
                str(out.dtype),
                fmt_pair(st),
                fmt_bytes(out.nbytes),
                fmt_bytes(new),
                fmt_ratio(sp, 1),
                target,
                result,
            ]
        )
    table(
        [
            "call",
            "result dtype",
            "time min / median",
            "output bytes",
            "new memory",
            "speedup vs .float().numpy() (min / median)",
            "target",
            "result",
        ],
        rows,
    )


# --- 2. size independence ---------------------------------------------------------------------


def _zero_copy_cases(t: torch.Tensor, a: np.ndarray) -> dict[str, Callable[[], Any]]:
    return {
        "to_numpy": lambda: tb.to_numpy(t),
        "to_torch": lambda: tb.to_torch(a),
        "float": lambda: t.float().numpy(),
    }


def bench_sizes(report: Report, repeats: int, sizes: Sequence[int]) -> None:
    heading(
        "2. Zero-copy time is independent of size (bfloat16)",
        """
`tb.to_numpy(t)` and `tb.to_torch(a)` on 1-D bf16 data (`a` an ml_dtypes array with
its own memory). Growth = time at this size / time at the smallest size, from the
minima / from the medians; target <= 2x (minima) at every size (flat).
`t.float().numpy()` (median) is shown for scale, not as a target.
""",
    )
    first: dict[str, Stats] = {}
    rows = []
    for n in sizes:
        t = torch.ones(n, dtype=torch.bfloat16)
        a = np.ones(n, np.float32).astype(BF16) if n <= 10**7 else tb.to_numpy(t).copy()
        candidates = _zero_copy_cases(t, a)
        reps = repeats if n < 10**8 else max(3, repeats // 3)
        stats = measure(candidates, repeats=reps)
        for key in ("to_numpy", "to_torch"):
            first.setdefault(key, stats[key])
        g_np = speedup(stats["to_numpy"], first["to_numpy"])  # this size's time / the first's
        g_t = speedup(stats["to_torch"], first["to_torch"])
        ok = report.check(
            f"2. size independence at {fmt_count(n)} bf16 elements", max(g_np[0], g_t[0]) <= 2
        )
        rows.append(
            [
                fmt_count(n),
                fmt_bytes(2 * n),
                fmt_pair(stats["to_numpy"]),
                fmt_ratio(g_np),
                fmt_pair(stats["to_torch"]),
                fmt_ratio(g_t),
                fmt_time(stats["float"].median),
                "<= 2x",
                ok,
            ]
        )
        del t, a, candidates, stats
        gc.collect()
    table(
        [
            "elements",
            "bytes",
            "tb.to_numpy min / median",
            "growth",
            "tb.to_torch min / median",
            "growth",
            "`.float().numpy()` median",
            "target",
            "result",
        ],
        rows,
    )


# --- 3. per-call overhead ---------------------------------------------------------------------


def _overhead_cases(
    row: tb.DTypeRow, t: torch.Tensor, a: np.ndarray, bare_t: torch.Tensor, bare_a: np.ndarray
) -> dict[str, Callable[[], Any]]:
    cases: dict[str, Callable[[], Any]] = {
        "tb_np": lambda: tb.to_numpy(t),
        "bare_np": lambda: bare_t.numpy(),
        "tb_t": lambda: tb.to_torch(a),
        "bare_t": lambda: torch.from_numpy(bare_a),
    }
    carrier = row.carrier
    if carrier is not None:
        cases["hand"] = lambda: t.view(carrier).numpy().view(row.numpy)
    return cases


def bench_overhead(report: Report, repeats: int) -> None:
    heading(
        "3. Per-call overhead, 1,000 elements, every dtype in `tb.dtype_table()`",
        """
Min / median time per call (calls looped into ~2 ms samples). The bare baseline is the same
dtype's `t.numpy()` / `torch.from_numpy(a)`; for dtypes NumPy and torch cannot exchange
by themselves (the ml_dtypes rows) it is the float32 one (marked f32). *hand* is the
hand-written bit-cast `t.view(carrier).numpy().view(ml_dtype)`, the floor for those
rows. Ratio = tb time / bare time, from the minima / from the medians; target <= 4x
(minima) in both directions.
""",
    )
    n = 1000
    f32_t = torch.zeros(n, dtype=torch.float32)
    f32_a = np.zeros(n, np.float32)
    rows = []
    for row in tb.dtype_table():
        # Zero bytes are a valid value of every dtype in the table.
        t = torch.zeros(n * row.itemsize, dtype=torch.uint8).view(row.torch)
        a = np.zeros(n * row.itemsize, np.uint8).view(row.numpy)
        native = row.carrier is None
        bare_t, bare_a = (t, a) if native else (f32_t, f32_a)
        st = measure(_overhead_cases(row, t, a, bare_t, bare_a), repeats=repeats)
        r_np = speedup(st["tb_np"], st["bare_np"])  # tb time / bare time
        r_t = speedup(st["tb_t"], st["bare_t"])
        ok = report.check(f"3. overhead {row.name}", r_np[0] <= 4 and r_t[0] <= 4)
        rows.append(
            [
                row.name,
                "same" if native else "f32",
                fmt_pair(st["bare_np"]),
                fmt_pair(st["hand"]) if "hand" in st else "—",
                fmt_pair(st["tb_np"]),
                fmt_ratio(r_np),
                fmt_pair(st["bare_t"]),
                fmt_pair(st["tb_t"]),
                fmt_ratio(r_t),
                "<= 4x",
                ok,
            ]
        )
    table(
        [
            "dtype",
            "bare of",
            "`t.numpy()`",
            "hand",
            "`tb.to_numpy(t)`",
            "ratio",
            "`torch.from_numpy(a)`",
            "`tb.to_torch(a)`",
            "ratio",
            "target",
            "result",
        ],
        rows,
    )


# --- 4. casts and copies ----------------------------------------------------------------------


def _upcast_cases(t: torch.Tensor, a: np.ndarray) -> dict[str, Callable[[], Any]]:
    return {
        "base": lambda: t.float().numpy(),
        "tb": lambda: tb.to_numpy(t, dtype=np.float32),
        "ml": lambda: a.astype(np.float32),
    }


def bench_upcast(report: Report, repeats: int, sizes: Sequence[int]) -> None:
    heading(
        "4a. Cast bfloat16 -> float32: `tb.to_numpy(t, dtype=np.float32)` vs `t.float().numpy()`",
        """
Both allocate a fresh float32 result on every call (tb: `np.empty` + torch's `copy_`
kernel; torch: its own allocator + the same kernel), so this compares like with like.
`ml_dtypes astype` = `a.astype(np.float32)` on the ml_dtypes bf16 array, a reference
row. Speedup = baseline time / row time, from the minima / from the medians. Target
(minima): >= 3x from 16M elements (2^24) up, >= 1x (never slower) below.
""",
    )
    rows = []
    for n in sizes:
        t = torch.randn(n).to(torch.bfloat16)
        a = tb.to_numpy(t)
        candidates = _upcast_cases(t, a)
        reps = repeats if n < 2**26 else max(5, repeats // 2)
        st = measure(candidates, repeats=reps)
        sp = speedup(st["base"], st["tb"])
        need = 3.0 if n >= 2**24 else 1.0
        ok = report.check(f"4a. bf16->f32 cast at {fmt_count(n)}", sp[0] >= need)
        rows.append(
            [
                fmt_count(n),
                fmt_pair(st["base"]),
                fmt_pair(st["tb"]),
                fmt_ratio(sp),
                fmt_pair(st["ml"]),
                fmt_ratio(speedup(st["base"], st["ml"])),
                f">= {need:g}x",
                ok,
            ]
        )
        del t, a, candidates
        gc.collect()
    table(
        [
            "elements",
            "`t.float().numpy()`",
            "tb",
            "speedup",
            "ml_dtypes astype",
            "astype speedup",
            "target",
            "result",
        ],
        rows,
    )


def _downcast_cases(t: torch.Tensor, a: np.ndarray) -> dict[str, Callable[[], Any]]:
    return {
        "base": lambda: t.to(torch.bfloat16).view(torch.uint16).numpy(),
        "tb": lambda: tb.to_numpy(t, dtype=BF16),
        "ml": lambda: a.astype(BF16),
    }


def bench_downcast(report: Report, repeats: int, sizes: Sequence[int]) -> None:
    heading(
        "4b. Cast float32 -> bfloat16: `tb.to_numpy(t, dtype=ml_dtypes.bfloat16)` vs torch",
        """
Baseline `t.to(torch.bfloat16).view(torch.uint16).numpy()` (plain torch has no other way
to hand bf16 to NumPy); both allocate a fresh 2-byte result per call. `ml_dtypes astype`
= `a.astype(ml_dtypes.bfloat16)` on the float32 array, a reference row. Speedup as in
4a; target >= 0.9x (minima).
""",
    )
    rows = []
    for n in sizes:
        t = torch.randn(n)
        a = t.numpy()
        candidates = _downcast_cases(t, a)
        reps = repeats if n < 2**26 else max(5, repeats // 2)
        st = measure(candidates, repeats=reps)
        sp = speedup(st["base"], st["tb"])
        ok = report.check(f"4b. f32->bf16 cast at {fmt_count(n)}", sp[0] >= 0.9)
        rows.append(
            [
                fmt_count(n),
                fmt_pair(st["base"]),
                fmt_pair(st["tb"]),
                fmt_ratio(sp),
                fmt_pair(st["ml"]),
                fmt_ratio(speedup(st["base"], st["ml"])),
                ">= 0.9x",
                ok,
            ]
        )
        del t, a, candidates
        gc.collect()
    table(
        [
            "elements",
            "`.to(bf16).view(uint16).numpy()`",
            "tb",
            "speedup",
            "ml_dtypes astype",
            "astype speedup",
            "target",
            "result",
        ],
        rows,
    )


def _copy_cases(
    t: torch.Tensor, a: np.ndarray, dst: np.ndarray, dst_t: torch.Tensor
) -> dict[str, Callable[[], Any]]:
    return {
        "`np.copyto(dst, a)` (prealloc)": lambda: np.copyto(dst, a),
        "`a.copy()` (fresh)": lambda: a.copy(),
        "`t.clone()` (fresh)": lambda: t.clone(),
        "`tb.to_numpy(t, copy=True)` (fresh)": lambda: tb.to_numpy(t, copy=True),
        "`tb.to_torch(a, copy=True)` (fresh)": lambda: tb.to_torch(a, copy=True),
        "`tb.to_numpy(t, out=dst)` (prealloc)": lambda: tb.to_numpy(t, out=dst),
        "`tb.to_torch(a, out=dst_t)` (prealloc)": lambda: tb.to_torch(a, out=dst_t),
    }


def bench_copies(report: Report, repeats: int, sizes_bytes: Sequence[int]) -> None:
    heading(
        "4c. Copies: `copy=True` and `out=` vs `np.copyto` bandwidth",
        """
GB/s = payload bytes / minimum time. *vs copyto* = copyto time / row time (minima /
medians), i.e. the fraction of `np.copyto`'s bandwidth (target >= 0.8 on the minima, from
issue 2). What each row measures:

* `np.copyto(dst, a)`: a copy into a preallocated, already-touched buffer: no page
  faults, the bandwidth ceiling and the baseline.
* `a.copy()` and `t.clone()`: what NumPy and torch charge for a copy into *fresh*
  memory (allocated per call, freed before the next, so every call pays its page faults,
  as a user's call does). They are the like-for-like references for `copy=True`:
  *vs a.copy()* = `a.copy()` time / row time (minima).
* `tb.to_numpy(t, copy=True)` and `tb.to_torch(a, copy=True)`: fresh memory per call, as
  users call them. Against `np.copyto` they also pay the page faults that a preallocated
  buffer does not; *vs a.copy()* is the fair comparison.
* `tb.to_numpy(t, out=dst)` and `tb.to_torch(a, out=dst_t)`: into a preallocated,
  already-touched buffer: like with like against `np.copyto`.
""",
    )
    rows = []
    for nbytes in sizes_bytes:
        for dt in (torch.float32, torch.bfloat16):
            n = nbytes // torch.tensor([], dtype=dt).element_size()
            t = torch.randn(n).to(dt)
            a = tb.to_numpy(t).copy()
            dst = np.empty_like(a)
            dst.fill(0)  # touch every page: a preallocated buffer that is already in use
            dst_t = torch.zeros(n, dtype=dt)
            candidates = _copy_cases(t, a, dst, dst_t)
            st = measure(candidates, repeats=repeats)
            base = st["`np.copyto(dst, a)` (prealloc)"]
            fresh = st["`a.copy()` (fresh)"]
            for name, s in st.items():
                frac = speedup(base, s)
                target = result = ""
                if name.startswith("`tb."):
                    target = ">= 0.8"
                    label = f"4c. {name} {fmt_bytes(nbytes)} {str(dt)[6:]}"
                    result = report.check(label, frac[0] >= 0.8)
                rows.append(
                    [
                        f"{fmt_bytes(nbytes)} {str(dt)[6:]}",
                        name,
                        fmt_pair(s),
                        f"{nbytes / s.min / 1e9:.1f}",
                        fmt_ratio(frac),
                        f"{speedup(fresh, s)[0]:.2f}",
                        target,
                        result,
                    ]
                )
            del t, a, dst, dst_t, candidates
            gc.collect()
    table(
        [
            "data",
            "call",
            "time min / median",
            "GB/s",
            "vs copyto",
            "vs a.copy()",
            "target",
            "result",
        ],
        rows,
    )


# --- main -------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run (~20 s)")
    args = parser.parse_args(argv)
    quick: bool = args.quick

    if quick:
        reps, overhead_reps = 5, 5
        zero_copy_sizes = [10**3, 10**5, 10**7]
        cast_sizes = [10**4, 10**6, 2**24]
        copy_sizes = [64 * MIB]
    else:
        reps, overhead_reps = 21, 15
        zero_copy_sizes = [10**k for k in range(3, 9)]
        cast_sizes = [10**4, 10**5, 10**6, 2**22, 2**24, 2**26]
        copy_sizes = [64 * MIB, 256 * MIB]

    started = time.perf_counter()
    print("# tensorbridge conversion benchmark" + (" (--quick: smoke run)" if quick else ""))
    print()
    print(
        f"tensorbridge {tb.__version__}, torch {torch.__version__} "
        f"({torch.get_num_threads()} intra-op threads), numpy {np.__version__}, "
        f"ml_dtypes {ml_dtypes.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs ({platform.machine()}). Times are min / median over "
        f"{reps} interleaved repeats ({overhead_reps} in section 3, {3 if quick else 11} in 4c).\n"
    )
    report = Report()
    bench_article(report, reps)
    bench_sizes(report, reps, zero_copy_sizes)
    bench_overhead(report, overhead_reps)
    bench_upcast(report, reps, cast_sizes)
    bench_downcast(report, reps, cast_sizes)
    bench_copies(report, 3 if quick else 11, copy_sizes)

    failed = [what for what, ok in report.results if not ok]
    print("## Summary\n")
    print(f"{len(report.results) - len(failed)} of {len(report.results)} targets pass.")
    for what in failed:
        print(f"- FAIL: {what}")
    noisy = sum(spread > NOISY for spread in SPREADS)
    print(
        f"\n{noisy} of {len(SPREADS)} timings had a median over {NOISY}x their minimum (other "
        f"load on the machine; load average now {load()} on {os.cpu_count()} CPUs). PASS/FAIL "
        f"uses the minima. Run took {time.perf_counter() - started:.0f} s."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
