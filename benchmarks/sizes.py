"""Section 2: the size sweep, zero-copy and copying paths against memcpy in the same run.

1-D bfloat16 data from 1e3 to 1e8 elements (``--quick``: to 1e6). Zero-copy calls
should cost the same at every size (issue 2: growth <= 2x); copies are set against the
machine's memcpy bandwidth measured in the same run (``np.copyto`` into a preallocated,
already-touched buffer) and the fresh-memory reference ``a.copy()``, which pays the page
faults of new memory as every ``copy=True`` does. The copy targets (``copy=True`` at least
``a.copy()``'s speed from 64 MiB up; ``out=`` at least 80 % of ``np.copyto`` at 256 MiB,
``to_numpy``'s from the same tensor memory it reads) have their own table at the end.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import torch

import tensorbridge as tb

from . import plot
from .core import (
    MIB,
    Context,
    Section,
    Stats,
    fmt_bytes,
    fmt_count,
    fmt_pair,
    fmt_ratio,
    fmt_time,
    speedup,
)

TITLE = "Size sweep: zero-copy and copies against memcpy"

BF16 = np.dtype(ml_dtypes.bfloat16)

# key: (label, bytes read + written per element of bf16 input; 0 for zero-copy calls)
PATHS = {
    "memcpy": ("`np.copyto(dst, a)` (memcpy, prealloc)", 4),
    "fresh": ("`a.copy()` (fresh)", 4),
    "to_numpy": ("`tb.to_numpy(t)`", 0),
    "to_torch": ("`tb.to_torch(a)`", 0),
    "np_copy": ("`tb.to_numpy(t, copy=True)`", 4),
    "t_copy": ("`tb.to_torch(a, copy=True)`", 4),
    "np_out": ("`tb.to_numpy(t, out=dst)`", 4),
    "t_out": ("`tb.to_torch(a, out=dst_t)`", 4),
    "cast": ("`tb.to_numpy(t, dtype=np.float32)`", 6),
    "float": ("`t.float().numpy()`", 6),
}
COPYING = ["fresh", "np_copy", "t_copy", "np_out", "t_out", "cast", "float"]


def _sweep_cases(
    t: torch.Tensor, a: np.ndarray, dst: np.ndarray, dst_t: torch.Tensor
) -> dict[str, Callable[[], Any]]:
    return {
        "memcpy": lambda: np.copyto(dst, a),
        "fresh": lambda: a.copy(),
        "to_numpy": lambda: tb.to_numpy(t),
        "to_torch": lambda: tb.to_torch(a),
        "np_copy": lambda: tb.to_numpy(t, copy=True),
        "t_copy": lambda: tb.to_torch(a, copy=True),
        "np_out": lambda: tb.to_numpy(t, out=dst),
        "t_out": lambda: tb.to_torch(a, out=dst_t),
        "cast": lambda: tb.to_numpy(t, dtype=np.float32),
        "float": lambda: t.float().numpy(),
    }


def _share(base: Stats, row: Stats, base_traffic: int, row_traffic: int) -> tuple[float, float]:
    """The row's bandwidth (bytes read + written per second) as a fraction of the base's."""
    frac = speedup(base, row)
    scale = row_traffic / base_traffic
    return frac[0] * scale, frac[1] * scale


def run(ctx: Context, sec: Section) -> None:
    sec.intro(
        """1-D bfloat16 data; `t` a tensor, `a` an ml_dtypes array with its own memory,
        `dst` / `dst_t` preallocated, already-touched buffers. Every call of a row size is
        timed interleaved with the others; cells are min / median."""
    )
    sizes = ctx.pick(
        [10**k for k in range(3, 9)], [10**k for k in range(3, 7)], [10**3, 10**4, 10**5]
    )
    repeats = ctx.pick(11, 5, 3)
    results: dict[int, dict[str, Stats]] = {}
    for n in sizes:
        t = torch.ones(n, dtype=torch.bfloat16)
        a = tb.to_numpy(t).copy()
        dst = np.empty_like(a)
        dst.view(np.uint16).fill(0)  # touch every page: a buffer that is already in use
        dst_t = torch.zeros(n, dtype=torch.bfloat16)
        reps = repeats if n < 10**8 else max(3, repeats // 2)
        results[n] = ctx.measure(_sweep_cases(t, a, dst, dst_t), repeats=reps)
        del t, a, dst, dst_t
        gc.collect()

    _flat_table(ctx, sec, results)
    _bandwidth_table(sec, results)
    alt = "time per call and share of memcpy bandwidth against size"
    ctx.plot(sec, "sizes.png", alt, _drawer(results))
    _copies_at_size(ctx, sec, ctx.pick([64 * MIB, 256 * MIB], [64 * MIB], [4 * MIB]))


def _flat_table(ctx: Context, sec: Section, results: dict[int, dict[str, Stats]]) -> None:
    sec.text(
        """**Zero-copy time is independent of size.** Growth = time at this size / time at
        the smallest size, from the minima / from the medians; goal <= 2x
        (minima) at every size. `t.float().numpy()` (median) is shown for scale."""
    )
    first = results[min(results)]
    rows = []
    for n, st in results.items():
        g_np = speedup(st["to_numpy"], first["to_numpy"])  # this size's time / the first's
        g_t = speedup(st["to_torch"], first["to_torch"])
        ok = ctx.check(
            sec,
            f"zero-copy size independence at {fmt_count(n)} bf16 elements",
            max(g_np[0], g_t[0]) <= 2,
        )
        rows.append(
            [
                fmt_count(n),
                fmt_bytes(2 * n),
                fmt_pair(st["to_numpy"]),
                fmt_ratio(g_np),
                fmt_pair(st["to_torch"]),
                fmt_ratio(g_t),
                fmt_time(st["float"].median),
                "<= 2x",
                ok,
            ]
        )
    sec.table(
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


def _bandwidth_table(sec: Section, results: dict[int, dict[str, Stats]]) -> None:
    sec.text(
        """**Copying paths as a share of memcpy bandwidth** (min / median, in %). Bandwidth
        counts bytes read + bytes written per second, so the bf16 -> float32 casts (2
        bytes read, 4 written per element) compare fairly with the copies (2 + 2).
        *fresh* = a result allocated per call (pays page faults, like `a.copy()`);
        *prealloc* = written into `dst` / `dst_t`. The memcpy column is the copy rate of
        `np.copyto` (bytes copied / second, min / median)."""
    )
    rows = []
    for n, st in results.items():
        base = st["memcpy"]
        cells = [fmt_count(n), fmt_bytes(2 * n)]
        cells.append(f"{2 * n / base.min / 1e9:.1f} / {2 * n / base.median / 1e9:.1f}")
        for key in COPYING:
            share = _share(base, st[key], PATHS["memcpy"][1], PATHS[key][1])
            cells.append(f"{100 * share[0]:.0f} / {100 * share[1]:.0f}")
        rows.append(cells)
    labels = {
        "fresh": "`a.copy()` fresh",
        "np_copy": "to_numpy copy=True fresh",
        "t_copy": "to_torch copy=True fresh",
        "np_out": "to_numpy out= prealloc",
        "t_out": "to_torch out= prealloc",
        "cast": "to_numpy dtype=f32 fresh",
        "float": "`.float().numpy()` fresh",
    }
    sec.table(["elements", "bytes", "memcpy GB/s", *(labels[k] for k in COPYING)], rows)


def _drawer(results: dict[int, dict[str, Stats]]) -> Callable[[Any], Any]:
    def draw(plt: Any) -> Any:
        fig, axes = plot.figure(plt, 1, 2, width=11, height=4.4)
        sizes = sorted(results)
        nbytes = [2 * n for n in sizes]
        left, right = axes[0, 0], axes[0, 1]
        colour = {key: f"C{i}" for i, key in enumerate(PATHS)}  # the same line in both panels
        for key, (label, _) in PATHS.items():
            style = "--" if key in ("memcpy", "fresh") else "-"
            left.plot(
                nbytes, [results[n][key].min for n in sizes], style, marker="o", ms=3,
                color=colour[key], label=label.replace("`", ""),
            )  # fmt: skip
        left.set_xscale("log")
        left.set_yscale("log")
        left.set_xlabel("bfloat16 input bytes")
        left.set_ylabel("seconds per call (min)")
        left.set_title("time per call", fontsize=10)
        left.grid(True, which="major", alpha=0.3)
        left.legend(fontsize=6.5, loc="upper left")
        for key in COPYING:
            shares = [
                100 * _share(results[n]["memcpy"], results[n][key], 4, PATHS[key][1])[0]
                for n in sizes
            ]
            style = "--" if key == "fresh" else "-"
            right.plot(
                nbytes, shares, style, marker="o", ms=3, color=colour[key],
                label=PATHS[key][0].replace("`", ""),
            )  # fmt: skip
        right.axhline(80, color="grey", lw=0.8, ls=":")
        right.axvline(64 * MIB, color="grey", lw=0.8, ls=":")
        right.set_xscale("log")
        right.set_xlabel("bfloat16 input bytes")
        right.set_ylabel("% of memcpy bandwidth (min)")
        right.set_title("copies vs np.copyto (target: 80 % from 64 MiB)", fontsize=10)
        right.grid(True, which="major", alpha=0.3)
        right.legend(fontsize=6.5, loc="upper left")
        return fig

    return draw


# --- issue 2's copy target: 64 MiB and up ------------------------------------------------------


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


OUT_ROW = "`tb.to_numpy(t, out=dst)` (prealloc)"
OUT_BASE = "`np.copyto(dst, t.numpy())` (prealloc, the tensor's memory)"


def _out_pair(ctx: Context, t: torch.Tensor, dst: np.ndarray) -> dict[str, Stats]:
    """``tb.to_numpy(t, out=dst)`` and the memcpy of the same memory, timed as a pair.

    ``np.copyto(dst, a)`` reads NumPy's memory, which NumPy backs with transparent huge
    pages from 4 MiB up (madvise); ``t`` is torch's, in 4 KiB pages, and any memcpy
    from it takes far more TLB misses, whoever runs it. The like-for-like baseline
    reads ``t`` too; as a pair, each candidate follows the other in the rotation.
    """
    view = tb.to_numpy(t).view(f"u{dst.itemsize}")
    dst_u = dst.view(view.dtype)
    return ctx.measure(
        {
            OUT_BASE: lambda: np.copyto(dst_u, view),
            OUT_ROW: lambda: tb.to_numpy(t, out=dst),
        },
        repeats=ctx.pick(11, 3, 3),
    )


def _copies_at_size(ctx: Context, sec: Section, sizes_bytes: Sequence[int]) -> None:
    sec.text(
        """**Copies at 64 MiB and up: `copy=True` and `out=` against `np.copyto`**.
        GB/s = payload bytes / minimum time. *vs copyto* = copyto time / row time
        (minima / medians), the fraction of `np.copyto`'s bandwidth. Targets (minima):
        `copy=True` at least as fast as `a.copy()`, `out=` at least 0.8 of `np.copyto`
        from 256 MiB up. `a.copy()` and `t.clone()` are what NumPy and
        torch charge for a copy into *fresh* memory (allocated per call and freed before
        the next, so every call pays its page faults, as a user's call does): *vs
        a.copy()* = `a.copy()` time / row time (minima) is the like-for-like comparison
        for `copy=True`; the `out=` rows write a preallocated, already-touched buffer, like
        `np.copyto`. `tb.to_numpy(t, out=dst)` reads the tensor's memory, in 4 KiB pages
        (torch's allocator), where `np.copyto(dst, a)` reads NumPy's, in transparent huge
        pages (NumPy asks for them from 4 MiB up): the same memcpy is slower from `t`
        whoever runs it. So its target is set against `np.copyto` from the tensor's memory
        (*the tensor's memory* row, timed as a pair with it, each following the other;
        that pair's ratio, minima / medians, in brackets); its *vs copyto* column still
        shows the ratio to `np.copyto(dst, a)`."""
    )
    rows = []
    for nbytes in sizes_bytes:
        for dt in (torch.float32, torch.bfloat16):
            n = nbytes // torch.tensor([], dtype=dt).element_size()
            t = torch.randn(n).to(dt)
            a = tb.to_numpy(t).copy()
            dst = np.empty_like(a)
            dst.view(np.uint8).fill(0)  # touch every page: a preallocated buffer in use
            dst_t = torch.zeros(n, dtype=dt)
            st = ctx.measure(_copy_cases(t, a, dst, dst_t), repeats=ctx.pick(11, 3, 3))
            pair = _out_pair(ctx, t, dst)
            st[OUT_BASE] = pair[OUT_BASE]
            base = st["`np.copyto(dst, a)` (prealloc)"]
            fresh = st["`a.copy()` (fresh)"]
            for name, s in st.items():
                frac = speedup(base, s)
                target = result = ""
                label = f"copies: {name} {fmt_bytes(nbytes)} {str(dt)[6:]}"
                if name.startswith("`tb.") and "copy=True" in name:
                    target = ">= 1.0 vs a.copy()"
                    result = ctx.check(sec, label, speedup(fresh, s)[0] >= 1.0)
                elif name == OUT_ROW and nbytes >= 256 << 20:
                    same = speedup(pair[OUT_BASE], pair[OUT_ROW])
                    target = ">= 0.8 vs copyto of the tensor's memory"
                    result = ctx.check(sec, label, same[0] >= 0.8)
                    result += f" ({same[0]:.2f} / {same[1]:.2f})"
                elif name.startswith("`tb.") and nbytes >= 256 << 20:
                    target = ">= 0.8 vs copyto"
                    result = ctx.check(sec, label, frac[0] >= 0.8)
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
            del t, a, dst, dst_t
            gc.collect()
    sec.table(
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
