"""Section 12: batched device transfers of whole trees, when a CUDA device is present.

Device -> host: ``tree_to_numpy`` stages every tensor into one pinned buffer with
non-blocking copies and waits once, against the per-tensor loop that waits once per
tensor; host -> device: ``tree_to_torch(device="cuda")`` against a ``.cuda()`` loop.
Every result is checked bit for bit against its loop before it is timed. Without a
GPU the section says so and measures nothing.
"""

from __future__ import annotations

from typing import Any

import torch

import tensorbridge as tb
from tensorbridge.tree import tree_to_numpy, tree_to_torch

from .core import Context, Section
from .models import build
from .trees import HEADERS, require_same, row

TITLE = "Device transfers of whole trees (CUDA)"


def _rows(
    ctx: Context, sec: Section, label: str, sd: dict[str, torch.Tensor], repeats: int
) -> list[list[Any]]:
    """Check, then time, one device tree both ways against the per-tensor loops."""
    want = {k: tb.to_numpy(v.cpu()) for k, v in sd.items()}
    require_same(tree_to_numpy(sd), want, label)
    wide = {k: v.float().cpu().numpy() for k, v in sd.items()}
    require_same(tree_to_numpy(sd, float_dtype="float32"), wide, label)
    host = {k: tb.to_numpy(v.cpu()) for k, v in sd.items()}

    def h2d() -> Any:
        out = tree_to_torch(host, device="cuda")
        torch.cuda.synchronize()
        return out

    def h2d_loop() -> Any:
        out = {k: tb.to_torch(v).cuda() for k, v in host.items()}
        torch.cuda.synchronize()
        return out

    require_same(h2d(), sd, label)
    st = ctx.measure(
        {
            "d2h loop": lambda: {k: tb.to_numpy(v) for k, v in sd.items()},
            "d2h tree": lambda: tree_to_numpy(sd),
            "f32 loop": lambda: {k: v.float().cpu().numpy() for k, v in sd.items()},
            "f32 tree": lambda: tree_to_numpy(sd, float_dtype="float32"),
            "h2d loop": h2d_loop,
            "h2d tree": h2d,
        },
        repeats=repeats,
        sample_s=5e-3,
    )
    return [
        row(
            ctx,
            sec,
            f"{label}: tree_to_numpy vs {{k: tb.to_numpy(v)}} (.cpu() each)",
            st["d2h loop"],
            st["d2h tree"],
            1.0,
        ),
        row(
            ctx,
            sec,
            f"{label}: float_dtype=f32 vs {{k: v.float().cpu().numpy()}}",
            st["f32 loop"],
            st["f32 tree"],
            None,
        ),
        row(
            ctx,
            sec,
            f"{label}: tree_to_torch(device='cuda') vs .cuda() loop",
            st["h2d loop"],
            st["h2d tree"],
            None,
        ),
    ]


def run(ctx: Context, sec: Section) -> None:
    if not torch.cuda.is_available():
        sec.skipped = "no CUDA device (`torch.cuda.is_available()` is False)"
        return
    sec.intro(
        f"""On {torch.cuda.get_device_name()}. Device -> host: one pinned buffer,
        non-blocking copies and one wait, against a per-tensor loop that waits once per
        tensor. Ratio = tensorbridge time / loop time (target <= 1x for the plain
        transfer)."""
    )
    repeats = ctx.pick(10, 3, 3)
    small = {f"layers.{i}.weight": torch.randn(64, 64, device="cuda") for i in range(1000)}
    model = {k: v.cuda() for k, v in build("transformer", ctx.mode).items()}
    rows = _rows(ctx, sec, "1,000 fp32 64x64", small, repeats)
    rows += _rows(ctx, sec, "bf16 transformer", model, repeats)
    sec.table(HEADERS, rows)
    sec.text("Every result above was checked bit for bit against the per-tensor loop.")
