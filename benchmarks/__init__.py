"""tensorbridge's one benchmark harness: ``python -m benchmarks [--quick] [--out DIR]``.

Every number tensorbridge publishes comes from here, measured side by side with the
calls people use today, in one run, on the machine the report describes.
``python -m benchmarks --out docs/bench`` regenerates the published report,
``--quick`` is the smoke run CI makes, and without ``--out`` the tables are printed
(``--section KEY`` runs some sections only). One module per section, in report order:

1. :mod:`.article` — the seed article's 1000x1000 bf16 table, reproduced and checked;
2. :mod:`.sizes` — zero-copy and copying paths from 1e3 to 1e8 elements against memcpy;
3. :mod:`.casts` — bf16 / fp16 / fp8 <-> float32 throughput: torch, astype, tensorbridge;
4. :mod:`.models` — bf16 state dicts of real architectures through trees and files;
5. :mod:`.streaming` — peak memory against size for a streamed float32 export;
6. :mod:`.overhead` — per-call overhead for every dtype in the table;
7. :mod:`.trees` — trees of 1,000 small tensors;
8. :mod:`.files` — the file layer's targets on a 1 GiB state dict;
9. :mod:`.diagnostics` — ``tb.compare`` / ``tb.stats`` against hand-written reductions;
10. :mod:`.startup` — start-up time of the ``tensorbridge`` command line;
11. :mod:`.dcp_convert` — DCP checkpoints to sharded safetensors: memory against size;
12. :mod:`.cuda` — batched device transfers (skipped without a GPU).

Shared by all of them: the timing core (:mod:`.core`: interleaved min / median
timing, formatting, the PASS / FAIL record), the child-process runner that measures
memory from outside (:mod:`.child`), and lazily imported matplotlib (:mod:`.plot`).
This package lives in the repository, not in the installed library; it needs the
development requirements (``requirements-dev.txt``: safetensors, matplotlib).
"""

from .harness import SECTIONS, BenchError, run, show, titles

__all__ = ["SECTIONS", "BenchError", "run", "show", "titles"]
