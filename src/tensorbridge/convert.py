"""``to_numpy`` and ``to_torch``: zero-copy when possible, one copy when not, never a silent loss.

The rules, in one place:

* **Bits.** Without ``dtype=``, the result holds exactly the input's bits, in the
  counterpart dtype from the table in :mod:`tensorbridge.dtypes` (bfloat16 and the
  float8 family become ml_dtypes arrays, not float32).
* **Copies** follow NumPy 2's ``copy=``: ``None`` shares memory when possible and
  copies when it must, ``True`` always returns independent memory, ``False`` never
  copies and raises :class:`~tensorbridge.CopyRequiredError` saying why a copy is
  needed. A copy is needed for a device transfer, a dtype cast, a conjugate or
  negative bit, a read-only / byte-swapped / negatively-strided array.
* **Memory safety.** A shared result keeps its owner alive (the array's ``base`` is
  the tensor; the tensor holds the array). A read-only array is never aliased by a
  writable tensor: by default it is copied; ``readonly=True`` gives the reverse
  protection on the NumPy side.
* **Casts** (``dtype=``) run torch's conversion kernels into memory allocated by
  NumPy, so they are bit-identical to ``Tensor.to()``: round-to-nearest-even, every
  NaN narrowed to bfloat16 becomes 0xFFFF, float8_e4m3fn saturates overflow and
  inf to ±448 (torch >= 2.13; NaN before), float8_e5m2 overflows to inf.
  ``tb.cast_report`` shows what a cast would do before you run it.
* **Packed fp4.** torch's ``float4_e2m1fn_x2`` keeps two values a byte, element
  ``2i`` in the low nibble and ``2i + 1`` in the high nibble (the convention of
  torch's ``Float4_e2m1fn_x2.h`` and of safetensors' ``F4``); ml_dtypes'
  ``float4_e2m1fn`` keeps one a byte. Converting between them is an explicit
  pack/unpack: pass the other type as ``dtype=``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._plan import QUICK_NUMPY, QUICK_TORCH, QUICK_VIEWS, REFUSALS, run_numpy, run_torch
from .dtypes import DeviceLike, DTypeLike

__all__ = ["to_numpy", "to_torch"]


def to_numpy(
    tensor: Any,
    *,
    dtype: DTypeLike | None = None,
    copy: bool | None = None,
    readonly: bool = False,
    out: np.ndarray | None = None,
) -> Any:
    """Convert a tensor to a NumPy array without losing a bit, sharing memory when possible.

    Args:
        tensor: a ``torch.Tensor`` (any dtype in the table, any device, strided,
            sparse, nested or quantized) or an ``nn.Parameter``; or any DLPack
            producer (JAX, CuPy, MLX, ...) or capsule, imported once, zero-copy where
            the device allows, and read-only when its memory is (or cannot say).
        dtype: ``None`` for the exact counterpart (bfloat16 -> ``ml_dtypes.bfloat16``),
            or a NumPy dtype, torch dtype or name ("f32") to cast with torch's kernel.
        copy: ``None`` shares when possible, ``True`` always copies, ``False`` raises
            :class:`CopyRequiredError` when sharing is impossible.
        readonly: return an array that cannot be written through.
        out: a preallocated array of the same shape to write into (cast as needed,
            after the cast to ``dtype`` when both are given).

    Returns:
        An ``np.ndarray`` (its base keeps the tensor's memory alive); a
        ``scipy.sparse`` array for sparse tensors; a list of arrays for nested tensors;
        ``out`` when given.

    >>> import torch, tensorbridge as tb
    >>> t = torch.tensor([1.5, -0.0], dtype=torch.bfloat16)
    >>> a = tb.to_numpy(t)
    >>> a.dtype, a.tobytes() == t.view(torch.uint8).numpy().tobytes()
    (dtype(bfloat16), True)
    """
    if out is None and type(tensor) is torch.Tensor:  # the planner's quick plan for the dtype
        try:
            if dtype is None and copy is None and not readonly:
                quick = QUICK_VIEWS.get(tensor.dtype)
            else:
                quick = QUICK_NUMPY.get((tensor.dtype, dtype, copy, readonly))
            if quick is not None:
                return quick(tensor, None)
        except REFUSALS:
            pass  # a flag the quick plan does not cover: the full signature decides
    return run_numpy(tensor, dtype, copy, readonly, out)


def to_torch(
    array: Any,
    *,
    dtype: DTypeLike | None = None,
    device: DeviceLike | None = None,
    copy: bool | None = None,
    requires_grad: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Convert a NumPy array (or scalar) to a tensor without losing a bit, sharing when possible.

    Args:
        array: an ``np.ndarray`` of any dtype in the table (ml_dtypes included), a
            NumPy or ml_dtypes scalar, a ``np.memmap``, any DLPack producer (JAX,
            CuPy, MLX, ...) or capsule, or anything ``np.asarray`` takes. A producer is
            shared where the device allows; read-only memory (DLPack's read-only flag,
            or an unversioned capsule that cannot say) is copied like a read-only array.
        dtype: ``None`` for the exact counterpart, or a dtype / name to cast to.
        device: where the tensor should live; accelerators are fed through pinned
            memory with ``non_blocking=True``.
        copy: ``None`` shares when possible, ``True`` always copies, ``False`` raises
            :class:`CopyRequiredError` when sharing is impossible (read-only memory,
            negative strides, byte-swapped data, a cast, a device transfer).
        requires_grad: make the result a leaf tensor that requires grad.
        out: a preallocated tensor of the same shape to write into (cast as needed,
            after the cast to ``dtype`` when both are given); it is returned itself, and
            ``requires_grad=True`` sets it on ``out``.

    >>> import numpy as np, ml_dtypes, tensorbridge as tb
    >>> a = np.array([1.0, 2.5], dtype=ml_dtypes.bfloat16)
    >>> t = tb.to_torch(a)
    >>> t.dtype, np.shares_memory(a, tb.to_numpy(t))
    (torch.bfloat16, True)
    """
    if (
        type(array) is np.ndarray
        and dtype is None
        and device is None
        and not copy
        and out is None
        and not requires_grad
        and array.flags.writeable
    ):  # the planner's quick plan for the dtype
        quick = QUICK_TORCH.get(array.dtype)
        if quick is not None:
            try:
                made: torch.Tensor = quick(array, None)
                return made
            except REFUSALS:
                pass  # strides torch cannot view: the full signature decides
    return run_torch(array, dtype, device, copy, requires_grad, out)
