"""Section: ``tb.compare``, ``tb.stats`` and ``tb.cast_report`` against what people write by hand.

The hand-written baselines of the large tensors compute fewer quantities: a max absolute
and relative error (``d = (a - b.float()).abs(); d.max(); (d / a.abs()).max()``) and the
min/max/mean/std and NaN/inf counts of a tensor, each over the whole tensor at once.
``tb.compare`` adds the ULP distance and where it peaks, NaN/inf mismatches and the
tolerance count; ``tb.stats`` accumulates in float64. Pairs of one dtype and pairs across
dtypes (float32 against its bfloat16, float16 and float8 copies) are measured. Target:
tensorbridge at least 0.5x the hand-written speed (a ratio of hand time / tensorbridge time
>= 0.5), with memory bounded by its chunk rather than by the tensor: the memory rows run
each call in a fresh child process.

Many small tensors: ``tb.compare`` of a checkpoint-like tree and ``tb.cast_report`` of each
tensor, against a hand-written per-tensor loop computing the same figures (target: at most
2x its time). And ``tb.cast_report`` against the bare cast it reports on (target: at most
10x its time, from 1M elements up).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch

import tensorbridge as tb

from .child import Task
from .core import MIB, Context, Section, fmt_count, fmt_mib, fmt_pair, fmt_ratio, speedup

TITLE = "Comparing and summarising tensors: tb.compare and tb.stats vs hand-written torch"

_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32}

_HAND = {
    "compare": "d = (a - b.float()).abs(); d.max(); (d / a.abs()).max()",
    "stats": "a.min(), a.max(), a.mean(), a.std(), a.isnan().sum(), a.isinf().sum()",
}


def _hand_compare(a: torch.Tensor, b: torch.Tensor) -> Any:
    if a.dtype is not torch.float32:
        a = a.float()
    d = (a - b.float()).abs()
    return d.max(), (d / a.abs()).max()


def _ordinals(q: torch.Tensor) -> torch.Tensor:
    """Positions on the integer line of a float type (sign-magnitude to signed), in int64."""
    x = q.view(_BITS[q.element_size()]).long()
    mag = x & ((1 << (8 * q.element_size() - 1)) - 1)
    return torch.where(x < 0, -mag, mag)


def _hand_compare_all(a: torch.Tensor, b: torch.Tensor) -> Any:
    """What tb.compare reports of float32 ``a`` and its narrower copy ``b``, by hand."""
    bf = b.float()
    d = (a - bf).abs()
    ulps = (_ordinals(a.to(b.dtype)) - _ordinals(b)).abs()
    nan = a.isnan().sum() + bf.isnan().sum()
    inf = a.isinf().sum() + bf.isinf().sum()
    bad = (d > 1e-5 + 1.6e-2 * a.abs()).sum()
    return d.max(), (d / a.abs()).max(), ulps.max(), ulps.argmax(), nan, inf, bad


def _hand_cast_report(t: torch.Tensor, dtype: torch.dtype, smallest_normal: float) -> Any:
    """What tb.cast_report reports of a cast, by hand."""
    r = t.to(dtype).float()
    err = (r - t).abs()
    rel = err / t.abs()
    mag = r.abs()
    return (
        (err == 0).sum(),
        err.max(),
        rel.nan_to_num(0.0).max(),
        rel.nan_to_num(0.0).mean(),
        r.isinf().sum(),
        r.isnan().sum(),
        ((r == 0) & (t != 0)).sum(),
        ((mag < smallest_normal) & (r != 0)).sum(),
    )


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


_PAIRS = (
    (torch.float32, torch.float32),
    (torch.bfloat16, torch.bfloat16),
    (torch.float32, torch.bfloat16),
    (torch.float32, torch.float16),
    (torch.float32, torch.float8_e4m3fn),
)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def run(ctx: Context, sec: Section) -> None:
    sizes = ctx.pick((1 << 24, 1 << 26), (1 << 22,), (1 << 16,))
    n = sizes[-1]
    repeats = ctx.pick(5, 3, 1)
    sec.intro(
        f"""{" and ".join(fmt_count(k) for k in sizes)} elements. Same-dtype pairs:
        ``b = a + noise`` (every element differs, so no shortcut for equal bytes applies);
        across dtypes: ``b = a.to(dtype)``, the check after a cast. Min / median of
        {repeats} interleaved runs in one process. Ratio = hand-written time / tensorbridge
        time, from the minima / from the medians (> 1: tensorbridge is faster); target >= 0.5
        (minima). The hand-written calls: compare `{_HAND["compare"]}`, stats
        `{_HAND["stats"]}` (in float32; narrower types are widened with `.float()` first, as
        one has to)."""
    )
    gen = torch.Generator().manual_seed(0)
    rows = []
    for size in sizes:
        a32 = torch.randn(size, generator=gen)
        noisy = a32 + torch.randn(size, generator=gen) * 1e-2
        for da, db in _PAIRS:
            a = a32.to(da)
            b = noisy.to(db) if da is db else a32.to(db)
            name = _name(da) if da is db else f"{_name(da)} vs {_name(db)}"
            cases = dict(_cases(a, b))
            if size != n or da is not db:
                del cases["stats"]  # stats: one row per dtype, at the largest size
            for what, fns in cases.items():
                st = ctx.measure(fns, repeats=repeats)
                ratio = speedup(st["hand"], st["tb"])
                label = f"tb.{what} {name} {fmt_count(size)}"
                ok = ctx.check(sec, f"{label} >= 0.5x hand-written", ratio[0] >= 0.5)
                if da is torch.float32 and db is torch.bfloat16 and size == n:
                    ctx.highlight(
                        f"**Checking a bfloat16 copy against its float32 original** "
                        f"({fmt_count(n)} elements): `tb.compare` (errors, ULPs, NaN/inf, a "
                        f"verdict) runs at {ratio[0]:.2f}x the speed of a hand-written "
                        "max-abs/rel-error reduction, in chunks."
                    )
                times = [fmt_pair(st["hand"]), fmt_pair(st["tb"]), fmt_ratio(ratio)]
                rows.append([f"`tb.{what}`", name, fmt_count(size), *times, ">= 0.5", ok])
            del a, b
        del a32, noisy
    sec.table(
        ["call", "dtypes", "elements", "hand-written", "tensorbridge", "ratio", "target", "result"],
        rows,
    )
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
    _many_small(ctx, sec)
    _cast_report_rows(ctx, sec)


def _many_small(ctx: Context, sec: Section) -> None:
    count = ctx.pick(12_000, 3_000, 200)
    repeats = ctx.pick(3, 3, 1)
    gen = torch.Generator().manual_seed(1)
    sizes = torch.randint(64, 4097, (count,), generator=gen).tolist()
    a = {f"layers.{i}.weight": torch.randn(k, generator=gen) for i, k in enumerate(sizes)}
    b = {k: v.to(torch.bfloat16) for k, v in a.items()}
    normal = float(torch.finfo(torch.bfloat16).smallest_normal)
    cases: dict[str, dict[str, Callable[[], Any]]] = {
        "compare": {
            "tb": lambda: tb.compare(a, b),
            "hand": lambda: [_hand_compare_all(a[k], b[k]) for k in a],
        },
        "cast_report": {
            "tb": lambda: [tb.cast_report(t, torch.bfloat16) for t in a.values()],
            "hand": lambda: [_hand_cast_report(t, torch.bfloat16, normal) for t in a.values()],
        },
    }
    rows = []
    for what, fns in cases.items():
        st = ctx.measure(fns, repeats=repeats)
        ratio = speedup(st["hand"], st["tb"])
        ok = ctx.check(sec, f"tb.{what} of {count:,} small tensors <= 2x a loop", ratio[0] >= 0.5)
        times = [fmt_pair(st["hand"]), fmt_pair(st["tb"]), fmt_ratio(ratio)]
        rows.append([f"`tb.{what}`", *times, ">= 0.5", ok])
    sec.text(
        f"""Many small tensors: {count:,} float32 tensors of 64 to 4,096 elements
        ({fmt_count(sum(sizes))} in all) and their bfloat16 copies. `tb.compare` of the two
        dicts and `tb.cast_report(t, torch.bfloat16)` of each tensor, against a
        hand-written per-tensor loop computing the same figures (compare: max abs and rel
        error, the ULP distance in bfloat16 and where it peaks, NaN/inf counts, the
        tolerance count; cast report: exact values, max abs, max and mean rel error,
        inf/NaN made, flushed and subnormal results). Ratio = loop time / tensorbridge
        time (minima / medians); target >= 0.5, tensorbridge at most 2x the loop."""
    )
    sec.table(["call", "hand-written loop", "tensorbridge", "ratio", "target", "result"], rows)


def _cast_report_rows(ctx: Context, sec: Section) -> None:
    sizes = ctx.pick((1 << 20, 1 << 22, 1 << 24), (1 << 20, 1 << 22), (1 << 16,))
    repeats = ctx.pick(5, 3, 1)
    gen = torch.Generator().manual_seed(2)
    rows = []
    for size in sizes:
        x = torch.randn(size, generator=gen)
        for dtype in (torch.bfloat16, torch.float8_e4m3fn):
            fns: dict[str, Callable[[], Any]] = {
                "cast": partial(x.to, dtype),
                "tb": partial(tb.cast_report, x, dtype),
            }
            st = ctx.measure(fns, repeats=repeats)
            slower = (st["tb"].min / st["cast"].min, st["tb"].median / st["cast"].median)
            label = f"tb.cast_report {_name(dtype)} {fmt_count(size)} <= 10x the cast"
            ok = ctx.check(sec, label, slower[0] <= 10)
            times = [fmt_pair(st["cast"]), fmt_pair(st["tb"]), fmt_ratio(slower, 1)]
            rows.append([_name(dtype), fmt_count(size), *times, "<= 10", ok])
        del x
    sec.text(
        """`tb.cast_report(x, dtype)` (overflow, saturation, flushes, NaNs, ULP histogram,
        relative errors, and NumPy's kernel compared where it may differ) against the bare
        cast `x.to(dtype)` it reports on, float32 `randn` sources. Slowdown = report time /
        cast time (minima / medians); target <= 10 (minima)."""
    )
    sec.table(["to", "elements", "cast", "tb.cast_report", "slowdown", "target", "result"], rows)
