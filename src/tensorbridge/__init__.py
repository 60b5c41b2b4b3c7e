"""tensorbridge: move data between PyTorch and NumPy without losing a bit or copying needlessly.

>>> import torch, tensorbridge as tb
>>> tb.to_numpy(torch.ones(2, dtype=torch.bfloat16)).dtype
dtype(bfloat16)

The public names are loaded on first use (PEP 562), so ``import tensorbridge`` (and
with it every ``tensorbridge`` command's ``--help``) does not import torch, NumPy and
ml_dtypes until a name that needs them is asked for. The ``TYPE_CHECKING`` imports
below are the same names, for type checkers and IDEs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .checkpoint import (
        DequantizedCheckpoint,
        QuantizedCheckpoint,
        dequantize_checkpoint,
        quantize_checkpoint,
    )
    from .convert import LocalShard, local_shard, to_numpy, to_torch
    from .dcp.safetensors import SafetensorsReader, SafetensorsWriter
    from .dcp.zarr import ZarrReader, ZarrWriter
    from .diagnostics import (
        CastReport,
        Comparison,
        Description,
        QuantReport,
        Stats,
        cast_report,
        compare,
        describe,
        quant_report,
        stats,
    )
    from .dtypes import DTypeRow, dtype_table, numpy_dtype, resolve_dtype, torch_dtype
    from .errors import (
        CopyRequiredError,
        DestinationError,
        DestinationExistsError,
        FormatError,
        InvalidArgumentError,
        InvalidNameError,
        LinkError,
        MissingExtraError,
        NoDataError,
        QuantizationError,
        QuantizedTensorError,
        ShapeMismatchError,
        ShardedTensorError,
        TensorBridgeError,
        UncommittedCheckpointError,
        UnsupportedDtypeError,
        UnsupportedTensorError,
    )
    from .io import load, open, save
    from .io.verify import Verification, verify
    from .quant import dequantize, quantize
    from .tree import QuantizedParts, tree_to_numpy, tree_to_torch

__version__ = "0.1.0"

__all__ = [
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

# Where each public name lives: the submodule is imported when the name is first used.
_HOME = {
    **dict.fromkeys(["LocalShard", "local_shard", "to_numpy", "to_torch"], ".convert"),
    **dict.fromkeys(
        [
            "CastReport",
            "Comparison",
            "Description",
            "QuantReport",
            "Stats",
            "cast_report",
            "compare",
            "describe",
            "quant_report",
            "stats",
        ],
        ".diagnostics",
    ),
    **dict.fromkeys(
        ["DTypeRow", "dtype_table", "numpy_dtype", "resolve_dtype", "torch_dtype"], ".dtypes"
    ),
    **dict.fromkeys(
        [
            "CopyRequiredError",
            "DestinationError",
            "DestinationExistsError",
            "FormatError",
            "InvalidArgumentError",
            "LinkError",
            "InvalidNameError",
            "MissingExtraError",
            "NoDataError",
            "QuantizationError",
            "QuantizedTensorError",
            "ShapeMismatchError",
            "ShardedTensorError",
            "TensorBridgeError",
            "UncommittedCheckpointError",
            "UnsupportedDtypeError",
            "UnsupportedTensorError",
        ],
        ".errors",
    ),
    **dict.fromkeys(["ZarrReader", "ZarrWriter"], ".dcp.zarr"),
    **dict.fromkeys(["load", "open", "save"], ".io"),
    **dict.fromkeys(["SafetensorsReader", "SafetensorsWriter"], ".dcp.safetensors"),
    **dict.fromkeys(["dequantize", "quantize"], ".quant"),
    **dict.fromkeys(
        [
            "DequantizedCheckpoint",
            "QuantizedCheckpoint",
            "dequantize_checkpoint",
            "quantize_checkpoint",
        ],
        ".checkpoint",
    ),
    **dict.fromkeys(["Verification", "verify"], ".io.verify"),
    **dict.fromkeys(["QuantizedParts", "tree_to_numpy", "tree_to_torch"], ".tree"),
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    # what dir() listed when every name was imported eagerly: the public names, the
    # dunders and the submodules loaded so far, not this module's own helpers
    return sorted((set(globals()) - _HELPERS) | set(__all__))


_HELPERS = {"TYPE_CHECKING", "Any", "annotations", "importlib", "_HOME", "_HELPERS"}
