"""The offline demo behind ``tensorbridge demo``: a bf16 model's weights, both ways, in seconds.

It builds a real ``torch.nn.TransformerEncoderLayer`` in bfloat16 (random weights, no
download), converts its state dict to NumPy and back, saves it as safetensors and
.npz, reloads both, compares everything bit for bit, and prints what happened.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import TextIO

import numpy as np
import torch

from .diagnostics import compare
from .io import load, save
from .tree import tree_to_numpy, tree_to_torch


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024)
    return layer.to(torch.bfloat16)


def _same_bits(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8))
        for k in a
    )


def run(out: TextIO) -> int:
    """Run the demo, writing a short report to ``out``; returns 0 when everything was exact."""
    state = _model().state_dict()
    nbytes = sum(t.nbytes for t in state.values())
    out.write(
        f"model: TransformerEncoderLayer(d_model=256) in bfloat16, {len(state)} tensors, "
        f"{nbytes / 2**20:.2f} MiB\n"
    )

    start = time.perf_counter()
    arrays = tree_to_numpy(state)
    took = time.perf_counter() - start
    shared = all(np.shares_memory(arrays[k], tree_to_numpy(v)) for k, v in state.items())
    dtypes = sorted({str(a.dtype) for a in arrays.values()})
    f32 = sum(v.float().numpy().nbytes for v in state.values())
    out.write(
        f"to NumPy:  {len(arrays)} arrays in {took * 1e3:.2f} ms, dtypes {dtypes}, "
        f"zero-copy: {shared}\n"
        f"  bytes: {sum(a.nbytes for a in arrays.values()):,} "
        f"(the usual .float().numpy() route: {f32:,})\n"
    )
    back = tree_to_torch(arrays)
    round_trip = _same_bits(state, back)
    out.write(
        f"to torch:  dtypes {sorted({str(t.dtype) for t in back.values()})}, "
        f"bit-exact round trip: {round_trip}\n"
    )

    files_ok = True
    with tempfile.TemporaryDirectory(prefix="tensorbridge-demo-") as tmp:
        for name in ("model.safetensors", "model.npz"):
            path = Path(tmp) / name
            save(arrays, path, progress=False)
            reloaded = load(path, framework="torch")
            exact = _same_bits(state, reloaded)
            verdict = compare(arrays, load(path))
            files_ok &= exact and verdict.ok and verdict.max_ulp == 0
            out.write(
                f"{name:18s} {path.stat().st_size:>10,} bytes, reloaded as "
                f"{next(iter(reloaded.values())).dtype}, bit-exact: {exact}, "
                f"compare: ok={verdict.ok} max_ulp={verdict.max_ulp}\n"
            )
    return 0 if round_trip and shared and files_ok else 1
