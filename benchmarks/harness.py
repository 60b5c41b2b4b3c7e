"""Running the sections and writing the report (``run``) or printing them (``show``)."""

from __future__ import annotations

import contextlib
import datetime
import importlib
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import TextIO

from . import plot
from .core import (
    MODES,
    NOISY,
    Context,
    Section,
    fmt_bytes,
    fmt_time,
    load_average,
    table,
    thread_stall,
)

# The report's sections, in order: key -> module (each has TITLE and run(ctx, section)).
SECTIONS = (
    "article",
    "sizes",
    "casts",
    "models",
    "streaming",
    "overhead",
    "trees",
    "files",
    "diagnostics",
    "startup",
    "gguf",
    "dcp_save",
    "quant",
    "dcp_convert",
    "hdf5",
    "onnx_models",
    "memory_budget",
    "cuda",
)


class BenchError(RuntimeError):
    """A section failed; the report was still written, with the traceback in its place."""


def module(key: str) -> ModuleType:
    """The module of section ``key`` (it has ``TITLE`` and ``run(ctx, section)``)."""
    return importlib.import_module(f"{__package__}.{key}")


def titles() -> dict[str, str]:
    """Every section's key and numbered heading, as it appears in the report."""
    return {key: f"## {i}. {module(key).TITLE}" for i, key in enumerate(SECTIONS, 1)}


def _sections(ctx: Context, keys: Sequence[str]) -> Iterator[tuple[Section, str | None]]:
    """Run the sections ``keys`` (in report order); yield each with its error, if any."""
    unknown = [k for k in keys if k not in SECTIONS]
    if unknown:
        raise ValueError(f"unknown benchmark section(s) {unknown}; choose from {list(SECTIONS)}")
    for number, key in enumerate(SECTIONS, 1):
        if key not in keys:
            continue
        section = module(key)
        sec = Section(number, section.TITLE)
        sec.conditions = f"Load average at the start: {load_average()} on {os.cpu_count()} CPUs."
        stall = thread_stall()
        if stall is not None:
            ctx.stalled.append(number)
            sec.conditions += (
                f" **Other load stalled torch's threads** at the start (a 4 MiB `copy_` took "
                f"{fmt_time(stall[0])} with them, {fmt_time(stall[1])} with one): torch "
                "kernels, and tensorbridge's copies and casts that use them, read slow here."
            )
        ctx.say(f"{number}. {section.TITLE}")
        start = time.perf_counter()
        error = None
        try:
            section.run(ctx, sec)
        except Exception:
            error = traceback.format_exc()
            sec.raw(f"**This section failed:**\n\n```text\n{error.rstrip()}\n```")
        sec.seconds = time.perf_counter() - start
        ctx.say(f"   {'FAILED' if error else 'done'} in {sec.seconds:.0f} s")
        yield sec, error


def _summary(ctx: Context, seconds: float) -> str:
    failed = [what for what, ok in ctx.checks if not ok]
    lines = [
        "## Summary",
        "",
        f"tensorbridge meets {len(ctx.checks) - len(failed)} of the {len(ctx.checks)} speed "
        "and memory goals this report checks"
        + (" (a smoke run: its figures are not measurements)" if ctx.mode != "full" else "")
        + (". It misses these, each explained in its section:" if failed else "."),
    ]
    if failed:
        lines.append("")
        lines += [f"- {what}" for what in failed]
    if ctx.stalled:
        lines += [
            "",
            "Sections that started while other load stalled torch's worker threads: "
            + ", ".join(map(str, ctx.stalled))
            + ". There, torch's multi-threaded kernels (and tensorbridge's copies and casts, "
            "which run them) wait for a thread the scheduler has not run yet, while NumPy's "
            "single-threaded loops do not: ratios against NumPy understate tensorbridge.",
        ]
    noisy = sum(spread > NOISY for spread in ctx.spreads)
    lines += [
        "",
        f"{noisy} of {len(ctx.spreads)} in-process timings had a median over {NOISY}x their "
        f"minimum (other load on the machine; load average now {load_average()} on "
        f"{os.cpu_count()} CPUs). PASS/FAIL uses the minima. The run took {seconds:.0f} s.",
    ]
    return "\n".join(lines) + "\n"


