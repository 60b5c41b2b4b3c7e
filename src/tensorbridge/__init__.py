"""tensorbridge: move data between PyTorch and NumPy without losing a bit or copying needlessly.

>>> import torch, tensorbridge as tb
>>> tb.to_numpy(torch.ones(2, dtype=torch.bfloat16)).dtype
dtype(bfloat16)
"""

from .convert import to_numpy, to_torch
from .dtypes import DTypeRow, dtype_table, numpy_dtype, resolve_dtype, torch_dtype
from .errors import (
    CopyRequiredError,
    NoDataError,
    ShapeMismatchError,
    TensorBridgeError,
    UnsupportedDtypeError,
    UnsupportedTensorError,
)

__version__ = "0.1.0"

__all__ = [
    "CopyRequiredError",
    "DTypeRow",
    "NoDataError",
    "ShapeMismatchError",
    "TensorBridgeError",
    "UnsupportedDtypeError",
    "UnsupportedTensorError",
    "__version__",
    "dtype_table",
    "numpy_dtype",
    "resolve_dtype",
    "to_numpy",
    "to_torch",
    "torch_dtype",
]
