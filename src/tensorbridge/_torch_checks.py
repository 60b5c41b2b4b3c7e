"""Is this a torch tensor, module or dtype? Answered without importing torch.

Importing torch costs about 2.7 s, and reading a file's header or copying its arrays
to another format needs none of it. No object can be a torch tensor before torch is
imported, so these checks look in ``sys.modules`` first (as einops and
array-api-compat detect frameworks): code on NumPy's paths asks them, and torch is
imported only by the code that makes or converts tensors.

>>> import numpy as np
>>> is_tensor(np.zeros(2)), is_module(np.zeros(2))
(False, False)
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeGuard

if TYPE_CHECKING:
    import torch

__all__ = ["is_module", "is_tensor", "is_torch_dtype", "loaded"]


def loaded() -> ModuleType | None:
    """torch, if something imported it already; else None (and torch stays unimported)."""
    return sys.modules.get("torch")


def is_tensor(x: Any) -> TypeGuard[torch.Tensor]:
    """``isinstance(x, torch.Tensor)``, False without an import while torch is not loaded."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def is_module(x: Any) -> TypeGuard[torch.nn.Module]:
    """``isinstance(x, torch.nn.Module)``, without importing torch."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.nn.Module)


def is_torch_dtype(x: Any) -> TypeGuard[torch.dtype]:
    """``isinstance(x, torch.dtype)``, without importing torch."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.dtype)
