"""Start-up cost: ``import tensorbridge`` and every ``--help`` load no heavy library.

The public names are imported on first use (PEP 562), and the command line imports
torch, NumPy, ml_dtypes and the library's own heavy modules only inside the commands
that need them, so ``tensorbridge --help`` answers in the time of a bare interpreter
(the benchmark report times it; ``benchmarks/startup.py``). Inspecting a safetensors
file and converting it to ``.npz`` load NumPy but neither torch nor ml_dtypes
(``tests/test_no_torch.py`` covers every format). Each check runs a fresh interpreter
with ``-X importtime``, which lists every module the process imported.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tensorbridge as tb

COMMANDS = ["inspect", "convert", "compare", "cast-report", "demo"]
# what --help must not load: the frameworks, and the modules that import them
HEAVY = ("torch", "numpy", "ml_dtypes", "optree", "tqdm")
HEAVY += tuple(f"tensorbridge.{m}" for m in ("convert", "dtypes", "io", "diagnostics", "tree"))
_IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$")


def imported_by(*args: str) -> tuple[set[str], str]:
    """The modules ``python -X importtime ARGS`` imported, and what it printed on stdout."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    modules = {m.group(1) for line in done.stderr.splitlines() if (m := _IMPORTED.match(line))}
    assert "tensorbridge" in modules, done.stderr[-2000:]
    return modules, done.stdout


def heavy(modules: set[str]) -> list[str]:
    """The modules of ``HEAVY`` (or inside them) among ``modules``."""
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


@pytest.mark.parametrize("argv", [["--help"], *([c, "--help"] for c in COMMANDS)], ids=" ".join)
def test_help_imports_no_heavy_module(argv: list[str]) -> None:
    modules, out = imported_by("-m", "tensorbridge", *argv)
    prog = " ".join(["tensorbridge", *argv[:-1]])
    assert out.startswith(f"usage: {prog}")
    assert heavy(modules) == []
    if argv == ["--help"]:
        assert all(f"    {c}" in out for c in COMMANDS)


def test_import_tensorbridge_loads_names_on_first_use() -> None:
    code = (
        "import sys, tensorbridge as tb\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))\n"
        "print(tb.to_numpy.__module__, 'torch' in sys.modules)\n"
    )
    modules, out = imported_by("-c", code)
    assert heavy(modules) != []  # the second line loaded them
    assert out.splitlines() == ["[]", "tensorbridge.convert True"]


def test_lazy_names_are_the_real_objects() -> None:
    from tensorbridge import convert, diagnostics, errors, io, tree

    assert tb.to_numpy is convert.to_numpy and tb.tree_to_torch is tree.tree_to_torch
    assert tb.open is io.open and tb.Stats is diagnostics.Stats
    assert tb.FormatError is errors.FormatError
    assert set(tb.__all__) <= set(dir(tb))
    assert not {"importlib", "TYPE_CHECKING", "Any"} & set(dir(tb))
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        tb.nope  # noqa: B018 - the attribute access is the test


@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_inspect_and_convert_of_a_safetensors_file_import_no_torch(
    tmp_path: Path, command: str
) -> None:
    src = tmp_path / "model.safetensors"
    tb.save({"w": np.ones((2, 3), np.float32)}, src)
    argv = (
        ["inspect", str(src)] if command == "inspect" else ["convert", str(src), str(src) + ".npz"]
    )
    modules, out = imported_by("-m", "tensorbridge", *argv)
    assert "numpy" in modules and "tensorbridge.io.safetensors" in modules
    assert sorted(m for m in modules if m.split(".")[0] in ("torch", "ml_dtypes")) == []
    assert (
        (str(src) in out) if command == "inspect" else (tmp_path / "model.safetensors.npz").exists()
    )
