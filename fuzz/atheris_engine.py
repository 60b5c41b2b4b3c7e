"""Coverage-guided fuzzing of one reader with atheris (libFuzzer for Python).

tensorbridge's modules are instrumented for coverage; each input goes through the
same bounded harness as the mutation engine (:func:`fuzz.bounds.run_one`), and
atheris' own byte-level mutations alternate with the structure-aware ones of
:mod:`fuzz.mutators` (a custom mutator), starting from the real tools' seeds.
Failures are written to a directory and counted rather than stopping the run.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["run_atheris"]


def run_atheris(
    reader_spec: object, runs: int, failures: Path, seed: int, seconds: float | None = None
) -> int:
    """Fuzz ``reader_spec`` (a :class:`fuzz.targets.Reader`) for ``runs`` inputs."""
    import atheris

    with atheris.instrument_imports(include=["tensorbridge"]):
        import tensorbridge.dcp
        import tensorbridge.io
        import tensorbridge.io.dcp
        import tensorbridge.io.gguf
        import tensorbridge.io.npy
        import tensorbridge.io.npz
        import tensorbridge.io.pt
        import tensorbridge.io.safetensors
        import tensorbridge.io.sharded
        import tensorbridge.io.zarr
        import tensorbridge.quant.api
        import tensorbridge.quant.detect  # noqa: F401

    from .cli import Campaign
    from .mutators import mutate
    from .targets import Reader

    assert isinstance(reader_spec, Reader)
    campaign = Campaign(reader_spec, failures)
    corpus = Path(tempfile.mkdtemp(prefix=f"atheris-{reader_spec.name}-"))
    for i, s in enumerate(campaign.seeds):
        (corpus / f"seed-{i}").write_bytes(s)
    start = time.monotonic()
    count = [0]

    def one_input(data: bytes) -> None:
        count[0] += 1
        campaign.one(data, trace=count[0] % 10 == 0)
        if count[0] % 5000 == 0 or count[0] == runs:  # libFuzzer exits without atexit
            report()

    def custom_mutator(data: bytes, max_size: int, mseed: int) -> bytes:
        rng = random.Random(mseed)
        if rng.random() < 0.5:
            return bytes(atheris.Mutate(data, max_size))
        return mutate(data, rng)[:max_size]

    def report() -> None:
        print(campaign.summary(time.monotonic() - start), flush=True)

    # libFuzzer's own findings (an RSS over its limit, a unit slower than 10 s) go beside
    # the harness's, never into the working directory
    failures.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.argv[0],
        f"-runs={runs}",
        f"-seed={seed or 1}",
        "-max_len=65536",
        f"-artifact_prefix={failures}/libfuzzer-",
        str(corpus),
    ]
    if seconds:
        argv.insert(1, f"-max_total_time={int(seconds)}")
    atheris.Setup(argv, one_input, custom_mutator=custom_mutator)
    atheris.Fuzz()
    return 0
