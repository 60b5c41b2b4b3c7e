"""Every reader under hostile input: the corpus of past failures, then a bounded fuzz budget.

Each input goes through ``fuzz.bounds.run_one``: read whole with ``tb.open`` under a
2-second watchdog and ``tracemalloc``; the only acceptable error is the reader's own
(``FormatError``, ``UnsupportedDtypeError``, ``QuantizationError`` for configs) with
a message, and the traced allocation stays within the input's size plus a fixed
margin. ``python -m fuzz`` runs the same harness for longer (docs/dev/fuzzing.md).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz.bounds import MARGIN, child_rss, run_one
from fuzz.mutators import boundaries, mutate
from fuzz.targets import JSON_EXPANSION, READERS, seeds

# the harness reads every format, so it needs the extras' packages (CI installs them)
for _extra in ("gguf", "zarr", "h5py", "onnx"):
    pytest.importorskip(_extra, reason=f"the fuzz harness reads every format; {_extra} "
                        "(an optional extra) is not installed")  # fmt: skip

CORPUS = Path(__file__).parent / "fuzz_corpus"
ROOT = Path(__file__).parent.parent
_SEEDS: dict[str, list[bytes]] = {}


def _seeds(name: str) -> list[bytes]:
    if name not in _SEEDS:
        _SEEDS[name] = seeds(READERS[name], Path(tempfile.mkdtemp(prefix=f"seeds-{name}-")))
    return _SEEDS[name]


# inputs of holes found and not fixed yet: replayed all the same, expected to fail until fixed
_OPEN: dict[str, str] = {}  # corpus inputs of open holes: none now


def _corpus() -> list[Any]:
    return [
        pytest.param(
            p.parent.name,
            p,
            id=f"{p.parent.name}/{p.name}",
            marks=[pytest.mark.xfail(strict=True, reason=why)]
            if (why := _OPEN.get(f"{p.parent.name}/{p.name}"))
            else [],
        )
        for p in sorted(CORPUS.glob("*/*"))
        if p.is_file()
    ]


@pytest.mark.parametrize(("reader", "path"), _corpus())
def test_corpus_input_is_refused_with_a_message(reader: str, path: Path, tmp_path: Path) -> None:
    """Every input that once failed: now refused by the reader's own error, within bounds."""
    out = run_one(READERS[reader], path.read_bytes(), tmp_path)
    assert out.verdict == "refused", out.detail
    kind, _, message = out.detail.partition(": ")
    assert kind in READERS[reader].allowed
    assert len(message) > 20  # names what is wrong, not just the class
    assert out.peak <= path.stat().st_size * READERS[reader].expansion + MARGIN


@pytest.mark.parametrize("reader", sorted(READERS))
def test_seeds_read(reader: str, tmp_path: Path) -> None:
    """The valid files the real tools write read whole (the fuzzers start from them)."""
    verdicts = [run_one(READERS[reader], s, tmp_path).verdict for s in _seeds(reader)]
    assert "failure" not in verdicts
    assert verdicts.count("ok") >= 1


@pytest.mark.parametrize("reader", sorted(READERS))
def test_truncation_at_every_boundary(reader: str, tmp_path: Path) -> None:
    """A seed cut at each structural boundary (and one byte either side) is refused cleanly."""
    data = _seeds(reader)[0]
    cuts = sorted({max(0, min(len(data), b + d)) for b in boundaries(data) for d in (-1, 0, 1)})
    outs = {cut: run_one(READERS[reader], data[:cut], tmp_path) for cut in cuts[:120]}
    failures = {cut: o.detail for cut, o in outs.items() if o.verdict == "failure"}
    assert failures == {}
    assert outs[cuts[0]].verdict == "refused"  # the empty file, or one byte of it


_BUDGET = int(os.environ.get("TB_FUZZ_EXAMPLES", "40"))  # per reader; about a minute in all


