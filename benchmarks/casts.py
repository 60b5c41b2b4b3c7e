"""Section 3: dtype casts between float32 and bf16 / fp16 / fp8, three ways.

For each cast: torch's kernel (``Tensor.to`` into torch's fresh memory, and ``copy_``
into a preallocated tensor, the kernel's own rate), NumPy's ``astype`` (ml_dtypes'
kernels for bfloat16 and float8, NumPy's for float16), and tensorbridge's chosen path
(``tb.to_numpy(x, dtype=...)``: NumPy allocates, torch's kernel converts). Then issue 2's
two cast targets across sizes: bf16 -> f32 at least 3x ``t.float().numpy()`` from 16M
elements up (never slower below), f32 -> bf16 at least 0.9x torch's own cast.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

import tensorbridge as tb

from . import plot
from .core import Context, Section, Stats, fmt_count, fmt_pair, fmt_ratio, speedup

TITLE = "Dtype casts: bf16 / fp16 / fp8 <-> float32"

LOW = ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")
IMPLS = {
    "torch": "torch `.to()` (fresh)",
    "into": "torch `copy_` (prealloc)",
    "astype": "`astype` (fresh)",
    "tb": "`tb.to_numpy(x, dtype=)` (fresh)",
}


def _bits(x: Any) -> np.ndarray:
    a = tb.to_numpy(x) if isinstance(x, torch.Tensor) else x
    return np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}")


def _cases(low: tb.DTypeRow, n: int, up: bool) -> dict[str, Callable[[], Any]]:
    """The four ways to cast ``n`` elements (up: low -> f32, else f32 -> low)."""
    x32 = torch.randn(n)
    if up:
        src_t = x32.to(low.torch)
        src_a = tb.to_numpy(src_t)
        dst_np: Any = np.dtype(np.float32)
        dst_t = torch.float32
    else:
        src_t, src_a = x32, x32.numpy()
        dst_np, dst_t = low.numpy, low.torch
    pre = torch.empty(n, dtype=dst_t)
    pre.view(torch.uint8).fill_(0)  # touched: the kernel's own rate, without page faults
    return {
        "torch": lambda: src_t.to(dst_t),
        "into": lambda: pre.copy_(src_t),
        "astype": lambda: src_a.astype(dst_np),
        "tb": lambda: tb.to_numpy(src_t, dtype=dst_np),
    }


def run(ctx: Context, sec: Section) -> None:
    n = ctx.pick(1 << 24, 1 << 20, 1 << 16)
    sec.intro(
        f"""{fmt_count(n)} elements of `torch.randn`, cast both ways. Throughput = elements
        x 4 bytes (the float32 side) / time, from the minimum / from the median, in GB/s.
        *fresh* results are allocated per call (and pay page faults); *prealloc* writes
        an already-touched tensor. *tb vs* = that row's time / tb's time (> 1: tb is
        faster), minima / medians. *bits = torch*: the result is bit-identical to
        torch's `.to()` (no NaN in this data)."""
    )
    rows = []
    gbps: dict[str, dict[str, float]] = {}
    for name in LOW:
        low = tb.resolve_dtype(name)
        for up in (True, False):
            label = f"{name} -> float32" if up else f"float32 -> {name}"
            cases = _cases(low, n, up)
            st = ctx.measure(cases, repeats=ctx.pick(11, 5, 3))
            ref = _bits(cases["torch"]())
            same_tb = np.array_equal(_bits(cases["tb"]()), ref)
            same_ml = np.array_equal(_bits(cases["astype"]()), ref)
            gbps[label] = {k: n * 4 / s.min / 1e9 for k, s in st.items()}
            rows.append(
                [
                    label,
                    *(_rate(n, st[k]) for k in IMPLS),
                    fmt_ratio(speedup(st["torch"], st["tb"])),
                    fmt_ratio(speedup(st["astype"], st["tb"])),
                    "yes" if same_tb else "**no**",
                    "yes" if same_ml else "no",
                ]
            )
            del cases
            gc.collect()
    sec.table(
        [
            "cast",
            *(f"{v} GB/s" for v in IMPLS.values()),
            "tb vs `.to()`",
            "tb vs `astype`",
            "tb bits = torch",
            "astype bits = torch",
        ],
        rows,
    )
    ctx.plot(sec, "casts.png", "cast throughput by implementation", _drawer(gbps))
    _every_cast(ctx, sec)


