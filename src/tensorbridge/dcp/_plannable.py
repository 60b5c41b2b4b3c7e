"""Refuse, on each rank, the dtypes that ``torch.distributed.checkpoint`` cannot plan.

DCP's default planner sizes every write item when it deduplicates the ranks' plans
(``dedup_save_plans`` in torch/distributed/checkpoint/_dedup_save_plans.py calls
``WriteItem.tensor_storage_size``, planner.py), through ``torch._utils._element_size``,
which asks ``torch.iinfo`` for an integer's width; ``torch.iinfo`` refuses torch's
sub-byte integers (``int1`` ... ``uint4``), so the coordinator's global plan fails with
"torch.iinfo() requires an integer input type" (torch 2.13). Both writers call
:func:`check_plannable` from ``prepare_local_plan``, which runs on every rank before
that global step, so the error names the tensor and a format that keeps it. The
types only NumPy has never reach DCP: they are no tensors.

>>> import torch
>>> check_plannable("w", torch.bfloat16)
>>> check_plannable("w", torch.float4_e2m1fn_x2)  # one byte to the planner: fine
>>> check_plannable("w", torch.int4)
Traceback (most recent call last):
...
tensorbridge.errors.UnsupportedDtypeError: tensor 'w' is torch.int4, which \
torch.distributed.checkpoint cannot plan (its planner sizes items with torch.iinfo, \
which refuses sub-byte integers); save it to .npy or .npz, which keep int4 as it is
"""

from __future__ import annotations

import torch

from .._tensorfile import keeping
from ..dtypes import BY_TORCH, SHELL_BY_TORCH
from ..errors import UnsupportedDtypeError


def check_plannable(name: str, dtype: torch.dtype) -> None:
    """Raise if DCP's planner cannot size a tensor of ``dtype`` (see the module docstring):
    a sub-byte integer, row (``int4``) or shell (``int3``: the fix views its bytes)."""
    row = BY_TORCH.get(dtype)
    if row is not None and not row.kernels:
        fix = keeping(row)
    elif dtype in SHELL_BY_TORCH:
        fix = f"save x.view(torch.{SHELL_BY_TORCH[dtype].name}), its bytes as torch holds them"
    else:
        return
    raise UnsupportedDtypeError(
        f"tensor {name!r} is {dtype}, which torch.distributed.checkpoint cannot plan (its "
        f"planner sizes items with torch.iinfo, which refuses sub-byte integers); {fix}"
    )
