"""Timings of ``tree_to_numpy`` / ``tree_to_torch`` against the loops people write by hand.

The candidates of a row are interleaved (round-robin, the order rotated each repeat)
so that a noisy, shared machine slows them alike; each cell is the minimum / median
over the repeats, and PASS / FAIL is decided on the ratio of the minima. Every result
is checked bit for bit against its baseline before it is timed.

1. ``tree_to_numpy`` over 1,000 small CPU tensors: per-leaf cost within 2x of a bare
   ``[t.detach().numpy() for t in ...]`` loop (issue 3, "Speed"); the tree call pays
   for flattening and rebuilding the dict, the bare loop does not.
2. A bf16 state dict of a real architecture (a 6-layer ``nn.TransformerEncoder``, built
   in code) to float32 with ``float_dtype=`` against ``{k: v.float().numpy()}``.
3. CUDA, when a GPU is present (a printed note otherwise): the batched device->host
   transfer (one pinned buffer, non-blocking copies, one wait) against the per-tensor
   ``.cpu()`` loop, and host->device staging against a ``.cuda()`` loop.

Run ``python benchmarks/bench_tree.py`` (about a minute) or ``--quick`` (a smoke test).
The exit status is 0 even when a target fails; the tables are the result.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

import tensorbridge as tb
from tensorbridge.tree import tree_to_numpy, tree_to_torch


class Stats:
    """Seconds per call over the repeats."""

    def __init__(self, samples: list[float]) -> None:
        self.min = min(samples)
        self.median = statistics.median(samples)


def measure(candidates: dict[str, Callable[[], Any]], repeats: int) -> dict[str, Stats]:
    """Time each candidate ``repeats`` times, interleaved, with the garbage collector off."""
    names = list(candidates)
    numbers = {}
    for name, fn in candidates.items():
        fn()  # warm-up
        t0 = time.perf_counter()
        fn()
        once = time.perf_counter() - t0
        numbers[name] = max(1, min(1000, math.ceil(5e-3 / max(once, 1e-7))))
    samples: dict[str, list[float]] = {name: [] for name in names}
    gc.collect()
    gc.disable()
    try:
        for rep in range(repeats):
            k = rep % len(names)
            for name in names[k:] + names[:k]:
                fn, number = candidates[name], numbers[name]
                t0 = time.perf_counter()
                for _ in range(number):
                    result = fn()
                elapsed = (time.perf_counter() - t0) / number
                del result
                samples[name].append(elapsed)
    finally:
        gc.enable()
    return {name: Stats(s) for name, s in samples.items()}


def fmt_time(s: float) -> str:
    if s < 1e-5:
        return f"{s * 1e6:.2f} µs"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def cell(st: Stats) -> str:
    return f"{fmt_time(st.min)} / {fmt_time(st.median)}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    print("| " + " | ".join(headers) + " |")
    print("|" + "|".join("---" for _ in headers) + "|")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
    print()


def heading(title: str, note: str) -> None:
    try:
        load = f"{os.getloadavg()[0]:.2f}"
    except (AttributeError, OSError):
        load = "?"
    print(
        f"## {title}\n\n{note.strip()} Load average at the start: {load} on "
        f"{os.cpu_count()} CPUs.\n"
    )
    sys.stdout.flush()


def same_bits(a: Any, b: Any) -> bool:
    def raw(x: Any) -> bytes:
        if isinstance(x, torch.Tensor):
            x = tb.to_numpy(x.cpu())
        return bytes(np.ascontiguousarray(x).view(np.uint8))

    return bool(a.dtype == b.dtype and a.shape == b.shape and raw(a) == raw(b))


def all_same(got: dict[str, Any], want: dict[str, Any]) -> bool:
    return list(got) == list(want) and all(same_bits(got[k], want[k]) for k in want)


def row(name: str, base: Stats, ours: Stats, target: float | None, leaves: int = 0) -> list[Any]:
    """A table row: times, ratio of ours to the baseline (min / median), verdict."""
    ratio = ours.min / base.min
    per_leaf = f"{fmt_time((ours.min - base.min) / leaves)} extra" if leaves else ""
    verdict = "" if target is None else ("PASS" if ratio <= target else "**FAIL**")
    goal = "" if target is None else f"≤ {target:g}x"
    return [
        name,
        cell(base),
        cell(ours),
        f"{ratio:.2f}x / {ours.median / base.median:.2f}x",
        per_leaf,
        goal,
        verdict,
    ]


HEADERS = [
    "case",
    "baseline (min / median)",
    "tensorbridge (min / median)",
    "ratio (min / median)",
    "per leaf",
    "target",
    "verdict",
]


# --- 1. many small tensors --------------------------------------------------------------------


def small_tensors(repeats: int) -> None:
    heading(
        "1,000 small CPU tensors",
        "A flat dict of 1,000 float32 4x4 tensors (a state "
        "dict of small layers) and the same as arrays for the way back.",
    )
    sd = {f"layers.{i}.weight": torch.randn(4, 4) for i in range(1000)}
    tensors = list(sd.values())
    arrays = {k: v.numpy() for k, v in sd.items()}
    array_list = list(arrays.values())
    assert all_same(tree_to_numpy(sd), arrays)
    assert all_same(tree_to_torch(arrays), sd)
    st = measure(
        {
            "bare": lambda: [t.detach().numpy() for t in tensors],
            "tree": lambda: tree_to_numpy(sd),
            "bare back": lambda: [torch.from_numpy(a) for a in array_list],
            "tree back": lambda: tree_to_torch(arrays),
        },
        repeats,
    )
    table(
        HEADERS,
        [
            row("tree_to_numpy(sd) vs [t.detach().numpy() ...]", st["bare"], st["tree"], 2.0, 1000),
            row(
                "tree_to_torch(arrays) vs [torch.from_numpy(a) ...]",
                st["bare back"],
                st["tree back"],
                None,
                1000,
            ),
        ],
    )


# --- 2. a real architecture in bf16 -----------------------------------------------------------


def transformer_state_dict(layers: int) -> dict[str, torch.Tensor]:
    layer = torch.nn.TransformerEncoderLayer(
        d_model=512, nhead=8, dim_feedforward=2048, batch_first=True
    )
    model = torch.nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
    return model.to(torch.bfloat16).state_dict()


def real_model(repeats: int, layers: int) -> None:
    sd = transformer_state_dict(layers)
    n = sum(v.numel() for v in sd.values())
    heading(
        f"A bf16 TransformerEncoder state dict ({layers} layers, {len(sd)} tensors, "
        f"{n / 1e6:.1f}M parameters)",
        "Deploying to a float32-only target.",
    )
    want = {k: v.float().numpy() for k, v in sd.items()}
    assert all_same(tree_to_numpy(sd, float_dtype="float32"), want)
    back_want = {k: torch.from_numpy(v).bfloat16() for k, v in want.items()}
    assert all_same(tree_to_torch(want, float_dtype=torch.bfloat16), back_want)
    st = measure(
        {
            "loop": lambda: {k: v.float().numpy() for k, v in sd.items()},
            "tree": lambda: tree_to_numpy(sd, float_dtype="float32"),
            "loop back": lambda: {k: torch.from_numpy(v).bfloat16() for k, v in want.items()},
            "tree back": lambda: tree_to_torch(want, float_dtype=torch.bfloat16),
            "share loop": lambda: {k: tb.to_numpy(v) for k, v in sd.items()},
            "share tree": lambda: tree_to_numpy(sd),
        },
        repeats,
    )
    table(
        HEADERS,
        [
            row(
                "tree_to_numpy(sd, float_dtype=f32) vs {k: v.float().numpy()}",
                st["loop"],
                st["tree"],
                1.1,
            ),
            row(
                "tree_to_torch(f32, float_dtype=bf16) vs {k: from_numpy(v).bfloat16()}",
                st["loop back"],
                st["tree back"],
                None,
            ),
            row(
                "tree_to_numpy(sd) vs {k: tb.to_numpy(v)} (zero-copy bf16)",
                st["share loop"],
                st["share tree"],
                None,
            ),
        ],
    )


# --- 3. CUDA ----------------------------------------------------------------------------------


def cuda_rows(label: str, sd: dict[str, torch.Tensor], repeats: int) -> list[list[Any]]:
    """Check, then time, one device tree both ways against the per-tensor loops."""
    want = {k: tb.to_numpy(v.cpu()) for k, v in sd.items()}
    assert all_same(tree_to_numpy(sd), want), label
    wide = {k: v.float().cpu().numpy() for k, v in sd.items()}
    assert all_same(tree_to_numpy(sd, float_dtype="float32"), wide), label
    host = {k: tb.to_numpy(v.cpu()) for k, v in sd.items()}

    def h2d() -> Any:
        out = tree_to_torch(host, device="cuda")
        torch.cuda.synchronize()
        return out

    def h2d_loop() -> Any:
        out = {k: tb.to_torch(v).cuda() for k, v in host.items()}
        torch.cuda.synchronize()
        return out

    assert all_same(h2d(), sd), label
    st = measure(
        {
            "d2h loop": lambda: {k: tb.to_numpy(v) for k, v in sd.items()},
            "d2h tree": lambda: tree_to_numpy(sd),
            "f32 loop": lambda: {k: v.float().cpu().numpy() for k, v in sd.items()},
            "f32 tree": lambda: tree_to_numpy(sd, float_dtype="float32"),
            "h2d loop": h2d_loop,
            "h2d tree": h2d,
        },
        repeats,
    )
    return [
        row(
            f"{label}: tree_to_numpy vs {{k: tb.to_numpy(v)}} (.cpu() each)",
            st["d2h loop"],
            st["d2h tree"],
            1.0,
        ),
        row(
            f"{label}: float_dtype=f32 vs {{k: v.float().cpu().numpy()}}",
            st["f32 loop"],
            st["f32 tree"],
            None,
        ),
        row(
            f"{label}: tree_to_torch(device='cuda') vs .cuda() loop",
            st["h2d loop"],
            st["h2d tree"],
            None,
        ),
    ]


def cuda(repeats: int, layers: int) -> None:
    if not torch.cuda.is_available():
        heading("CUDA", "Skipped: no CUDA device here (torch.cuda.is_available() is False).")
        return
    name = torch.cuda.get_device_name()
    heading(
        f"CUDA ({name})",
        "Device->host: one pinned buffer, non-blocking copies and one "
        "wait, against a per-tensor loop that waits once per tensor.",
    )
    small = {f"layers.{i}.weight": torch.randn(64, 64, device="cuda") for i in range(1000)}
    model = {k: v.cuda() for k, v in transformer_state_dict(layers).items()}
    rows = cuda_rows("1,000 fp32 64x64", small, repeats)
    rows += cuda_rows(f"bf16 encoder x{layers}", model, repeats)
    table(HEADERS, rows)
    print("Every result above was checked bit for bit against the per-tensor loop.\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke test: fewer repeats")
    args = parser.parse_args(argv)
    repeats = 5 if args.quick else 30
    layers = 2 if args.quick else 6
    print(f"# tensorbridge trees: torch {torch.__version__}, numpy {np.__version__}\n")
    small_tensors(repeats)
    real_model(max(3, repeats // 3), layers)
    cuda(max(3, repeats // 3), layers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
