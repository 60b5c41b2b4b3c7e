"""Section 10: start-up time of the ``tensorbridge`` command line.

A command line that imports torch before it can print its ``--help`` makes every
invocation wait seconds. tensorbridge loads its public names on first use and its
commands import torch, NumPy and ml_dtypes only when they run, so ``--help`` should
cost about what the interpreter costs. Each row starts a fresh interpreter (the one
running this harness, with its environment), interleaved with the others; a bare
``python -c pass`` is the floor. Target: ``tensorbridge --help`` and
``tensorbridge inspect --help`` at most 5x ``python -c pass``. Inspecting a file is
shown for scale: it needs the dtype table, so it imports torch.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

import tensorbridge as tb

from .core import Context, Section, fmt_pair, fmt_ratio, speedup

TITLE = "Start-up time of the command line"

HEAVY = ("torch", "numpy", "ml_dtypes")
TARGET = 5.0


def _commands(path: str) -> dict[str, tuple[list[str], bool]]:
    """label: (argv, whether it has the start-up target)."""
    tb_cmd = [sys.executable, "-m", "tensorbridge"]
    return {
        "`python -c pass`": ([sys.executable, "-c", "pass"], False),
        "`tensorbridge --help`": ([*tb_cmd, "--help"], True),
        "`tensorbridge inspect --help`": ([*tb_cmd, "inspect", "--help"], True),
        "`tensorbridge inspect model.safetensors`": ([*tb_cmd, "inspect", path], False),
    }


def _environment() -> dict[str, str]:
    """This process's environment, with bytecode caching on, as for an installed package."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _runner(argv: Sequence[str], env: dict[str, str]) -> Callable[[], Any]:
    def call() -> Any:
        return subprocess.run(
            argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True
        )

    return call


def imports_heavy(argv: Sequence[str], env: dict[str, str]) -> list[str]:
    """Which of torch / numpy / ml_dtypes the command imports (``-X importtime``)."""
    done = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    found = re.findall(r"^import time:.*\|\s*(\w+)$", done.stderr, flags=re.MULTILINE)
    return [name for name in HEAVY if name in found]


def run(ctx: Context, sec: Section) -> None:
    repeats = ctx.pick(15, 3, 1)  # every inspect row imports torch: seconds each
    sec.intro(
        f"""Wall time of a fresh process, min / median of {repeats} runs interleaved
        with the other rows. `tensorbridge` runs as `python -m tensorbridge` with the
        interpreter and environment of this run (the console script imports the same
        modules); bytecode caching is on, as for an installed package. *Ratio* = row
        time / `python -c pass` time, minima / medians; target <= {TARGET:g}x (minima)
        for the two `--help` rows. *Imports* = which of torch, NumPy and ml_dtypes the
        process loaded."""
    )
    path = str(ctx.scratch / "model.safetensors")
    tb.save({"weight": torch.zeros(64, 64, dtype=torch.bfloat16)}, path, progress=False)
    env = _environment()
    commands = _commands(path)
    st = ctx.measure(
        {label: _runner(argv, env) for label, (argv, _) in commands.items()}, repeats=repeats
    )
    base = st["`python -c pass`"]
    rows = []
    for label, (argv, targeted) in commands.items():
        ratio = speedup(st[label], base)  # row time / python -c pass time
        target = result = ""
        if targeted:
            target = f"<= {TARGET:g}x"
            result = ctx.check(sec, f"start-up: {label.strip('`')}", ratio[0] <= TARGET)
        heavy = imports_heavy(argv, env)
        rows.append(
            [
                label,
                fmt_pair(st[label]),
                fmt_ratio(ratio),
                ", ".join(heavy) or "none",
                target,
                result,
            ]
        )
    sec.table(["command", "min / median", "ratio", "imports", "target", "result"], rows)
    os.remove(path)
