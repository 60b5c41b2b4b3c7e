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
  ``tb.cast_report`` shows what a cast would do before you run it. A cast to or from a
  dtype torch has no kernels for (int4 and the other sub-byte integers) or lacks (the
  NumPy-only rows: float8_e4m3, float6, ...) is ml_dtypes' own ``astype`` instead, and
  their copies move bytes (see :mod:`tensorbridge.dtypes`).
* **DTensors** are never read as if their storage held the whole tensor: pass
  ``gather=True`` for the whole tensor on every rank (a collective), or take
  :func:`local_shard` for this rank's block; by default they are refused with
  :class:`~tensorbridge.ShardedTensorError`.
* **Packed fp4.** torch's ``float4_e2m1fn_x2`` keeps two values a byte, element
  ``2i`` in the low nibble and ``2i + 1`` in the high nibble (the convention of
  torch's ``Float4_e2m1fn_x2.h`` and of safetensors' ``F4``); ml_dtypes'
  ``float4_e2m1fn`` keeps one a byte. Converting between them is an explicit
  pack/unpack: pass the other type as ``dtype=``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from . import _dtensor as dtensor
from ._plan import QUICK_NUMPY, QUICK_TORCH, QUICK_VIEWS, REFUSALS, run_numpy, run_torch
from .dtypes import DeviceLike, DTypeLike
from .errors import UnsupportedTensorError

__all__ = ["LocalShard", "local_shard", "to_numpy", "to_torch"]


def to_numpy(
    tensor: Any,
    *,
    dtype: DTypeLike | None = None,
    copy: bool | None = None,
    readonly: bool = False,
    out: np.ndarray | None = None,
    gather: bool = False,
) -> Any:
    """Convert a tensor to a NumPy array without losing a bit, sharing memory when possible.

    Args:
        tensor: a ``torch.Tensor`` (any dtype in the table, any device, strided,
            sparse, nested or quantized) or an ``nn.Parameter``; or any DLPack
            producer (JAX, CuPy, MLX, ...) or capsule, imported once, zero-copy where
            the device allows, and read-only when its memory is (or cannot say).
        dtype: ``None`` for the exact counterpart (bfloat16 -> ``ml_dtypes.bfloat16``),
            or a NumPy dtype, torch dtype or name ("f32") to cast with torch's kernel
            (ml_dtypes' ``astype`` to or from int4 and its kin, and into the types only
            NumPy has, such as ``ml_dtypes.float8_e4m3``). torch's int3 / uint5 / ...
            convert only with ``dtype=np.int8`` / ``np.uint8``: a view of their bytes.
        copy: ``None`` shares when possible, ``True`` always copies, ``False`` raises
            :class:`CopyRequiredError` when sharing is impossible.
        readonly: return an array that cannot be written through.
        out: a preallocated array of the same shape to write into (cast as needed,
            after the cast to ``dtype`` when both are given).
        gather: for a DTensor, gather the whole array onto every rank: a collective
            that every rank of its mesh must call (float8, e8m0 and bool included, on
            gloo too). Without it a DTensor raises :class:`ShardedTensorError`; see
            :func:`local_shard` for this rank's block alone. Other inputs ignore it.

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
    return run_numpy(tensor, dtype, copy, readonly, out, gather)


def to_torch(
    array: Any,
    *,
    dtype: DTypeLike | None = None,
    device: DeviceLike | None = None,
    copy: bool | None = None,
    requires_grad: bool = False,
    out: torch.Tensor | None = None,
    gather: bool = False,
) -> torch.Tensor:
    """Convert a NumPy array (or scalar) to a tensor without losing a bit, sharing when possible.

    Args:
        array: an ``np.ndarray`` of any dtype in the table (ml_dtypes included), a
            NumPy or ml_dtypes scalar, a ``np.memmap``, any DLPack producer (JAX,
            CuPy, MLX, ...) or capsule, or anything ``np.asarray`` takes. A producer is
            shared where the device allows; read-only memory (DLPack's read-only flag,
            or an unversioned capsule that cannot say) is copied like a read-only array.
        dtype: ``None`` for the exact counterpart, or a dtype / name to cast to; an
            array of a type torch lacks (``ml_dtypes.float8_e4m3``, ...) needs one (its
            refusal names the dtypes that hold every value exactly).
        device: where the tensor should live; accelerators are fed through pinned
            memory with ``non_blocking=True``.
        copy: ``None`` shares when possible, ``True`` always copies, ``False`` raises
            :class:`CopyRequiredError` when sharing is impossible (read-only memory,
            negative strides, byte-swapped data, a cast, a device transfer).
        requires_grad: make the result a leaf tensor that requires grad.
        out: a preallocated tensor of the same shape to write into (cast as needed,
            after the cast to ``dtype`` when both are given); it is returned itself, and
            ``requires_grad=True`` sets it on ``out``.
        gather: for a DTensor, the whole tensor on every rank (a collective every rank
            of its mesh must call), on the DTensor's device unless ``device=`` says
            otherwise; without it a DTensor raises :class:`ShardedTensorError`.

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
    return run_torch(array, dtype, device, copy, requires_grad, out, gather)


