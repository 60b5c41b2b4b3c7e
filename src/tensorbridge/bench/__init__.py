"""tensorbridge's one benchmark harness: ``tensorbridge bench [--quick] [--out DIR]``.

Every number tensorbridge publishes comes from here, measured side by side with the
calls people use today, in one run, on the machine the report describes. One module
per section, in report order:

1. :mod:`.article` — the seed article's 1000x1000 bf16 table, reproduced and checked;
2. :mod:`.sizes` — zero-copy and copying paths from 1e3 to 1e8 elements against memcpy;
3. :mod:`.casts` — bf16 / fp16 / fp8 <-> float32 throughput: torch, astype, tensorbridge;
4. :mod:`.models` — bf16 state dicts of real architectures through trees and files;
5. :mod:`.streaming` — peak memory against size for a streamed float32 export;
6. :mod:`.overhead` — per-call overhead for every dtype in the table;
7. :mod:`.trees` — trees of 1,000 small tensors;
8. :mod:`.files` — the file layer's targets on a 1 GiB state dict;
9. :mod:`.cuda` — batched device transfers (skipped without a GPU).

Shared by all of them: the timing core (:mod:`._core`: interleaved min / median
timing, formatting, the PASS / FAIL record), the child-process runner that measures
memory from outside (:mod:`._child`), and lazily imported matplotlib (:mod:`._plot`).
The scripts under ``benchmarks/`` are thin entry points that print sections of this
same harness. Nothing here is imported by ``import tensorbridge``.
"""

from ._harness import SECTIONS, BenchError, run, script, titles

__all__ = ["SECTIONS", "BenchError", "run", "script", "titles"]