# --- the machine ------------------------------------------------------------------------------


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _meminfo() -> dict[str, int]:
    info = {}
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                info[name] = int(rest.split()[0]) * 1024
    return info


def _version(module: str) -> str:
    try:
        return str(importlib.import_module(module).__version__)
    except ImportError:
        return "not installed"


def _loads() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except (AttributeError, OSError):
        return "?"


def machine(scratch: Path) -> list[tuple[str, str]]:
    """What the numbers were measured on (the versions as imported by this process)."""
    import ml_dtypes
    import numpy as np
    import torch

    import tensorbridge

    mem = _meminfo()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cuda = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    return [
        ("CPU", f"{_cpu_model()} ({platform.machine()})"),
        ("cores", f"{os.cpu_count()} logical CPUs, {usable} usable by this process"),
        (
            "memory",
            f"{fmt_bytes(mem.get('MemTotal', 0))} total, "
            f"{fmt_bytes(mem.get('MemAvailable', 0))} available at the start",
        ),
        ("load average (1 / 5 / 15 min)", f"{_loads()} at the start"),
        ("GPU", cuda),
        ("OS", platform.platform()),
        ("Python", platform.python_version()),
        ("torch", f"{torch.__version__} ({torch.get_num_threads()} intra-op threads)"),
        ("numpy", np.__version__),
        ("ml_dtypes", ml_dtypes.__version__),
        ("safetensors", _version("safetensors")),
        ("matplotlib", _version("matplotlib")),
        ("tensorbridge", tensorbridge.__version__),
        ("scratch disk", f"{fmt_bytes(shutil.disk_usage(scratch).free)} free at the start"),
    ]


# --- entry points -----------------------------------------------------------------------------


def run(
    out_dir: str | os.PathLike[str],
    quick: bool = False,
    *,
    mode: str | None = None,
    sections: Sequence[str] | None = None,
    scratch: str | os.PathLike[str] | None = None,
    log: TextIO | None = None,
) -> Path:
    """Run the benchmarks and write ``out_dir/report.md`` with its PNG plots.

    >>> import benchmarks
    >>> benchmarks.run("bench-out", quick=True)  # doctest: +SKIP
    PosixPath('bench-out/report.md')

    Args:
        out_dir: where the report and its plots go (created if missing).
        quick: the CI smoke run (goal: under 3 minutes on a quiet 2-core machine; its
            figures are not measurements).
        mode: "full", "quick" or "tiny" (the test suite's); overrides ``quick``.
        sections: keys of :data:`SECTIONS` to run (default: all).
        scratch: where temporary files go (default: the system's temporary directory);
            the full run's streaming section needs about 13 GiB there.
        log: a stream for progress lines (``python -m benchmarks`` passes stderr).

    Returns:
        The path of the report.

    Raises:
        BenchError: a section failed; the report is written anyway, with its traceback.
    """
    mode = mode or ("quick" if quick else "full")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    keys = list(SECTIONS if sections is None else sections)
    started = time.perf_counter()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tb-bench-", dir=scratch) as tmp:
        ctx = Context(mode=mode, scratch=Path(tmp), out_dir=out, log=log)
        described = machine(ctx.scratch)
        try:
            done = []
            for sec, error in _sections(ctx, keys):
                done.append(sec)
                if error:
                    errors.append(f"section {sec.number} ({sec.title}) failed:\n{error}")
        finally:
            ctx.close()
    seconds = time.perf_counter() - started
    described = [
        (k, f"{v}, {_loads()} at the end" if k.startswith("load average") else v)
        for k, v in described
    ]
    flag = {"full": "", "quick": " --quick", "tiny": ""}[mode]
    command = f"python -m benchmarks{flag} --out {out_dir}" + (" (tiny)" if mode == "tiny" else "")
    shown = [sec for sec in done if not sec.skipped]
    parts = [
        _FRONT_MATTER,
        "# tensorbridge benchmark report\n",
        _glance(ctx),
        _preamble(command, stamp, seconds, ctx, [s for s in done if s.skipped]),
        "## Machine\n\n" + table(["", "this run"], described) + "\n",
        *(sec.markdown() for sec in shown),
        _summary(ctx, seconds),
    ]
    report = out / "report.md"
    report.write_text("\n".join(parts), encoding="utf-8")
    if errors:
        raise BenchError(f"{errors[0].splitlines()[0]} (see {report})\n{errors[0]}")
    return report


