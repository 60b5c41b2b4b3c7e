"""tensorbridge: move data between PyTorch and NumPy without losing a bit or copying needlessly.

>>> import torch, tensorbridge as tb
>>> tb.to_numpy(torch.ones(2, dtype=torch.bfloat16)).dtype
dtype(bfloat16)
"""

from .convert import to_numpy, to_torch
from .diagnostics import (
    CastReport,
    Comparison,
    Description,
    Stats,
    cast_report,
    compare,
    describe,
    stats,
)
from .dtypes import DTypeRow, dtype_table, numpy_dtype, resolve_dtype, torch_dtype
from .errors import (
    CopyRequiredError,
    DestinationExistsError,
    FormatError,
    NoDataError,
    ShapeMismatchError,
    TensorBridgeError,
    UnsupportedDtypeError,
    UnsupportedTensorError,
)
from .io import load, open, save
from .tree import tree_to_numpy, tree_to_torch

__version__ = "0.1.0"

__all__ = [
    "CastReport",
    "Comparison",
    "CopyRequiredError",
    "DTypeRow",
    "Description",
    "DestinationExistsError",
    "FormatError",
    "NoDataError",
    "ShapeMismatchError",
    "Stats",
    "TensorBridgeError",
    "UnsupportedDtypeError",
    "UnsupportedTensorError",
    "__version__",
    "cast_report",
    "compare",
    "describe",
    "dtype_table",
    "load",
    "numpy_dtype",
    "open",
    "resolve_dtype",
    "save",
    "stats",
    "to_numpy",
    "to_torch",
    "torch_dtype",
    "tree_to_numpy",
    "tree_to_torch",
]