@dataclass(frozen=True)
class LocalShard:
    """This rank's block of a DTensor, as :func:`local_shard` returns it.

    Attributes:
        array: the local tensor as a NumPy array, zero-copy (bfloat16 and float8 as
            ml_dtypes arrays), so a write through it changes the DTensor.
        offset: where ``array`` starts in the global tensor, per dimension (torch's
            ``compute_local_shape_and_global_offset``; an empty block may start at the
            end of its dimension).
        global_shape: the shape of the whole tensor.
        primary: whether this rank holds the primary copy of its block: coordinate 0 on
            every ``Replicate`` mesh dimension. Writing only primary blocks writes every
            element exactly once.
    """

    array: np.ndarray
    offset: tuple[int, ...]
    global_shape: tuple[int, ...]
    primary: bool


def local_shard(
    tensor: Any,
    *,
    dtype: DTypeLike | None = None,
    copy: bool | None = None,
    readonly: bool = False,
) -> LocalShard:
    """This rank's block of a DTensor: a zero-copy NumPy view and where it sits.

    No communication: each rank calls it on its own. Shard placements on any
    dimension (uneven and empty shards included), Replicate, 2-D meshes and FSDP2 x TP's
    ``_StridedShard`` give one block each; a ``_StridedShard`` whose local tensor
    interleaves pieces of a dimension, and ``Partial`` placements, raise
    :class:`ShardedTensorError` (pass ``gather=True`` to ``to_numpy`` instead).

    Args:
        tensor: a ``torch.distributed.tensor.DTensor``.
        dtype / copy / readonly: as in :func:`to_numpy`, for the local tensor.

    Returns:
        A :class:`LocalShard`: ``array``, ``offset``, ``global_shape``, ``primary``.

    Raises:
        UnsupportedTensorError: ``tensor`` is not a DTensor.
        ShardedTensorError: a Partial placement, or a local tensor that is not one block.

    Example (on each rank of a 2-rank process group)::

        mesh = init_device_mesh("cpu", (2,))
        x = distribute_tensor(torch.arange(10.0), mesh, [Shard(0)])
        s = tb.local_shard(x)  # rank 1: s.array = [5, 6, 7, 8, 9], s.offset = (5,)
        at = tuple(slice(o, o + n) for o, n in zip(s.offset, s.array.shape))
        full[at] = s.array  # e.g. into a memory-mapped file of s.global_shape
    """
    if not dtensor.is_dtensor(tensor):
        raise UnsupportedTensorError(
            f"local_shard expects a DTensor, got {type(tensor).__qualname__}; pass "
            "tb.to_numpy(x) for a tensor that is whole on this rank"
        )
    block = dtensor.local_block(tensor)
    array = run_numpy(block.local, dtype, copy, readonly)
    return LocalShard(array, block.offset, block.global_shape, block.primary)
