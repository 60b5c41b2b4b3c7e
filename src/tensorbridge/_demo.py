"""The offline demo behind ``tensorbridge demo``: a bf16 model's weights, both ways, in seconds."""

from __future__ import annotations

import time
from typing import TextIO

import numpy as np
import torch

from .convert import to_numpy, to_torch


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024)
    return layer.to(torch.bfloat16)


def run(out: TextIO) -> int:
    """Convert a bf16 TransformerEncoderLayer's weights to NumPy and back; report what happened."""
    model = _model()
    state = model.state_dict()
    nbytes = sum(t.nbytes for t in state.values())
    out.write(
        f"model: TransformerEncoderLayer(d_model=256) in bfloat16, {len(state)} tensors, "
        f"{nbytes / 2**20:.2f} MiB\n"
    )

    start = time.perf_counter()
    arrays = {k: to_numpy(v) for k, v in state.items()}
    took = time.perf_counter() - start
    shared = all(np.shares_memory(arrays[k], to_numpy(v)) for k, v in state.items())
    dtypes = sorted({str(a.dtype) for a in arrays.values()})
    out.write(
        f"to_numpy: {len(arrays)} arrays in {took * 1e3:.2f} ms, dtypes {dtypes}, "
        f"zero-copy: {shared}\n"
    )
    f32 = sum(v.float().numpy().nbytes for v in state.values())
    out.write(
        f"  bytes: {sum(a.nbytes for a in arrays.values()):,} "
        f"(the .float().numpy() route needs {f32:,})\n"
    )

    back = {k: to_torch(a) for k, a in arrays.items()}
    exact = all(
        torch.equal(back[k].view(torch.int16), v.view(torch.int16))
        if v.dtype is torch.bfloat16
        else torch.equal(back[k], v)
        for k, v in state.items()
    )
    out.write(
        f"to_torch: dtypes {sorted({str(t.dtype) for t in back.values()})}, "
        f"bit-exact round trip: {exact}\n"
    )
    return 0 if exact and shared else 1
