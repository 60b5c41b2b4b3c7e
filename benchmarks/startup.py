"""Section 10: start-up time of the ``tensorbridge`` command line.

A command line that imports torch before it can print its ``--help`` makes every
invocation wait seconds. tensorbridge loads its public names on first use and its
commands import torch, NumPy and ml_dtypes only when they run, so ``--help`` should
cost about what the interpreter costs. Each row starts a fresh interpreter (the one
running this harness, with its environment), interleaved with the others; a bare
``python -c pass`` is the floor. Target: ``tensorbridge --help`` and
``tensorbridge inspect --help`` at most 5x ``python -c pass``.

Inspecting a safetensors file and converting it to ``.npz`` need NumPy but neither
torch nor ml_dtypes (the bfloat16 file's bytes are copied, its values never made); a
second table times them against the same command run after ``import torch`` (what
every command cost while the library imported torch throughout), side by side.
Target: at least 3x faster end to end on a small file. ``import numpy, ml_dtypes`` is
shown as a row of its own: what a command that needs a value of an ml_dtypes type
(a cast, a GGUF or Zarr write) pays before it starts.
"""

from __future__ import annotations

import contextlib
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
NO_TORCH_TARGET = 3.0  # a command that needs no torch against the same one after import torch


def _commands(path: str) -> dict[str, tuple[list[str], bool]]:
    """label: (argv, whether it has the start-up target)."""
    tb_cmd = [sys.executable, "-m", "tensorbridge"]
    return {
        "`python -c pass`": ([sys.executable, "-c", "pass"], False),
        # what every command that reads a file pays before tensorbridge runs at all
        "`python -c 'import numpy, ml_dtypes'`": (
            [sys.executable, "-c", "import numpy, ml_dtypes"],
            False,
        ),
        "`tensorbridge --help`": ([*tb_cmd, "--help"], True),
        "`tensorbridge inspect --help`": ([*tb_cmd, "inspect", "--help"], True),
        **{label: ([*tb_cmd, *args], False) for label, args in _file_commands(path).items()},
    }


def _file_commands(path: str) -> dict[str, list[str]]:
    """The commands that read a file without torch: label -> arguments."""
    npz = os.path.join(os.path.dirname(path), "model.npz")
    return {
        "`tensorbridge inspect model.safetensors`": ["inspect", path],
        "`tensorbridge convert model.safetensors model.npz`": [
            "convert", path, npz, "--overwrite", "--quiet",
        ],
    }  # fmt: skip


def _torch_first(args: list[str]) -> list[str]:
    """The command run after ``import torch``: what it cost while the library imported
    torch at every start."""
    code = f"import sys, torch; from tensorbridge.cli import main; sys.exit(main({args!r}))"
    return [sys.executable, "-c", code]


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
    repeats = ctx.pick(15, 3, 1)  # the rows after `import torch` take seconds each
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
    files = _file_commands(path)
    torch_first = {f"{label} after `import torch`": _torch_first(a) for label, a in files.items()}
    runners = {label: _runner(argv, env) for label, (argv, _) in commands.items()}
    runners.update({label: _runner(argv, env) for label, argv in torch_first.items()})
    st = ctx.measure(runners, repeats=repeats)
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
    sec.text(
        f"""The commands that need no torch against the same command run after `import
        torch` (what they cost while the library imported torch at every start), measured
        in the same interleaved runs. *Speedup* = time after `import torch` / time
        without, minima / medians; target >= {NO_TORCH_TARGET:g}x (minima)."""
    )
    rows = []
    for label in files:
        ratio = speedup(st[f"{label} after `import torch`"], st[label])
        ok = ratio[0] >= NO_TORCH_TARGET
        rows.append(
            [
                label,
                fmt_pair(st[label]),
                fmt_pair(st[f"{label} after `import torch`"]),
                fmt_ratio(ratio),
                f">= {NO_TORCH_TARGET:g}x",
                ctx.check(sec, f"no torch: {label.strip('`')}", ok),
            ]
        )
    sec.table(
        ["command", "without torch", "after `import torch`", "speedup", "target", "result"], rows
    )
    os.remove(path)
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(os.path.dirname(path), "model.npz"))
