"""Section 5: streaming export, peak memory against tensor size.

A memory-mapped bfloat16 ``.npy`` of 1, 2 and 4 GiB (``--quick``: 64 / 128 / 256 MiB)
is exported to a float32 ``.npy`` (twice the bytes) by ``tb.save(m, path,
float_dtype="f32")``, which casts chunk by chunk through one reused buffer and releases
the pages it has read, so its peak memory should stay flat; next to it the naive route,
``np.save(path, torch.from_numpy(m).view(torch.bfloat16).float().numpy())``, which
materialises the whole float32 array, and a raw sequential write of the same number of
bytes (64 MiB blocks, fsync) as the disk's limit. Each in a child process with memory
sampled from outside; each writer fsyncs; the order of the three rotates with the size.
Issue 3's targets, checked at every size: anonymous-memory growth under 512 MiB, total
RSS growth near one chunk (<= 192 MiB), time at least 0.8x the raw write. Free disk
space is checked before each size (it needs three times the source) and free memory
before each naive run; what does not fit is skipped with a note, and every temporary
file is removed.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import torch

import tensorbridge as tb

from . import plot
from .child import ChildRun, Task, fsync, raw_buffer, raw_write
from .core import GIB, MIB, Context, Section, fmt_bytes, fmt_mib, fmt_time

TITLE = "Streaming: peak memory against tensor size"

ROUTES = {
    "tb": "`tb.save(m, path, float_dtype='f32')`",
    "naive": "`np.save(path, torch.from_numpy(m).view(torch.bfloat16).float().numpy())`",
    "raw": "raw sequential write of the same bytes",
}


def _mem_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _write_source(path: Path, n: int) -> None:
    """A uint16 .npy of ``n`` bfloat16 bit patterns (a repeated ramp), flushed to disk."""
    chunk = min(n, 1 << 23)
    ramp = np.linspace(-8, 8, chunk, dtype=np.float32).astype(ml_dtypes.bfloat16)
    bits = ramp.view(np.uint16)
    with open(path, "wb") as f:
        header = {"descr": "<u2", "fortran_order": False, "shape": (n,)}
        np.lib.format.write_array_header_1_0(f, header)
        left = n
        while left:
            k = min(left, chunk)
            f.write(bits[:k].tobytes())
            left -= k
        f.flush()
        os.fsync(f.fileno())


# --- what the child processes run: (inputs, step) per route ------------------------------------


def mapped_bf16(src: str, dst: str, nbytes: int) -> tuple[np.ndarray, str]:
    return np.load(src, mmap_mode="r").view(ml_dtypes.bfloat16), dst


def tb_export(inputs: tuple[np.ndarray, str]) -> None:
    m, dst = inputs
    tb.save(m, dst, float_dtype="f32", progress=False, overwrite=True)


def mapped_bits(src: str, dst: str, nbytes: int) -> tuple[np.ndarray, str]:
    return np.load(src, mmap_mode="c"), dst  # copy-on-write: torch may alias it


def naive_export(inputs: tuple[np.ndarray, str]) -> None:
    m, dst = inputs
    np.save(dst, torch.from_numpy(m).view(torch.bfloat16).float().numpy())
    fsync(dst)


TASKS: dict[str, tuple[Callable[..., Any], Callable[[Any], None]]] = {
    "tb": (mapped_bf16, tb_export),
    "naive": (mapped_bits, naive_export),
    "raw": (raw_buffer, raw_write),
}


def run(ctx: Context, sec: Section) -> None:
    sizes = ctx.pick([GIB, 2 * GIB, 4 * GIB], [32 * MIB, 64 * MIB, 128 * MIB], [4 * MIB, 8 * MIB])
    sec.intro(
        f"""A memory-mapped bfloat16 array exported to float32 `.npy` (the output is twice
        the source). The naive route runs once per size, tensorbridge's export and the raw
        write twice each (mirrored order): the faster time, the larger memory growth.
        *Peak RSS +* is the
        child's peak resident memory during the export above its level just before
        (mapped file pages included), *anon +* the same for anonymous memory; *vs raw*
        = raw write time / row time. Scratch directory free space at the start:
        {fmt_bytes(shutil.disk_usage(ctx.scratch).free)}; memory available:
        {fmt_bytes(_mem_available())}."""
    )
    rows: list[list[str]] = []
    measured: dict[str, dict[int, ChildRun]] = {k: {} for k in ROUTES}
    for i, size in enumerate(sizes):
        n = size // 2
        free = shutil.disk_usage(ctx.scratch).free
        if free < 3 * size + 256 * MIB:
            rows.append([fmt_bytes(size), "all", f"skipped: needs {fmt_bytes(3 * size)} free "
                         f"disk, {fmt_bytes(free)} left", "", "", "", "", "", ""])  # fmt: skip
            continue
        src = ctx.scratch / f"stream-src-{size}.npy"
        dst = ctx.scratch / "stream-dst.npy"
        try:
            _write_source(src, n)
            routes = list(ROUTES)
            order = routes[i % 3 :] + routes[: i % 3]  # rotated: no route always first
            # tb and raw twice, mirrored (a disk stall in one run is not the verdict): each
            # keeps its faster time and its larger memory growth
            for route in order + [r for r in reversed(order) if r != "naive"]:
                if route == "naive":
                    need = 3 * size + GIB  # the mapped source, the float32 copy, a margin
                    if _mem_available() < need:
                        ctx.say(f"streaming: skipping the naive route at {fmt_bytes(size)}")
                        continue
                prepare, step = TASKS[route]
                task = Task(prepare, step, (str(src), str(dst), 2 * size))
                measured[route][size] = _better(measured[route].get(size), ctx.child(task))
                dst.unlink(missing_ok=True)
        finally:
            src.unlink(missing_ok=True)
            dst.unlink(missing_ok=True)
        rows += _rows(ctx, sec, size, measured)
    sec.table(
        [
            "source (bf16)",
            "route",
            "time",
            "written GB/s",
            "vs raw",
            "peak RSS +",
            "anon +",
            "target (RSS + / anon + / vs raw)",
            "result",
        ],
        rows,
    )
    tb_runs, naive = measured["tb"], measured["naive"]
    if len(tb_runs) >= 2:
        lo, hi = min(tb_runs), max(tb_runs)
        note = (
            f"From {fmt_bytes(lo)} to {fmt_bytes(hi)} of input, tensorbridge's peak RSS growth "
            f"went from {fmt_mib(tb_runs[lo].rss_growth)} to {fmt_mib(tb_runs[hi].rss_growth)}"
        )
        if lo in naive and hi in naive:
            note += (
                f"; the naive route's from {fmt_mib(naive[lo].rss_growth)} to "
                f"{fmt_mib(naive[hi].rss_growth)}"
            )
        sec.text(note + ".")
    both = [s for s in tb_runs if s in naive]
    if both:
        top = max(both)
        ctx.highlight(
            f"**Exporting a {fmt_bytes(top)} bfloat16 memmap to a float32 `.npy`**: "
            f"`tb.save(..., float_dtype='f32')` adds {fmt_mib(tb_runs[top].rss_growth)} to peak "
            f"memory, the `.float()` route {fmt_mib(naive[top].rss_growth)}; tensorbridge's "
            "stays flat as the file grows."
        )
    skipped = [s for s in tb_runs if s not in naive]
    if skipped:
        sec.text(
            "The naive route was skipped at "
            + ", ".join(fmt_bytes(s) for s in skipped)
            + ": it needs about three times the source in free memory."
        )
    ctx.plot(sec, "streaming.png", "peak memory against source size", _drawer(measured))


def _better(seen: ChildRun | None, new: ChildRun) -> ChildRun:
    """The faster run's time with the larger memory growth of the two."""
    if seen is None:
        return new
    return ChildRun(
        min(seen.seconds, new.seconds),
        max(seen.anon_growth, new.anon_growth),
        max(seen.rss_growth, new.rss_growth),
        seen.extra if seen.seconds <= new.seconds else new.extra,
    )


