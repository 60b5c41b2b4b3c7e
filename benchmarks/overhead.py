"""Section 6: per-call overhead on 1,000 elements, every dtype of the table torch has.

The target: ``tb.to_numpy`` / ``tb.to_torch`` within 2x (3x for ml_dtypes) of the bare
``t.numpy()`` / ``torch.from_numpy(a)`` for every dtype, bf16 included (a lean fast
path: one table lookup, no repeated checks). For dtypes NumPy and torch cannot exchange
by themselves (the ml_dtypes rows) the bare baseline is the float32 one, and the
hand-written bit-cast ``t.view(carrier).numpy().view(ml_dtype)`` is shown as the floor.
torch's sub-byte integers (int4 and its kin, one value a byte) are timed against the
same bytes as int8: ``t.view(torch.int8).numpy()`` / ``torch.from_numpy(a.view(np.int8))``.
The NumPy-only rows (float8_e4m3, ...) have no tensor to time.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import tensorbridge as tb

from .core import Context, Section, fmt_pair, fmt_ratio, speedup

TITLE = "Per-call overhead, 1,000 elements, every dtype"


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
    if not row.kernels:  # the same bytes as int8, viewed by hand in the call
        cases["bare_np"] = lambda: t.view(torch.int8).numpy()
        cases["bare_t"] = lambda: torch.from_numpy(a.view(np.int8))
    return cases


def run(ctx: Context, sec: Section) -> None:
    sec.intro(
        """Min / median time per call (calls looped into ~2 ms samples). The bare baseline
        is the same dtype's `t.numpy()` / `torch.from_numpy(a)`; for dtypes NumPy and torch
        cannot exchange by themselves (the ml_dtypes rows) it is the float32 one (marked
        f32). *hand* is the hand-written bit-cast `t.view(carrier).numpy().view(ml_dtype)`,
        the floor for those rows. torch's sub-byte integers (int4 and its kin: one value a
        byte, no torch kernels) are timed against the same bytes as int8 (marked int8),
        `t.view(torch.int8).numpy()` / `torch.from_numpy(a.view(np.int8))`. Ratio = tb time
        / bare time, from the minima / from the medians; goal (minima, both directions)
        <= 2x for dtypes both sides hold natively, <= 3x for the ml_dtypes rows (bfloat16,
        float8, complex32, the sub-byte integers)."""
    )
    n = 1000
    repeats = ctx.pick(15, 5, 3)
    f32_t = torch.zeros(n, dtype=torch.float32)
    f32_a = np.zeros(n, np.float32)
    rows = []
    for row in (r for r in tb.dtype_table() if r.in_torch):
        with warnings.catch_warnings():
            # torch warns whenever it allocates a complex32 (ComplexHalf) tensor
            warnings.filterwarnings("ignore", "ComplexHalf support is experimental")
            # Zero bytes are a valid value of every dtype in the table.
            t = torch.zeros(n * row.itemsize, dtype=torch.uint8).view(row.torch)
            a = np.zeros(n * row.itemsize, np.uint8).view(row.numpy)
            native = row.carrier is None
            bare_t, bare_a = (t, a) if native else (f32_t, f32_a)
            st = ctx.measure(_overhead_cases(row, t, a, bare_t, bare_a), repeats=repeats)
        r_np = speedup(st["tb_np"], st["bare_np"])  # tb time / bare time
        r_t = speedup(st["tb_t"], st["bare_t"])
        goal = 2 if row.carrier is None else 3
        ok = ctx.check(sec, f"overhead {row.name}", r_np[0] <= goal and r_t[0] <= goal)
        rows.append(
            [
                row.name,
                "same" if native else ("f32" if row.kernels else "int8"),
                fmt_pair(st["bare_np"]),
                fmt_pair(st["hand"]) if "hand" in st else "—",
                fmt_pair(st["tb_np"]),
                fmt_ratio(r_np),
                fmt_pair(st["bare_t"]),
                fmt_pair(st["tb_t"]),
                fmt_ratio(r_t),
                f"<= {goal}x",
                ok,
            ]
        )
    sec.table(
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