def _rate(n: int, st: Stats) -> str:
    return f"{n * 4 / st.min / 1e9:.2f} / {n * 4 / st.median / 1e9:.2f}"


def _drawer(gbps: dict[str, dict[str, float]]) -> Callable[[Any], Any]:
    def draw(plt: Any) -> Any:
        fig, axes = plot.figure(plt, width=7.5, height=5.0)
        ax = axes[0, 0]
        labels = list(gbps)
        height = 0.8 / len(IMPLS)
        for i, (key, name) in enumerate(IMPLS.items()):
            ys = [j + (i - (len(IMPLS) - 1) / 2) * height for j in range(len(labels))]
            ax.barh(ys, [gbps[lab][key] for lab in labels], height, label=name.replace("`", ""))
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("GB/s of float32 data (min time)")
        ax.grid(True, axis="x", alpha=0.3)
        ax.legend(fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
        return fig

    return draw


# --- issue 2's cast targets across sizes ------------------------------------------------------


def _cast_sizes(ctx: Context) -> Sequence[int]:
    return ctx.pick(
        [10**4, 10**5, 10**6, 2**22, 2**24, 2**26], [10**4, 10**6, 2**24], [10**4, 10**5]
    )


def _route_cases(low: tb.DTypeRow, t: torch.Tensor, up: bool) -> dict[str, Callable[[], Any]]:
    """torch's own ``.to()`` route to a NumPy array, and tensorbridge's call."""
    if up:
        return {
            "base": lambda: t.to(torch.float32).numpy(),
            "tb": lambda: tb.to_numpy(t, dtype=np.float32),
        }
    assert low.carrier is not None or low.numpy == np.float16
    if low.carrier is None:
        return {
            "base": lambda: t.to(low.torch).numpy(),
            "tb": lambda: tb.to_numpy(t, dtype=low.numpy),
        }
    carrier = low.carrier
    return {
        "base": lambda: t.to(low.torch).view(carrier).numpy(),
        "tb": lambda: tb.to_numpy(t, dtype=low.numpy),
    }


def _every_cast(ctx: Context, sec: Section) -> None:
    sec.text(
        """**Every cast above, across sizes: `tb.to_numpy(t, dtype=...)` vs torch's `.to()`
        route** (`t.to(dtype).numpy()`; for bfloat16 and float8 results, whose bytes plain
        torch can hand to NumPy only as integers, `t.to(dtype).view(carrier).numpy()`).
        Both allocate a fresh result on every call (tb: `np.empty` + torch's `copy_`
        kernel; torch: its own allocator + the same kernel). Speedup = torch's time / tb's
        time, from the minima / from the medians. Target (minima): >= 1x (never slower) at
        every size; bfloat16 -> float32 >= 3x from 16M elements (2^24) up."""
    )
    rows = []
    sizes = _cast_sizes(ctx)
    for name in LOW:
        low = tb.resolve_dtype(name)
        for up in (True, False):
            label = f"{name} -> float32" if up else f"float32 -> {name}"
            for n in sizes:
                t = torch.randn(n)
                if up:
                    t = t.to(low.torch)
                cases = _route_cases(low, t, up)
                reps = ctx.pick(21, 5, 3) if n < 2**26 else max(5, ctx.pick(21, 5, 3) // 2)
                st = ctx.measure(cases, repeats=reps)
                sp = speedup(st["base"], st["tb"])
                need = 3.0 if (up and name == "bfloat16" and n >= 2**24) else 1.0
                ok = ctx.check(sec, f"{label} cast at {fmt_count(n)}", sp[0] >= need)
                if up and name == "bfloat16" and n == max(sizes):
                    ctx.highlight(
                        f"**bfloat16 to float32** ({fmt_count(n)} elements): `tb.to_numpy(t, "
                        f"dtype=np.float32)` is {sp[0]:.1f}x as fast as `t.float().numpy()`, "
                        "bit for bit the same result."
                    )
                rows.append(
                    [
                        label,
                        fmt_count(n),
                        fmt_pair(st["base"]),
                        fmt_pair(st["tb"]),
                        fmt_ratio(sp),
                        f">= {need:g}x",
                        ok,
                    ]
                )
                del t, cases
                gc.collect()
    sec.table(
        ["cast", "elements", "torch `.to()` route", "tb", "speedup", "target", "result"], rows
    )
