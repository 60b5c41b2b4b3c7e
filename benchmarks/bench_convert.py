"""Side-by-side timings of ``tb.to_numpy`` / ``tb.to_torch`` against the plain-torch calls.

A thin entry point: it runs the conversion-engine sections of the one benchmark
harness (``tensorbridge.bench``, the same code as ``tensorbridge bench``) and prints
their tables, with PASS / FAIL against the targets of issue 2's "Speed" section:

1. the seed article's case (a 1000x1000 bf16 tensor): at least 10x faster than
   ``t.float().numpy()`` with at most half its memory;
2. zero-copy time independent of size, 1e3 to 1e8 bf16 elements; copies against
   ``np.copyto`` bandwidth: ``copy=True`` and ``out=`` on 64 MiB+ at 80 % or better;
3. casts: bf16 -> f32 at least 3x ``t.float().numpy()`` from 16M elements up and never
   slower below; f32 -> bf16 at least 0.9x torch's own cast;
6. per-call overhead on 1,000 elements within 4x of the bare ``t.numpy()`` /
   ``torch.from_numpy(a)``, for every dtype in ``tb.dtype_table()``.

Candidates are interleaved, cells are min / median, PASS / FAIL uses the minima (see
``tensorbridge/bench/_core.py``). Run ``python benchmarks/bench_convert.py`` (a few
minutes) or ``--quick`` (seconds: a smoke test, not a measurement). The exit status is
0 even when a target fails; the tables are the result.
"""

from __future__ import annotations

import sys

from tensorbridge.bench import script

if __name__ == "__main__":
    sys.exit(script(["article", "sizes", "casts", "overhead"], None, __doc__.splitlines()[0]))
