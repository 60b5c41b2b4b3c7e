"""The public surface: pinned names, a quiet import that changes nothing, runnable examples."""

from __future__ import annotations

import doctest
import importlib
import subprocess
import sys
import textwrap

import pytest

import tensorbridge as tb

# Pinned on purpose: a change to the public names must change this list too.
PUBLIC = [
    "CastReport",
    "Comparison",
    "CopyRequiredError",
    "DTypeRow",
    "DequantizedCheckpoint",
    "Description",
    "DestinationError",
    "DestinationExistsError",
    "FormatError",
    "InvalidArgumentError",
    "InvalidNameError",
    "LinkError",
    "LocalShard",
    "MissingExtraError",
    "NoDataError",
    "QuantReport",
    "QuantizationError",
    "QuantizedCheckpoint",
    "QuantizedParts",
    "QuantizedTensorError",
    "SafetensorsReader",
    "SafetensorsWriter",
    "ShapeMismatchError",
    "ShardedTensorError",
    "Stats",
    "TensorBridgeError",
    "UncommittedCheckpointError",
    "UnsupportedDtypeError",
    "UnsupportedTensorError",
    "Verification",
    "ZarrReader",
    "ZarrWriter",
    "__version__",
    "cast_report",
    "compare",
    "dequantize",
    "dequantize_checkpoint",
    "describe",
    "dtype_table",
    "load",
    "local_shard",
    "numpy_dtype",
    "open",
    "quant_report",
    "quantize",
    "quantize_checkpoint",
    "resolve_dtype",
    "save",
    "stats",
    "to_numpy",
    "to_torch",
    "torch_dtype",
    "tree_to_numpy",
    "tree_to_torch",
    "verify",
]


def test_all_is_pinned() -> None:
    assert sorted(tb.__all__) == PUBLIC
    assert len(tb.__all__) == len(set(tb.__all__))


def test_every_public_name_exists() -> None:
    for name in tb.__all__:
        assert getattr(tb, name) is not None, name
    assert isinstance(tb.__version__, str) and tb.__version__.count(".") == 2


_IMPORT_CHECK = textwrap.dedent(
    """
    import sys
    import numpy as np
    import torch

    def surface(obj):
        return {k: v for k, v in vars(obj).items()}

    tensor_before = surface(torch.Tensor)
    ndarray_attrs = set(dir(np.ndarray))
    torch_before, numpy_before = surface(torch), surface(np)
    numpy_method = torch.Tensor.numpy
    from_numpy = torch.from_numpy

    import tensorbridge

    problems = []
    for optional in ("scipy", "matplotlib"):
        if optional in sys.modules:
            problems.append(f"import tensorbridge imported {optional}")
    if torch.Tensor.numpy is not numpy_method or torch.from_numpy is not from_numpy:
        problems.append("torch.Tensor.numpy or torch.from_numpy was replaced")
    if surface(torch.Tensor) != tensor_before:
        problems.append("torch.Tensor changed")
    if set(dir(np.ndarray)) != ndarray_attrs:
        problems.append("numpy.ndarray changed")
    changed = [k for k, v in torch_before.items() if vars(torch).get(k) is not v]
    changed += [k for k, v in numpy_before.items() if vars(np).get(k) is not v]
    if changed:
        problems.append(f"torch / numpy attributes replaced: {changed}")
    print("; ".join(problems) or "ok")
    """
)


def test_every_public_error_has_its_api_entry() -> None:
    # the site's API page renders these; a missing one breaks every cross-reference to it
    from pathlib import Path

    page = (Path(__file__).parents[1] / "docs" / "api" / "errors.md").read_text()
    errors = [name for name in PUBLIC if name.endswith("Error")]
    assert [name for name in errors if f"::: tensorbridge.{name}\n" not in page] == []


def test_import_is_quiet_lazy_and_changes_nothing() -> None:
    # -W error turns any warning raised while importing into a failure.
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", _IMPORT_CHECK],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.strip() == "ok"


DOCUMENTED = [
    "tensorbridge",
    "tensorbridge.convert",
    "tensorbridge._atomic",
    "tensorbridge._entry_points",
    "tensorbridge._commit",
    "tensorbridge._tensorfile",
    "tensorbridge._ml_cast",
    "tensorbridge._packed_dtypes",
    "tensorbridge._plan_numpy_runs",
    "tensorbridge.dcp._hf_layout",
    "tensorbridge.dcp._plannable",
    "tensorbridge.dcp.safetensors",
    "tensorbridge.diagnostics._cast",
    "tensorbridge.diagnostics._compare",
    "tensorbridge.diagnostics._describe",
    "tensorbridge.diagnostics._stats",
    "tensorbridge.dtypes",
    "tensorbridge.errors",
    "tensorbridge.io",
    "tensorbridge.io._common",
    "tensorbridge.io.safetensors_header",
    "tensorbridge.io.npy",
    "tensorbridge.io._npy_header",
    "tensorbridge.io.pickle_machine",
    "tensorbridge.io.safetensors",
    "tensorbridge.io._safetensors_plan",
    "tensorbridge.io._safetensors_shards",
    "tensorbridge.io.torch_archive",
    "tensorbridge.io.verify",
    "tensorbridge.cli._errors",
    "tensorbridge.checkpoint",
    "tensorbridge.checkpoint.config",
    "tensorbridge.checkpoint.dequantize",
    "tensorbridge.checkpoint.quantize",
    "tensorbridge.tree",
    "tensorbridge._tree_paths",
]


@pytest.mark.parametrize("module", DOCUMENTED)
def test_docstring_examples_run(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)

    assert result.attempted > 0
    assert result.failed == 0
