"""Bounded memory end to end: converting a mapped checkpoint streams through one chunk.

The peak is read from the kernel (VmHWM after a reset through /proc/self/clear_refs)
in a child process, so nothing in the test process itself inflates it. A control
step in the same child touches the whole input, proving the measure would see it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import tensorbridge as tb
from _peak_rss import run_child

_CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    import ml_dtypes, torch  # the cast imports them: loaded before the measure, of the save
    import tensorbridge as tb

    src = tb.open(sys.argv[1])
    lazy = {name: src[name] for name in src.keys()}  # mapped views: nothing read yet
    reset_peak()
    base = status("VmRSS")
    tb.save(lazy, sys.argv[2], float_dtype="bf16", progress=False)
    streamed = status("VmHWM") - base
    reset_peak()
    base = status("VmRSS")
    total = sum(float(a.astype(np.float64).sum()) for a in lazy.values())  # control
    control = status("VmHWM") - base
    print(streamed, control)
    """
)


@pytest.mark.slow  # a 512 MiB input, read twice in a child
def test_safetensors_to_safetensors_cast_streams_with_bounded_peak_rss(tmp_path: Path) -> None:
    src, dst = tmp_path / "big.safetensors", tmp_path / "small.safetensors"
    per = (128 << 20) // 4  # four 128 MiB float32 tensors: 512 MiB of input
    tb.save({f"w{i}": torch.full((per,), float(i)) for i in range(4)}, src, progress=False)
    streamed, control = map(int, run_child(_CHILD, str(src), str(dst)).split())
    assert control > 400 << 20, "the measure misses a full read of the input"
    assert streamed < 160 << 20, f"peak RSS grew {streamed >> 20} MiB for a 512 MiB input"
    with tb.open(dst) as f:
        assert f.keys() == ["w0", "w1", "w2", "w3"]
        assert all(f.info(k)[0] is tb.resolve_dtype("bfloat16") for k in f)
        assert float(f["w3"][-1].astype(np.float32)) == 3.0
