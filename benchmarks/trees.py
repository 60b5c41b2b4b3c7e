"""Section 7: ``tree_to_numpy`` / ``tree_to_torch`` over 1,000 small CPU tensors.

Issue 3's target: per-leaf cost within 2x of a bare ``[t.detach().numpy() for t in ...]``
loop; the tree call pays for flattening and rebuilding the dict, the bare loop does not.
Every result is checked bit for bit against its baseline before it is timed. The helpers
for row building and bit checks are shared with the whole-model and CUDA sections.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

import tensorbridge as tb
from tensorbridge.tree import tree_to_numpy, tree_to_torch

from .core import Context, Section, Stats, fmt_pair, fmt_time

TITLE = "Trees of many small tensors"

HEADERS = [
    "case",
    "baseline (min / median)",
    "tensorbridge (min / median)",
    "ratio (min / median)",
    "per leaf",
    "target",
    "verdict",
]


def same_bits(a: Any, b: Any) -> bool:
    def raw(x: Any) -> bytes:
        if isinstance(x, torch.Tensor):
            x = tb.to_numpy(x.cpu())
        return bytes(np.ascontiguousarray(x).view(np.uint8))

    return bool(a.dtype == b.dtype and a.shape == b.shape and raw(a) == raw(b))


def require_same(got: Mapping[str, Any], want: Mapping[str, Any], what: str) -> None:
    """A benchmark of a wrong result is worthless: stop with a clear error instead."""
    if list(got) != list(want) or not all(same_bits(got[k], want[k]) for k in want):
        raise RuntimeError(f"{what}: the result differs from its baseline")


def row(
    ctx: Context,
    sec: Section,
    name: str,
    base: Stats,
    ours: Stats,
    target: float | None,
    leaves: int = 0,
) -> list[Any]:
    """A table row: times, ratio of ours to the baseline (min / median), verdict."""
    ratio = ours.min / base.min
    per_leaf = f"{fmt_time(abs(ours.min - base.min) / leaves)} " if leaves else ""
    if per_leaf:
        per_leaf += "extra" if ours.min >= base.min else "less"
    verdict = "" if target is None else ctx.check(sec, name, ratio <= target)
    goal = "" if target is None else f"≤ {target:g}x"
    return [
        name,
        fmt_pair(base),
        fmt_pair(ours),
        f"{ratio:.2f}x / {ours.median / base.median:.2f}x",
        per_leaf,
        goal,
        verdict,
    ]


def run(ctx: Context, sec: Section) -> None:
    sec.intro(
        """A flat dict of 1,000 float32 4x4 tensors (a state dict of small layers) and the
        same as arrays for the way back. Ratio = tensorbridge time / baseline time (< 1:
        tensorbridge is faster); goal <= 2x on the minima."""
    )
    sd = {f"layers.{i}.weight": torch.randn(4, 4) for i in range(1000)}
    tensors = list(sd.values())
    arrays = {k: v.numpy() for k, v in sd.items()}
    array_list = list(arrays.values())
    require_same(tree_to_numpy(sd), arrays, "tree_to_numpy")
    require_same(tree_to_torch(arrays), sd, "tree_to_torch")
    st = ctx.measure(
        {
            "bare": lambda: [t.detach().numpy() for t in tensors],
            "tree": lambda: tree_to_numpy(sd),
            "bare back": lambda: [torch.from_numpy(a) for a in array_list],
            "tree back": lambda: tree_to_torch(arrays),
        },
        repeats=ctx.pick(30, 5, 3),
        sample_s=5e-3,
    )
    sec.table(
        HEADERS,
        [
            row(
                ctx,
                sec,
                "tree_to_numpy(sd) vs [t.detach().numpy() ...]",
                st["bare"],
                st["tree"],
                2.0,
                1000,
            ),
            row(
                ctx,
                sec,
                "tree_to_torch(arrays) vs [torch.from_numpy(a) ...]",
                st["bare back"],
                st["tree back"],
                None,
                1000,
            ),
        ],
    )
