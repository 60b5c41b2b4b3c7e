"""The command line of :mod:`fuzz`: inputs per reader, failures, the peak allocation.

``python -m fuzz --reader npy --runs 100000`` mutates the seed corpus with the
structure-aware mutators (``--engine mutate``, the default) or lets atheris' coverage
guidance drive them (``--engine atheris``, when atheris is installed); every failing
input is written to ``--failures`` (default ``fuzz-failures/<reader>/``) and counted.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

from .bounds import Outcome, run_one
from .mutators import mutate
from .targets import READERS, Reader, seeds

__all__ = ["Campaign", "main"]


class Campaign:
    """One reader fuzzed in this process: its seeds, a scratch directory, the tallies."""

    def __init__(self, reader: Reader, failures: Path | None) -> None:
        self.reader = reader
        # in memory where the platform has it: a write per input is most of the cost on disk
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.scratch = Path(tempfile.mkdtemp(prefix=f"fuzz-{reader.name}-", dir=shm))
        self.seeds = seeds(reader, self.scratch / "seeds")
        self.work = self.scratch / "work"
        self.work.mkdir()
        self.failures = failures
        self.verdicts: Counter[str] = Counter()
        self.found: dict[str, str] = {}
        self.peak_over = 0  # the largest traced peak beyond the input's size
        self.traced = 0

    def one(self, data: bytes, *, trace: bool = True) -> Outcome:
        out = run_one(self.reader, data, self.work, trace=trace)
        self.verdicts[out.verdict] += 1
        if trace:
            self.traced += 1
            self.peak_over = max(self.peak_over, out.peak - len(data) * self.reader.expansion)
        if out.verdict == "failure":
            digest = hashlib.sha1(data).hexdigest()[:16]
            key = out.detail.split(":")[0] + out.detail[:80]
            if key not in self.found.values():
                print(f"[{self.reader.name}] FAILURE {digest}: {out.detail[:300]}", flush=True)
            self.found[digest] = key
            if self.failures is not None:
                self.failures.mkdir(parents=True, exist_ok=True)
                (self.failures / digest).write_bytes(data)
        return out

    def random_input(self, rng: random.Random) -> bytes:
        data = rng.choice(self.seeds)
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            data = mutate(data, rng)
        return data[: 1 << 24]

    def summary(self, elapsed: float) -> str:
        n = sum(self.verdicts.values())
        return (
            f"{self.reader.name}: {n} inputs in {elapsed:.0f} s ({n / max(elapsed, 1e-9):.0f}/s), "
            f"ok {self.verdicts['ok']}, refused {self.verdicts['refused']}, "
            f"failures {self.verdicts['failure']} ({len(set(self.found.values()))} distinct), "
            f"allocations traced on {self.traced}, peak beyond the input "
            f"{self.peak_over / 2**20:.2f} MiB"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__)
    parser.add_argument("--reader", choices=sorted(READERS), action="append")
    parser.add_argument("--runs", type=int, default=10_000, help="inputs per reader")
    parser.add_argument("--seconds", type=float, default=None, help="stop after this long")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--trace-every", type=int, default=1, help="measure allocations on every Nth input"
    )
    parser.add_argument("--engine", choices=("mutate", "atheris"), default="mutate")
    parser.add_argument("--failures", type=Path, default=Path("fuzz-failures"))
    parser.add_argument(
        "--pause-file",
        type=Path,
        default=None,
        help="while this file exists, wait between inputs (to leave the machine quiet)",
    )
    args = parser.parse_args(argv)
    names = args.reader or sorted(READERS)
    if args.engine == "atheris":
        from .atheris_engine import run_atheris

        if len(names) != 1:
            parser.error("--engine atheris fuzzes one --reader per process")
        return run_atheris(
            READERS[names[0]], args.runs, args.failures / names[0], args.seed, args.seconds
        )
    failures = 0
    for name in names:
        c = Campaign(READERS[name], args.failures / name)
        rng = random.Random(args.seed)
        start = time.monotonic()
        for s in c.seeds:
            c.one(s)
        for i in range(args.runs):
            while args.pause_file is not None and args.pause_file.exists():
                time.sleep(1)
            c.one(c.random_input(rng), trace=i % args.trace_every == 0)
            if args.seconds and time.monotonic() - start > args.seconds:
                break
            if i and i % 20000 == 0:
                print(c.summary(time.monotonic() - start), flush=True)
        print(c.summary(time.monotonic() - start), flush=True)
        failures += c.verdicts["failure"]
    return 1 if failures else 0
