"""The conversion plan: share, copy, cast, transfer or refuse, and why, decided in one place.

:func:`plan_numpy` and :func:`plan_torch` look at a value (a tensor or an array), the
requested ``dtype`` / ``device`` / ``copy`` / ``readonly`` and whether an ``out=`` is
given, and return a :class:`Plan`: the steps the conversion takes (``view``, ``copy``,
``cast``, ``transfer``, ``resolve``, ``unpack``, ...), the reason the input cannot be
shared when it cannot, and the executor that carries the steps out. Where the
conversion is impossible, or needs a copy that ``copy=False`` forbids, planning
raises the one error for that case. Nothing else in the package decides copy
semantics: ``to_numpy`` / ``to_torch`` run plans, the tree functions plan once per
leaf signature and batch the copies the plans call for, the file readers call the
converters, and ``describe`` reports plans.

A plan depends only on the value's *signature* (its type, dtype, device, layout,
autograd and conj/neg flags; for arrays the dtype, writability and whether torch
can view its strides), never on its values or shape, so plans are cached by
signature: converting a thousand tensors of three kinds makes three decisions.

The plan is four modules, layered so that no import runs in a circle; the rest of
the package imports this one. :mod:`tensorbridge._plan_base` holds the record, the
signatures, the caches and the shared rules, :mod:`tensorbridge._plan_numpy` and
:mod:`tensorbridge._plan_torch` decide each direction, and this module runs plans
(:func:`run_numpy`, :func:`run_torch`, DLPack producers included) and re-exports
what the others import.

>>> import torch
>>> p = plan_numpy(torch.zeros(2, dtype=torch.complex64).conj())
>>> p.steps, p.reason
(('resolve',), 'has its conjugate or negative bit set (resolving it writes new values)')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ._plan_base import (
    QUICK_NUMPY,
    QUICK_SHARES,
    QUICK_TORCH,
    QUICK_VIEWS,
    REFUSALS,
    Plan,
    Run,
    check_cast,
    check_out,
    decisions,
    device_of,
    forget,
    needs_copy,
    numpy_row,
    plain_tensor,
    signature,
    strides_state,
)
from ._plan_numpy import decide_numpy, plan_numpy
from ._plan_torch import decide_torch, finish_tensor, plan_torch
from ._torch_checks import is_tensor
from .errors import UnsupportedTensorError

if TYPE_CHECKING:
    import torch

__all__ = [
    "QUICK_NUMPY",
    "QUICK_SHARES",
    "QUICK_TORCH",
    "QUICK_VIEWS",
    "REFUSALS",
    "Plan",
    "Run",
    "check_cast",
    "check_out",
    "decide_numpy",
    "decide_torch",
    "decisions",
    "device_of",
    "finish_tensor",
    "forget",
    "needs_copy",
    "numpy_row",
    "plain_tensor",
    "plan_numpy",
    "plan_torch",
    "run_numpy",
    "run_torch",
    "signature",
    "strides_state",
]


# --- running plans ----------------------------------------------------------------------------


def run_numpy(
    x: Any,
    dtype: Any = None,
    copy: bool | None = None,
    readonly: bool = False,
    out: Any = None,
    gather: bool = False,
) -> Any:
    """Plan ``to_numpy`` for ``x`` and run the plan (``to_numpy`` tries the quick plan first)."""
    if out is not None and not isinstance(out, np.ndarray):
        raise UnsupportedTensorError(
            f"to_numpy: out= is a {type(out).__qualname__}, not a np.ndarray; pass "
            "out=np.empty(shape, dtype), or use tb.to_torch(x, out=tensor) for a tensor"
        )
    if _maybe_producer(x):  # JAX, CuPy, MLX, ... or a capsule: import once, then plan
        from . import _dlpack as dlpack

        if dlpack.is_producer(x):
            return dlpack.numpy_from(
                x, _numpy_call, dtype=dtype, copy=copy, readonly=readonly, out=out
            )
    return plan_numpy(x, dtype, copy, readonly, out is not None, gather).run(x, out)


def _maybe_producer(x: Any) -> bool:
    """False for what has a path of its own (an array, a NumPy scalar, a tensor): only the
    rest may be a DLPack producer, asked of :mod:`tensorbridge._dlpack` (which imports torch)."""
    return not isinstance(x, (np.ndarray, np.generic)) and not is_tensor(x)


def _numpy_call(x: Any, *, dtype: Any, copy: bool | None, readonly: bool, out: Any) -> Any:
    return plan_numpy(x, dtype, copy, readonly, out is not None).run(x, out)


def _torch_call(
    x: Any,
    *,
    dtype: Any,
    device: Any,
    copy: bool | None,
    requires_grad: bool,
    out: Any,
    gather: bool = False,
) -> torch.Tensor:
    plan = plan_torch(x, dtype, device, copy, requires_grad, out is not None, gather)
    made: torch.Tensor = plan.run(x, out)
    return made


def run_torch(
    x: Any,
    dtype: Any = None,
    device: Any = None,
    copy: bool | None = None,
    requires_grad: bool = False,
    out: Any = None,
    gather: bool = False,
) -> torch.Tensor:
    """Plan ``to_torch`` for ``x`` (an array, a tensor, or what ``np.asarray`` takes); run it.

    ``to_torch`` tries the quick plan first.
    """
    import torch

    if out is not None and not isinstance(out, torch.Tensor):
        raise UnsupportedTensorError(
            f"to_torch: out= is a {type(out).__qualname__}, not a torch.Tensor; pass "
            "out=torch.empty(shape, dtype=...), or use tb.to_numpy(x, out=array) for an array"
        )
    if _maybe_producer(x):  # JAX, CuPy, MLX, ... or a capsule: import once, then plan
        from . import _dlpack as dlpack

        if dlpack.is_producer(x):
            return dlpack.torch_from(
                x, _torch_call, dtype=dtype, device=device, copy=copy,
                requires_grad=requires_grad, out=out,
            )  # fmt: skip
    if not isinstance(x, (np.ndarray, torch.Tensor)):
        if x is None or isinstance(x, (Mapping, str, bytes)):
            raise UnsupportedTensorError(
                f"to_torch expects an array, a number or a nested list of numbers, got "
                f"{type(x).__qualname__}; pass tb.tree_to_torch(x) for a dict of arrays"
            )
        x = np.asarray(x)
    return _torch_call(
        x, dtype=dtype, device=device, copy=copy, requires_grad=requires_grad, out=out,
        gather=gather,
    )  # fmt: skip
