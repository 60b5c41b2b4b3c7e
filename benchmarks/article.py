"""Section 1: a widely copied guide's table, reproduced and checked.

The guide (the project's seed article, ``shared/seeds/000_*.txt``, §4.2) times four ways
of handing a 1000x1000 bfloat16 tensor to NumPy "on an RTX 3090" (the calls are CPU
calls) and reports
1.2 / 1.3 / 0.8 / 1.5 ms and 3.81 / 3.81 / 1.91 / 1.91 MB (its "MB" are MiB: 10^6
elements x 4 or 2 bytes). The same calls run here next to ``tb.to_numpy``, with the
target of issue 2: at least 10x faster than ``t.float().numpy()`` with at most half its
memory. The claims the article makes about them are checked against what was measured.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import torch

import tensorbridge as tb

from .core import MIB, Context, Section, fmt_bytes, fmt_pair, fmt_ratio, fmt_time, speedup

TITLE = "A widely copied guide's figures, checked: a 1000x1000 bfloat16 tensor to NumPy"

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOAT = "`t.float().numpy()`"
VIEW = "`t.view(torch.uint16).numpy()`"
STRUCT = "`t.view(torch.uint16).numpy().view([('bf16', np.uint16)])`"
HAND = "`t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)`"
TB = "`tb.to_numpy(t)`"
TB_F32 = "`tb.to_numpy(t, dtype=np.float32)`"
DIRECT = "`t.numpy()`"

# The article's own figures: (ms, "MB"), keyed by the call it describes.
ARTICLE = {
    DIRECT: (1.2, 3.81),  # "直接.numpy()" ("direct"), claimed to upcast to float32
    FLOAT: (1.3, 3.81),  # "显式.float().numpy()" ("explicit")
    VIEW: (0.8, 1.91),  # "内存视图法" ("memory view", §3.1)
    STRUCT: (1.5, 1.91),  # "自定义dtype" ("custom dtype", §3.2)
}


def _candidates(t: torch.Tensor) -> dict[str, Callable[[], Any]]:
    structured = np.dtype([("bf16", np.uint16)])
    return {
        # Upcast to float32: a new 4-byte-per-element tensor, then a view of it.
        FLOAT: lambda: t.float().numpy(),
        # The article's "memory view" (§3.1): the bits, but typed as integers.
        VIEW: lambda: t.view(torch.uint16).numpy(),
        # The article's "custom dtype" (§3.2): the bits in a structured dtype (no arithmetic).
        STRUCT: lambda: t.view(torch.uint16).numpy().view(structured),
        # The hand-written bit-cast that tb's fast path performs (the floor for tb).
        HAND: lambda: t.view(torch.int16).numpy().view(BF16),
        TB: lambda: tb.to_numpy(t),
        # For reference: tb's float32 cast (section 3 measures casts across sizes).
        TB_F32: lambda: tb.to_numpy(t, dtype=np.float32),
    }


def run(ctx: Context, sec: Section) -> None:
    sec.intro(
        """A widely copied guide to moving bfloat16 tensors to NumPy times four ways of
        doing it for a 1000x1000 tensor; its figures (in the *guide says* column) are
        checked here against the same calls and `tb.to_numpy`. Time is min / median per
        call. *Memory* is the result's size in MiB (the unit the guide calls MB), and in
        brackets what the call allocates (0 B when the result shares the tensor's memory).
        Speedup = time of `t.float().numpy()` / time of the row (minima / medians). Goal
        for `tb.to_numpy(t)`: at least 10x faster than `t.float().numpy()` (minima) with at
        most half its memory."""
    )
    t = torch.randn(1000, 1000).to(torch.bfloat16)
    candidates = _candidates(t)
    stats = ctx.measure(candidates, repeats=ctx.pick(21, 7, 3))
    base = stats[FLOAT]
    base_bytes = candidates[FLOAT]().nbytes
    source = t.view(torch.int16).numpy()

    try:
        t.numpy()
        direct = "returns (unexpected)"
        raised = False
    except (TypeError, RuntimeError) as e:
        direct = f"raises {type(e).__name__}: {str(e).splitlines()[0]}"
        raised = True

    def article(name: str) -> str:
        ms, mb = ARTICLE.get(name, (None, None))
        return "—" if ms is None else f"{ms} ms, {mb} MB"

    rows: list[list[Any]] = [[DIRECT, article(DIRECT), direct, "—", "—", "—"]]
    measured: dict[str, tuple[float, int, int, str]] = {}
    verdict = ""
    for name, st in stats.items():
        out = candidates[name]()
        new = 0 if np.shares_memory(out, source) else out.nbytes
        measured[name] = (st.min, out.nbytes, new, str(out.dtype))
        sp = speedup(base, st)
        if name == TB:
            verdict = ctx.check(
                sec,
                "a bf16 tensor to NumPy: tb.to_numpy(t) >= 10x faster than .float().numpy(), "
                "<= 1/2 its memory",
                sp[0] >= 10 and new <= base_bytes / 2,
            )
            ctx.highlight(
                f"**A bfloat16 tensor to NumPy** (1000x1000): `tb.to_numpy(t)` is "
                f"{sp[0]:.0f}x faster than `t.float().numpy()` and allocates nothing (a "
                f"bfloat16 view, {out.nbytes / MIB:.2f} MiB, where `.float()` makes "
                f"{base_bytes / MIB:.2f} MiB)."
            )
        rows.append(
            [
                name,
                article(name),
                fmt_pair(st),
                f"{out.nbytes / MIB:.2f} MiB ({fmt_bytes(new)})",
                str(out.dtype),
                fmt_ratio(sp, 1),
            ]
        )
    sec.table(
        ["call", "guide says", "measured: min / median", "memory (new)", "dtype", "speedup"],
        rows,
    )
    sec.text(f"Goal for `tb.to_numpy(t)` (10x faster, half the memory): {verdict}.")
    sec.text("**The guide's claims, checked against the measurements above:**")
    sec.table(["the guide says", "measured here", "holds?"], _claims(raised, direct, measured))


def _claims(
    raised: bool, direct: str, m: dict[str, tuple[float, int, int, str]]
) -> list[list[str]]:
    f_time, f_bytes, _, _ = m[FLOAT]
    v_time, v_bytes, v_new, v_dtype = m[VIEW]
    s_time, _, s_new, _ = m[STRUCT]
    tb_time, tb_bytes, tb_new, tb_dtype = m[TB]

    def yes(ok: bool) -> str:
        return "yes" if ok else "**no**"

    return [
        [
            "direct `t.numpy()` upcasts bfloat16 to float32 (1.2 ms, 3.81 MB)",
            direct,
            yes(not raised),
        ],
        [
            "`.float().numpy()` gives float32 at 3.81 MB (1.3 ms)",
            f"float32, {f_bytes / MIB:.2f} MiB, {fmt_time(f_time)}",
            yes(abs(f_bytes / MIB - 3.81) < 0.01),
        ],
        [
            "the memory view keeps 1.91 MB and is the fastest method (0.8 ms)",
            f"{v_bytes / MIB:.2f} MiB, but 0 B new: a view, {fmt_time(v_time)} "
            f"({f_time / v_time:.0f}x faster than `.float()`, not 1.6x); "
            f"its dtype is {v_dtype}, so NumPy does integer arithmetic on it",
            yes(v_new == 0 and v_time < f_time) + " (faster by far than stated)",
        ],
        [
            "the custom (structured) dtype costs 1.5 ms, more than `.float().numpy()`",
            f"{fmt_time(s_time)}, 0 B new (also a view); "
            f"{f_time / s_time:.0f}x faster than `.float().numpy()`",
            yes(s_new > 0 or s_time > f_time),
        ],
        [
            "the memory view is the best choice for most uses",
            f"`tb.to_numpy(t)` costs the same kind of view ({fmt_time(tb_time)}, "
            f"{tb_bytes / MIB:.2f} MiB, {fmt_bytes(tb_new)} new) and its dtype is "
            f"{tb_dtype}: values, not bit patterns",
            "partly: it is zero-copy, but its values are bit patterns"
            if v_new == 0 and v_dtype != tb_dtype
            else yes(v_time <= tb_time),
        ],
    ]
