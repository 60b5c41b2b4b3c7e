"""Section: ``tb.compare`` and ``tb.stats`` against the torch reductions people write by hand.

The hand-written baselines compute fewer quantities: a max absolute and relative error
(``d = (a - b).abs(); d.max(); (d / a.abs()).max()``) and the min/max/mean/std and NaN/inf
counts of a tensor, each over the whole tensor at once. ``tb.compare`` adds the ULP
distance and where it peaks, NaN/inf mismatches and the tolerance count; ``tb.stats``
accumulates in float64. Target: tensorbridge at least 0.5x the hand-written speed (a
ratio of hand time / tensorbridge time >= 0.5), with memory bounded by its chunk rather
than by the tensor: the memory rows run each call in a fresh child process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import tensorbridge as tb

from .child import Task
from .core import MIB, Context, Section, fmt_count, fmt_mib, fmt_pair, fmt_ratio, speedup

TITLE = "Comparing and summarising tensors: tb.compare and tb.stats vs hand-written torch"

_HAND = {
    "compare": "d = (a - b).abs(); d.max(); (d / a.abs()).max()",
    "stats": "a.min(), a.max(), a.mean(), a.std(), a.isnan().sum(), a.isinf().sum()",
}


def _hand_compare(a: torch.Tensor, b: torch.Tensor) -> Any:
    if a.dtype is not torch.float32:
        a, b = a.float(), b.float()
    d = (a - b).abs()
    return d.max(), (d / a.abs()).max()


def _hand_stats(a: torch.Tensor) -> Any:
    if a.dtype is not torch.float32:
        a = a.float()
    return a.min(), a.max(), a.mean(), a.std(), a.isnan().sum(), a.isinf().sum()


# --- what the child processes run (one float32 call each, for its memory) -----------------------


def pair(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, generator=g)
    return a, a + torch.randn(n, generator=g) * 1e-2


def tb_compare(ab: tuple[torch.Tensor, torch.Tensor]) -> None:
    tb.compare(*ab)


def hand_compare(ab: tuple[torch.Tensor, torch.Tensor]) -> None:
    _hand_compare(*ab)


def tb_stats(ab: tuple[torch.Tensor, torch.Tensor]) -> None:
    tb.stats(ab[0])


def hand_stats(ab: tuple[torch.Tensor, torch.Tensor]) -> None:
    _hand_stats(ab[0])


def _cases(a: torch.Tensor, b: torch.Tensor) -> dict[str, dict[str, Callable[[], Any]]]:
    return {
        "compare": {"tb": lambda: tb.compare(a, b), "hand": lambda: _hand_compare(a, b)},
        "stats": {"tb": lambda: tb.stats(a), "hand": lambda: _hand_stats(a)},
    }


def run(ctx: Context, sec: Section) -> None:
    n = ctx.pick(1 << 26, 1 << 22, 1 << 16)
    repeats = ctx.pick(5, 3, 1)
    sec.intro(
        f"""{fmt_count(n)} elements, ``b = a + noise`` (every element differs, so no
        shortcut for equal bytes applies). Min / median of {repeats} interleaved runs in
        one process. Ratio = hand-written time / tensorbridge time, from the minima / from
        the medians (> 1: tensorbridge is faster); target >= 0.5 (minima). The hand-written
        calls: compare `{_HAND["compare"]}`, stats `{_HAND["stats"]}` (in float32; bfloat16
        is widened with `.float()` first, as one has to)."""
    )
    gen = torch.Generator().manual_seed(0)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        a32 = torch.randn(n, generator=gen)
        a = a32.to(dtype)
        b = (a32 + torch.randn(n, generator=gen) * 1e-2).to(dtype)
        del a32
        name = str(dtype).removeprefix("torch.")
        for what, cases in _cases(a, b).items():
            st = ctx.measure(cases, repeats=repeats)
            ratio = speedup(st["hand"], st["tb"])
            ok = ctx.check(sec, f"tb.{what} {name} >= 0.5x hand-written", ratio[0] >= 0.5)
            if dtype is torch.bfloat16 and what == "compare":
                ctx.highlight(
                    f"**Comparing two bfloat16 tensors** ({fmt_count(n)} elements): "
                    f"`tb.compare` (errors, ULPs, NaN/inf, a verdict) runs at {ratio[0]:.2f}x "
                    "the speed of a hand-written max-abs/rel-error reduction, in chunks."
                )
            times = [fmt_pair(st["hand"]), fmt_pair(st["tb"]), fmt_ratio(ratio)]
            rows.append([f"`tb.{what}`", name, *times, ">= 0.5", ok])
        del a, b
    sec.table(["call", "dtype", "hand-written", "tensorbridge", "ratio", "target", "result"], rows)

    # memory: one call each in a fresh child, float32
    runs = ctx.rounds(
        {
            "tb.compare": Task(pair, tb_compare, (n,)),
            "hand compare": Task(pair, hand_compare, (n,)),
            "tb.stats": Task(pair, tb_stats, (n,)),
            "hand stats": Task(pair, hand_stats, (n,)),
        },
        1,
    )
    grow = {k: min(r.anon_growth for r in v) for k, v in runs.items()}
    limit = 256 * MIB
    mem_rows = []
    for what in ("compare", "stats"):
        ours = grow[f"tb.{what}"]
        mem_rows.append(
            [
                f"`tb.{what}`",
                fmt_mib(grow[f"hand {what}"]),
                fmt_mib(ours),
                f"<= {fmt_mib(limit)}",
                ctx.check(sec, f"tb.{what} memory growth <= 256 MiB", ours <= limit),
            ]
        )
    sec.text(
        f"""Anonymous-memory growth during one call on {fmt_count(n)} float32 elements
        ({fmt_mib(4 * n)} a tensor): tensorbridge works through 1M-element chunks, so its
        growth stays flat as the tensor grows; the hand-written calls allocate whole-tensor
        temporaries."""
    )
    sec.table(["call", "hand-written", "tensorbridge", "target", "result"], mem_rows)