def _rows(
    ctx: Context, sec: Section, size: int, measured: dict[str, dict[int, ChildRun]]
) -> list[list[str]]:
    raw = measured["raw"].get(size)
    rows = []
    for route, label in ROUTES.items():
        r = measured[route].get(size)
        if r is None:
            rows.append([fmt_bytes(size), label, "skipped: not enough free memory"] + [""] * 6)
            continue
        vs = f"{raw.seconds / r.seconds:.2f}x" if raw is not None else "—"
        target = result = ""
        if route == "tb":
            target = "<= 192 MiB / < 512 MiB / >= 0.8x"
            what = f"streaming export of {fmt_bytes(size)} bf16 -> f32"
            result = " / ".join(
                [
                    ctx.check(
                        sec, f"{what}: peak RSS growth <= 192 MiB", r.rss_growth <= 192 * MIB
                    ),
                    ctx.check(sec, f"{what}: anon growth < 512 MiB", r.anon_growth < 512 * MIB),
                    ctx.check(
                        sec,
                        f"{what}: >= 0.8x raw write",
                        raw is not None and raw.seconds / r.seconds >= 0.8,
                    ),
                ]
            )
        rows.append(
            [
                fmt_bytes(size),
                label,
                fmt_time(r.seconds),
                f"{2 * size / r.seconds / 1e9:.2f}",
                vs,
                fmt_mib(r.rss_growth),
                fmt_mib(r.anon_growth),
                target,
                result,
            ]
        )
    return rows


def _drawer(measured: dict[str, dict[int, ChildRun]]) -> Callable[[Any], Any]:
    def draw(plt: Any) -> Any:
        fig, axes = plot.figure(plt, width=7.5, height=4.2)
        ax = axes[0, 0]
        for route, label in (("tb", "tb.save(float_dtype='f32')"), ("naive", "naive .float()")):
            runs = measured[route]
            xs = sorted(runs)
            if not xs:
                continue
            ax.plot(xs, [max(runs[x].rss_growth, MIB) / MIB for x in xs], "o-",
                    label=f"{label}: peak RSS growth")  # fmt: skip
            ax.plot(xs, [max(runs[x].anon_growth, MIB) / MIB for x in xs], "s--",
                    label=f"{label}: anonymous growth")  # fmt: skip
        xs = sorted(measured["tb"])
        if xs:
            ax.plot(xs, [x / MIB for x in xs], ":", color="grey", label="source size")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("source bytes (bfloat16)")
        ax.set_ylabel("MiB above the level before the export")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7)
        return fig

    return draw
