"""File-layer benchmarks (issue 3): speed and memory of tb.save / tb.load, side by side.

A thin entry point: it runs the file-layer sections of the one benchmark harness
(``tensorbridge.bench``, the same code as ``tensorbridge bench``) and prints their
tables. Every row runs in a fresh child process (forked from a server that imported
torch once); the parent samples the child's /proc/<pid>/status from the outside, so a
sampler can't be starved by code that holds the child's GIL, and the child reports the
kernel's high-water mark. "Growth" is the peak minus the level measured once the inputs
exist, just before the timed step.

Rows (section 8, and section 5 for the export):
1. Save a 1 GiB float32 state dict to safetensors: tb.save vs safetensors.torch.save_file
   (both followed by fsync). Target: throughput >= 0.9x, anon growth <= 64 MiB.
2. NumPy-side save (a dict of NumPy arrays) vs safetensors.torch.save_file: >= 1.0x.
3. Load a 1 GiB file with framework="numpy": open + first tensor < 10 ms; full read
   (every page touched) >= 0.9x the official loader: mapped vs safetensors.torch.load_file
   (also mapped), owned memory (mmap=False) vs safetensors.numpy.load_file (also owned).
4. Export a memory-mapped bf16 .npy of 1, 2 and 4 GiB to a float32 .npy: anon growth
   < 512 MiB, total RSS growth near one chunk; time >= 0.8x a raw sequential write of
   the same bytes (64 MiB buffer, fsync) in the same run; the naive
   ``np.save(path, t.float().numpy())`` route beside it.

Usage: python benchmarks/bench_io.py [--quick] [--dir DIR]
(--quick shrinks the sizes 16x so the harness runs in seconds; its figures are not
targets. --dir: the scratch directory, which needs ~13 GiB free for the full run.)
"""

from __future__ import annotations

import sys

from tensorbridge.bench import script

if __name__ == "__main__":
    sys.exit(script(["streaming", "files"], None, __doc__.splitlines()[0]))