@pytest.mark.parametrize("reader", sorted(READERS))
def test_structural_mutations(reader: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Hypothesis drives the structure-aware mutators over the seeds: no failure."""
    work = tmp_path_factory.mktemp(reader)
    corpus = _seeds(reader)

    @settings(
        max_examples=_BUDGET,
        deadline=None,  # the harness' own watchdog bounds each input
        database=None,
        derandomize=True,  # the same inputs on every run: CI is no place for a lottery
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.randoms(use_true_random=False), st.integers(0, len(corpus) - 1))
    def check(rng: random.Random, which: int) -> None:
        data = corpus[which]
        for _ in range(rng.choice((1, 1, 2, 3))):
            data = mutate(data, rng)
        out = run_one(READERS[reader], data, work)
        assert out.verdict != "failure", out.detail

    check()


def test_zip_bomb_is_refused_before_inflating(tmp_path: Path) -> None:
    """A member whose header says 100 bytes and whose stream inflates to 100 MB."""
    from fuzz.mutators import bomb_archive

    data = bomb_archive("x.npy")
    out = run_one(READERS["npz"], data, tmp_path)
    assert out.verdict == "refused", out.detail
    assert out.peak < MARGIN


def test_rss_in_a_child_stays_within_the_file(tmp_path: Path) -> None:
    """What tracemalloc cannot see (torch's allocator): peak RSS growth in a fresh process.

    A legacy ``torch.save`` file (read into memory, storages allocated by torch) whose
    storage size is damaged; the growth includes the reader's first-call costs.
    """
    legacy = _seeds("pt")[3]  # {"x": ..., "nested": ...} saved without the zip format
    data = mutate(legacy, random.Random(11))
    verdict, grown = child_rss(READERS["pt"], data, tmp_path)
    assert verdict in ("ok", "refused"), verdict
    assert grown <= len(data) + 4 * MARGIN


_ATHERIS = os.environ.get("TB_FUZZ_ATHERIS_READERS", "safetensors").split(",")


@pytest.mark.slow  # a coverage-guided run in a child (the mutations above run every day)
@pytest.mark.parametrize("reader", _ATHERIS)
def test_atheris_short_run(reader: str, tmp_path: Path) -> None:
    """A short coverage-guided run with atheris (skipped where it is not installed)."""
    pytest.importorskip("atheris", reason="atheris is not installed (pip install atheris)")
    runs = os.environ.get("TB_FUZZ_ATHERIS_RUNS", "300")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    cwd = tmp_path / "cwd"  # libFuzzer's own artifacts must not land in the working directory
    cwd.mkdir()
    out = subprocess.run(
        [sys.executable, "-m", "fuzz", "--engine", "atheris", "--reader", reader,
         "--runs", runs, "--failures", str(tmp_path / "failures")],
        capture_output=True, text=True, env=env, timeout=300, check=False, cwd=cwd,
    )  # fmt: skip
    summary = [line for line in out.stdout.splitlines() if line.startswith(f"{reader}: ")]
    assert summary, out.stdout[-2000:] + out.stderr[-2000:]
    assert "failures 0 " in summary[-1], summary[-1]
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


_JSON_BOMBS = {
    "one-key objects": b'{"a": [' + b",".join([b'{"":{}}'] * 150_000) + b"]}",
    "empty lists": b'{"a": [' + b",".join([b"[[]]"] * 150_000) + b"]}",
    "flat keys": b"{" + b",".join(b'"k%d": %d' % (i, i) for i in range(200_000)) + b"}",
}


@pytest.mark.parametrize("shape", sorted(_JSON_BOMBS))
def test_json_header_costs_at_most_json_expansion(shape: str, tmp_path: Path) -> None:
    """The JSON shapes that cost CPython the most objects per byte stay within the bound."""
    text = _JSON_BOMBS[shape]
    data = len(text).to_bytes(8, "little") + text
    out = run_one(READERS["safetensors"], data, tmp_path)
    assert out.verdict == "refused", out.detail
    assert "FormatError" in out.detail
    assert len(data) * 10 < out.peak <= len(data) * JSON_EXPANSION + MARGIN