# The report is a page of the documentation site: full width (no navigation or table of
# contents beside it), so that its tables fit a 1280-pixel window.
_FRONT_MATTER = "---\nhide:\n  - navigation\n  - toc\n---\n"


def _glance(ctx: Context) -> str:
    """What a user gains, measured in this run: the report opens with it."""
    if not ctx.highlights:
        return ""
    lines = [
        "What you gain against the calls you would otherwise write, on the machine "
        "described below (each figure is from a table further down):",
        "",
        *(f"- {h}" for h in ctx.highlights),
    ]
    return "\n".join(lines) + "\n"


def _preamble(
    command: str, stamp: str, seconds: float, ctx: Context, skipped: Sequence[Section] = ()
) -> str:
    smoke = (
        " This is a smoke run (smaller sizes, fewer repeats): it shows that the harness "
        "works, and its figures are not measurements."
        if ctx.mode != "full"
        else ""
    )
    plots = f"\n\nPlots were not drawn: {plot.MISSING}." if ctx.plots_missing else ""
    return (
        f"Generated by `{command}` on {stamp} in {seconds:.0f} s.{smoke} Every figure is "
        "measured in this one run, side by side with its peers: the candidates of a row "
        "are timed interleaved (round-robin, the order rotated each repeat) so that other "
        "load on the machine slows them alike, and each cell gives the **minimum / "
        "median** over the repeats. Ratios are given from both; PASS / FAIL against the "
        "goal each section states uses the minima. Rows that report memory run in a fresh "
        "child process whose memory is sampled from outside."
        f"{plots}{_skipped(skipped)}\n"
    )


def _skipped(skipped: Sequence[Section]) -> str:
    if not skipped:
        return ""
    names = "; ".join(f"{s.title} ({s.skipped})" for s in skipped)
    return f"\n\nNot run on this machine, so not shown: {names}."


def show(
    keys: Sequence[str] = SECTIONS,
    quick: bool = False,
    *,
    mode: str | None = None,
    scratch: str | os.PathLike[str] | None = None,
    out: TextIO | None = None,
    log: TextIO | None = None,
) -> int:
    """Run some sections and print their tables (no plots); 1 if one failed, else 0.

    >>> import benchmarks
    >>> benchmarks.show(["trees"], quick=True)  # doctest: +SKIP
    """
    mode = mode or ("quick" if quick else "full")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    out = out or sys.stdout
    started = time.perf_counter()
    smoke = " (--quick: smoke run)" if mode != "full" else ""
    with tempfile.TemporaryDirectory(prefix="tb-bench-", dir=scratch) as tmp:
        ctx = Context(mode=mode, scratch=Path(tmp), log=log)
        out.write(f"# tensorbridge benchmarks{smoke}\n\n")
        out.write(table(["", ""], machine(ctx.scratch)) + "\n\n")
        failed = False
        try:
            for sec, error in _sections(ctx, keys):
                failed = failed or error is not None
                if sec.skipped:
                    out.write(f"{sec.heading}\n\nNot run: {sec.skipped}.\n\n")
                else:
                    out.write(sec.markdown() + "\n")
                out.flush()
        finally:
            ctx.close()
    out.write(_summary(ctx, time.perf_counter() - started))
    return 1 if failed else 0
