"""Section 8: the file layer's targets from issue 3, on a 1 GiB float32 state dict.

Every row runs in a child process with its memory sampled from outside (see
:mod:`.child`). The state dict (16 float32 tensors, 1 GiB; ``--quick``: 64 MiB) is
built in each saving child before its step, so every save starts with it in memory:

1. save it to safetensors: ``tb.save`` vs ``safetensors.torch.save_file`` (both followed
   by fsync: ``tb.save`` fsyncs as part of its atomic write). Target: throughput >= 0.9x,
   anonymous-memory growth <= 64 MiB;
2. the NumPy-side save (a dict of NumPy arrays) vs ``save_file``: >= 1.0x;
3. load with ``framework="numpy"``: open + first tensor < 10 ms; full read (every page
   touched) >= 0.9x the official loader: mapped vs ``safetensors.torch.load_file`` (also
   mapped), owned memory (``mmap=False``) vs ``safetensors.numpy.load_file`` (also owned).

Issue 3's fourth target, the 2 GiB streaming export, is section 5's 2 GiB row.

Issue 26 adds ``torch.save`` reads through tensorbridge's own pickle machine: a 1 GiB
zip-era ``.pt`` of 500 float32 tensors (``--quick``: 64 MiB), every page touched, at >=
1.0x ``torch.load(weights_only=True, mmap=True)``; the same state dict in the legacy
(pre-1.6) format at >= 1.0x ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

import tensorbridge as tb

from .child import ChildRun, Task, fsync, touch
from .core import MIB, Context, Section, fmt_mib

TITLE = "File layer: saving and loading a float32 state dict"

N_TENSORS = 16


def _best(runs: list[ChildRun]) -> ChildRun:
    return min(runs, key=lambda r: r.seconds)


# --- what the child processes run -------------------------------------------------------------


def state_dict(per: int, path: str) -> tuple[dict[str, torch.Tensor], str]:
    """The float32 state dict (random bits, ``per`` elements a tensor), and where it goes."""
    base = np.random.default_rng(0).standard_normal(per, dtype=np.float32)
    sd = {f"layer{i}.weight": torch.from_numpy(base.copy()) for i in range(N_TENSORS)}
    return sd, path


def arrays(per: int, path: str) -> tuple[dict[str, np.ndarray], str]:
    """The same state dict as NumPy arrays."""
    sd, _ = state_dict(per, path)
    return {k: v.numpy() for k, v in sd.items()}, path


def tb_save(inputs: tuple[Mapping[str, Any], str]) -> None:
    sd, path = inputs
    tb.save(sd, path, progress=False, overwrite=True)  # fsyncs: part of its atomic write


def st_save(inputs: tuple[dict[str, torch.Tensor], str]) -> None:
    from safetensors.torch import save_file

    sd, path = inputs
    save_file(sd, path)
    fsync(path)


def same(path: str) -> str:
    return path


def open_first(path: str) -> dict[str, float]:
    """Open the file and read its first tensor; the time is measured inside the step."""
    start = time.perf_counter()
    f = tb.open(path)
    f[f.keys()[0]]
    return {"first": time.perf_counter() - start}


# "Full read": every page of every tensor touched, so lazy (mapped) loaders pay too.
def tb_load_mapped(path: str) -> dict[str, int]:
    return {"touched": touch(tb.load(path).values())}


def tb_load_owned(path: str) -> dict[str, int]:
    return {"touched": touch(tb.load(path, mmap=False).values())}


def st_torch_load(path: str) -> dict[str, int]:
    from safetensors.torch import load_file

    return {"touched": touch(load_file(path).values())}


def st_numpy_load(path: str) -> dict[str, int]:
    from safetensors.numpy import load_file

    return {"touched": touch(load_file(path).values())}


PT_TENSORS = 500


def tb_load_pt(path: str) -> dict[str, int]:
    return {"touched": touch(tb.load(path).values())}


def torch_load_mapped(path: str) -> dict[str, int]:
    return {"touched": touch(torch.load(path, weights_only=True, mmap=True).values())}


def torch_load(path: str) -> dict[str, int]:
    return {"touched": touch(torch.load(path, weights_only=True).values())}


def _pt_rows(ctx: Context, sec: Section, total: int, repeats: int) -> list[tuple[str, ...]]:
    """Reading torch.save files of both eras: tb.load (the pickle machine) vs torch.load."""
    per = max(1, total // PT_TENSORS // 4)
    base = np.random.default_rng(1).standard_normal(per, dtype=np.float32)
    sd = {f"layers.{i}.weight": torch.from_numpy(base.copy()) for i in range(PT_TENSORS)}
    zipped, legacy = str(ctx.scratch / "zip.pt"), str(ctx.scratch / "legacy.pt")
    torch.save(sd, zipped)
    torch.save(sd, legacy, _use_new_zipfile_serialization=False)
    del sd
    loads = ctx.rounds(
        {
            "tb.load (zip)": Task(same, tb_load_pt, (zipped,)),
            "torch.load(weights_only=True, mmap=True)": Task(same, torch_load_mapped, (zipped,)),
            "tb.load (legacy)": Task(same, tb_load_pt, (legacy,)),
            "torch.load(weights_only=True)": Task(same, torch_load, (legacy,)),
        },
        repeats,
    )
    took = {k: _best(v).seconds for k, v in loads.items()}
    gb = total / 1e9
    rows: list[tuple[str, ...]] = []
    for ours_k, theirs_k in (
        ("tb.load (zip)", "torch.load(weights_only=True, mmap=True)"),
        ("tb.load (legacy)", "torch.load(weights_only=True)"),
    ):
        ratio = took[theirs_k] / took[ours_k]
        rows.append(
            (
                f"{fmt_mib(total)} .pt of {PT_TENSORS} tensors, full read: {ours_k} vs {theirs_k}",
                f"{gb / took[ours_k]:.2f} vs {gb / took[theirs_k]:.2f} GB/s = {ratio:.2f}x",
                ">= 1.0x",
                ctx.check(sec, f".pt full read: {ours_k} >= 1.0x {theirs_k}", ratio >= 1.0),
            )
        )
    for path in (zipped, legacy):
        Path(path).unlink(missing_ok=True)
    return rows


def run(ctx: Context, sec: Section) -> None:
    total = ctx.pick(1 << 30, 64 * MIB, 16 * MIB)
    repeats = ctx.pick(3, 1, 1)
    sec.intro(
        f"""{N_TENSORS} float32 tensors, {fmt_mib(total)} in all, best of {repeats}
        (each run in a fresh child process). Ratios are the official library's time /
        tensorbridge's (> 1: tensorbridge is faster)."""
    )
    if importlib.util.find_spec("safetensors") is None:
        sec.text("*Skipped: the official `safetensors` package is not installed.*")
        return
    per = total // N_TENSORS // 4  # float32 elements per tensor
    ours = str(ctx.scratch / "ours.safetensors")
    theirs = str(ctx.scratch / "theirs.safetensors")
    gb = total / 1e9
    rows: list[tuple[str, ...]] = []
    saves = ctx.rounds(
        {
            "tb": Task(state_dict, tb_save, (per, ours)),
            "st": Task(state_dict, st_save, (per, theirs)),
            "np": Task(arrays, tb_save, (per, ours)),
        },
        repeats,
    )
    a, b, c = _best(saves["tb"]), _best(saves["st"]), _best(saves["np"])
    rows.append(
        (
            f"save {fmt_mib(total)} f32 (torch) -> safetensors, tb vs save_file (both fsynced)",
            f"{gb / a.seconds:.2f} vs {gb / b.seconds:.2f} GB/s = {b.seconds / a.seconds:.2f}x",
            ">= 0.9x",
            ctx.check(sec, "save to safetensors >= 0.9x save_file", b.seconds / a.seconds >= 0.9),
        )
    )
    rows.append(
        (
            "  anonymous-memory growth during tb.save",
            fmt_mib(a.anon_growth),
            "<= 64 MiB",
            ctx.check(sec, "tb.save anonymous-memory growth <= 64 MiB", a.anon_growth <= 64 * MIB),
        )
    )
    rows.append(("  (save_file's growth, for reference)", fmt_mib(b.anon_growth), "", ""))
    rows.append(
        (
            "save NumPy arrays -> safetensors, tb vs save_file (torch)",
            f"{gb / c.seconds:.2f} GB/s = {b.seconds / c.seconds:.2f}x",
            ">= 1.0x",
            ctx.check(sec, "NumPy-side save >= 1.0x save_file", b.seconds / c.seconds >= 1.0),
        )
    )

    first = ctx.rounds({"first": Task(same, open_first, (theirs,))}, repeats)["first"]
    first_s = min(float(r.extra["first"]) for r in first)
    rows.append(
        (
            f"open + first tensor of a {fmt_mib(total)} file (numpy)",
            f"{first_s * 1e3:.2f} ms",
            "< 10 ms",
            ctx.check(sec, "open + first tensor < 10 ms", first_s < 0.010),
        )
    )
    loads = ctx.rounds(
        {
            "tb.load (mmap)": Task(same, tb_load_mapped, (theirs,)),
            "tb.load (mmap=False)": Task(same, tb_load_owned, (theirs,)),
            "safetensors.torch.load_file": Task(same, st_torch_load, (theirs,)),
            "safetensors.numpy.load_file": Task(same, st_numpy_load, (theirs,)),
        },
        repeats,
    )
    took = {k: _best(v).seconds for k, v in loads.items()}
    ctx.highlight(
        f"**Reading a {fmt_mib(total)} safetensors file**, every page touched: `tb.load` "
        f"(memory-mapped) at {took['safetensors.torch.load_file'] / took['tb.load (mmap)']:.2f}x "
        "the speed of `safetensors.torch.load_file`; NumPy arrays for bf16 and fp8 too."
    )
    for ours_k, theirs_k in (
        ("tb.load (mmap)", "safetensors.torch.load_file"),
        ("tb.load (mmap=False)", "safetensors.numpy.load_file"),
    ):
        ratio = took[theirs_k] / took[ours_k]
        rows.append(
            (
                f"full read: {ours_k} vs {theirs_k}",
                f"{gb / took[ours_k]:.2f} vs {gb / took[theirs_k]:.2f} GB/s = {ratio:.2f}x",
                ">= 0.9x",
                ctx.check(sec, f"full read: {ours_k} >= 0.9x {theirs_k}", ratio >= 0.9),
            )
        )
    for path in (ours, theirs):
        Path(path).unlink(missing_ok=True)
    rows += _pt_rows(ctx, sec, total, repeats)
    sec.table(["measurement", "result", "target", "result"], rows)
