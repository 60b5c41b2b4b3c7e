"""The benchmark harness (the repository's ``benchmarks`` package) runs end to end.

One tiny run of every section (seconds of work, not measurements) writes a report whose
headings, machine description, summary and plots are checked; the numbers are not
(CI checks that the harness runs, never what it measures). Cheaper tests cover the
report without matplotlib, a failing section, the printed tables, the child-process
runner, and ``python -m benchmarks``. The package is importable because pytest puts
the repository root on ``sys.path`` (``pythonpath`` in pyproject.toml).
"""

from __future__ import annotations

import importlib.util
import io
import multiprocessing
import re
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
import torch

import benchmarks
from benchmarks import article
from benchmarks.__main__ import main
from benchmarks.child import ChildError, ChildRunner, Task

ROOT = Path(__file__).resolve().parent.parent
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
HEADINGS = [
    "## 1. A widely copied guide's figures, checked: a 1000x1000 bfloat16 tensor to NumPy",
    "## 2. Size sweep: zero-copy and copies against memcpy",
    "## 3. Dtype casts: bf16 / fp16 / fp8 <-> float32",
    "## 4. Whole models: bf16 state dicts through trees and files",
    "## 5. Streaming: peak memory against tensor size",
    "## 6. Per-call overhead, 1,000 elements, every dtype",
    "## 7. Trees of many small tensors",
    "## 8. File layer: saving and loading a float32 state dict",
    "## 9. Comparing and summarising tensors: tb.compare and tb.stats vs hand-written torch",
    "## 10. Start-up time of the command line",
    "## 11. Device transfers of whole trees (CUDA)",
]
# a section that cannot run here (no CUDA device) is left out of the report, and said so
SHOWN = HEADINGS if torch.cuda.is_available() else HEADINGS[:-1]
PLOTS = {"sizes.png", "casts.png", "models.png", "streaming.png"}


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG file, after checking its signature, chunk CRCs and IEND."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name}: not a PNG"
    pos, chunks, size = 8, [], (0, 0)
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"{path.name}: bad CRC in {kind!r}"
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        chunks.append(kind)
        pos += 12 + length
    assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND" and b"IDAT" in chunks, path.name
    return size


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One tiny run of every section: (the report, the scratch parent directory)."""
    base = tmp_path_factory.mktemp("bench")
    scratch = base / "scratch"
    scratch.mkdir()
    report = benchmarks.run(base / "out", mode="tiny", scratch=scratch)
    return report, scratch


def test_report_has_every_section(tiny: tuple[Path, Path]) -> None:
    report, _ = tiny
    text = report.read_text(encoding="utf-8")
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == ["## Machine", *SHOWN, "## Summary"]
    assert list(benchmarks.titles().values()) == HEADINGS
    assert "This section failed" not in text
    assert re.search(r"tensorbridge meets \d+ of the \d+ speed and memory goals", text)
    assert "issue" not in text.lower() and "seed" not in text.lower()
    assert text.startswith("---\nhide:\n  - navigation\n  - toc\n---\n")
    if not torch.cuda.is_available():
        assert "Not run on this machine, so not shown: Device transfers" in text
    assert "What you gain against the calls you would otherwise write" in text


def test_report_describes_the_machine(tiny: tuple[Path, Path]) -> None:
    text = tiny[0].read_text(encoding="utf-8")
    machine = text.split("## Machine", 1)[1].split("\n## ", 1)[0]
    for row in ("| CPU |", "| cores |", "| memory |", "| load average", "| torch |"):
        assert row in machine
    for lib in ("numpy", "ml_dtypes", "safetensors", "tensorbridge"):
        assert f"| {lib} |" in machine


def test_report_reproduces_the_article(tiny: tuple[Path, Path]) -> None:
    text = tiny[0].read_text(encoding="utf-8")
    article = text.split(HEADINGS[0], 1)[1].split("\n## ", 1)[0]
    for figure in ("1.2 ms", "1.3 ms", "0.8 ms", "1.5 ms", "3.81 MB", "1.91 MB"):
        assert figure in article
    assert "raises TypeError" in article  # direct .numpy() of bf16 on current torch


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib (the plot extra) is not installed")
def test_plots_are_valid_pngs(tiny: tuple[Path, Path]) -> None:
    report, _ = tiny
    linked = set(re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report.read_text(encoding="utf-8")))
    assert linked == PLOTS
    for name in linked:
        width, height = png_size(report.parent / name)
        assert width > 100 and height > 100
    assert sum((report.parent / n).stat().st_size for n in linked) < 1_000_000


def test_scratch_files_are_removed(tiny: tuple[Path, Path]) -> None:
    _, scratch = tiny
    assert list(scratch.iterdir()) == []


def test_without_matplotlib_the_report_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    report = benchmarks.run(tmp_path, mode="tiny", sections=["sizes"])
    text = report.read_text(encoding="utf-8")
    assert "Plots were not drawn: matplotlib is not installed" in text
    assert "pip install 'tensorbridge[plot]'" in text
    assert "![" not in text
    assert list(tmp_path.glob("*.png")) == []


def test_a_failing_section_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(ctx: object, sec: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(article, "run", broken)
    with pytest.raises(benchmarks.BenchError, match="section 1"):
        benchmarks.run(tmp_path, mode="tiny", sections=["article"])
    text = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "This section failed" in text and "RuntimeError: boom" in text


def test_unknown_section_or_mode(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown benchmark section"):
        benchmarks.run(tmp_path, mode="tiny", sections=["nope"])
    with pytest.raises(ValueError, match="mode must be one of"):
        benchmarks.run(tmp_path, mode="huge")


def test_startup_section_checks_the_help_commands(tiny: tuple[Path, Path]) -> None:
    text = tiny[0].read_text(encoding="utf-8")
    startup = text.split(HEADINGS[9], 1)[1].split("\n## ", 1)[0]
    rows = {line.split(" | ")[0].strip("| `"): line for line in startup.splitlines()}
    for command in ("tensorbridge --help", "tensorbridge inspect --help"):
        assert "<= 5x" in rows[command] and "| none |" in rows[command]
    assert "| torch, numpy, ml_dtypes |" in rows["tensorbridge inspect model.safetensors"]


def test_show_prints_the_tables(capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    assert benchmarks.show(["trees"], mode="tiny", out=out) == 0
    text = out.getvalue()
    assert text.startswith("# tensorbridge benchmarks (--quick: smoke run)")
    assert "## 7. Trees of many small tensors" in text and "| torch |" in text
    assert "## 1." not in text and "## Summary" in text


# --- the child-process runner -------------------------------------------------------------------


def _ones(n: int) -> bytearray:
    return bytearray(n)


def _grow(buf: bytearray) -> dict[str, int]:
    big = bytearray(64 << 20)  # 64 MiB of fresh memory, touched (zeroed)
    time.sleep(0.3)  # held long enough for the parent's samples, even on a busy machine
    return {"size": len(buf) + len(big)}


def _fail(buf: bytearray) -> None:
    raise RuntimeError("the step broke")


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_child_runs_a_task_and_sees_its_memory(method: str) -> None:
    if method not in multiprocessing.get_all_start_methods():
        pytest.skip(reason=f"this platform has no {method} start method")
    run = ChildRunner(method=method).run(Task(_ones, _grow, (1 << 20,)))
    assert run.extra == {"size": (1 << 20) + (64 << 20)}
    assert run.seconds > 0
    # the step allocated 64 MiB; what prepare built is not counted
    assert 60 << 20 <= run.rss_growth < 200 << 20
    assert 60 << 20 <= run.anon_growth < 200 << 20


def test_child_errors_are_reported() -> None:
    with pytest.raises(ChildError, match="RuntimeError: the step broke"):
        ChildRunner().run(Task(_ones, _fail, (1,)))
    with pytest.raises(ChildError, match="setup failed"):
        ChildRunner().run(Task(_ones, _grow, (-1,)))


# --- entry points -----------------------------------------------------------------------------


def test_help_shows_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m benchmarks")
    assert "--quick" in out and "--out" in out and "--section" in out
    assert "python -m benchmarks --out docs/bench" in out


def test_main_calls_the_harness(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = []

    def fake(out: str, quick: bool, **kwargs: object) -> Path:
        calls.append((out, quick, kwargs["sections"], kwargs["scratch"]))
        return Path(out) / "report.md"

    main_module = sys.modules["benchmarks.__main__"]
    monkeypatch.setattr(main_module, "run", fake)
    argv = ["--quick", "--out", str(tmp_path), "--scratch", "/s", "--section", "casts"]
    assert main(argv) == 0
    assert calls == [(str(tmp_path), True, ["casts"], "/s")]
    assert capsys.readouterr().out == f"wrote {tmp_path / 'report.md'} and its plots\n"

    def failing(out: str, quick: bool, **kwargs: object) -> Path:
        raise benchmarks.BenchError("section 2 (x) failed: boom\ntraceback ...")

    monkeypatch.setattr(main_module, "run", failing)
    assert main(["--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == "python -m benchmarks: error: section 2 (x) failed: boom\n"


def test_an_unknown_section_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--section", "nope"])
    assert exit_.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_runs_as_a_module_from_the_repository_root() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m benchmarks")


def test_the_library_ships_no_benchmarks() -> None:
    import tensorbridge

    package = Path(tensorbridge.__file__).parent
    assert not (package / "bench").exists()
    assert not any("bench" in p.name for p in package.rglob("*.py"))
