"""Timings of ``tree_to_numpy`` / ``tree_to_torch`` against the loops people write by hand.

A thin entry point: it runs the tree sections of the one benchmark harness
(``tensorbridge.bench``, the same code as ``tensorbridge bench``) and prints their
tables. The candidates of a row are interleaved; each cell is the minimum / median over
the repeats, and PASS / FAIL is decided on the ratio of the minima. Every result is
checked bit for bit against its baseline before it is timed.

4. bf16 state dicts of real architectures (``torch.nn.Transformer`` and a ResNet-style
   CNN, built in code) to float32 with ``float_dtype=`` against
   ``{k: v.float().numpy()}`` (target <= 1.1x), and back; then each through
   tensorbridge's and the usual writers and readers, with peak memory.
7. ``tree_to_numpy`` over 1,000 small CPU tensors: per-leaf cost within 2x of a bare
   ``[t.detach().numpy() for t in ...]`` loop (issue 3, "Speed").
9. CUDA, when a GPU is present (a printed note otherwise): the batched device->host
   transfer (one pinned buffer, non-blocking copies, one wait) against the per-tensor
   ``.cpu()`` loop, and host->device staging against a ``.cuda()`` loop.

Run ``python benchmarks/bench_tree.py`` (a few minutes) or ``--quick`` (a smoke test).
The exit status is 0 even when a target fails; the tables are the result.
"""

from __future__ import annotations

import sys

from tensorbridge.bench import script

if __name__ == "__main__":
    sys.exit(script(["models", "trees", "cuda"], None, __doc__.splitlines()[0]))
