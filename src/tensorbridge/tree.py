"""``tree_to_numpy`` / ``tree_to_torch``: convert every tensor or array in a nested structure.

They map ``to_numpy`` / ``to_torch`` over a pytree's leaves and promise four more things:

* **Structure.** dict, OrderedDict, defaultdict, list, tuple, namedtuple, deque and
  dataclasses keep their types, keys, order and fields; other leaves (ints, strings,
  ``None``, ...) come back as the very same objects. Flattening is optree's (the C++
  pytree library behind ``torch.utils._cxx_pytree``); each dataclass type met is
  registered in optree's ``"tensorbridge"`` namespace, invisible to other optree users.
* **Ties.** Leaves that are one object, or views overlapping one memory, come back as
  views of one converted buffer with the same offsets and strides, also after a copy,
  a cast or a device transfer; one input object becomes one output object.
* **Key paths.** An error keeps its class and is prefixed with the failing leaf's path,
  ``at ['encoder']['layers'][3]['weight']: ...`` (mapping keys repr'd, sequence
  indices as ints, namedtuple and dataclass fields as ``.name``).
* **Batched transfers.** Device leaves reach the host through one pinned staging
  buffer, every copy ``non_blocking``, one wait per device for the whole tree; host
  leaves bound for a device are staged likewise, and nothing waits.

A quantized tensor subclass leaf (torchao's ``MXTensor``, ``NVFP4Tensor``,
``Float8Tensor``, ...) follows ``to_numpy`` / ``to_torch``: refused without a cast,
dequantized by ``dtype=`` or ``float_dtype=``; ``keep_quantized=True`` instead gives
its parts, a :class:`QuantizedParts`, and the cast applies to the other leaves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optree
import torch

from ._staging import Cursor
from ._tree_passes import ARRAY_TYPES, Cast, QuantizedParts, numpy_pass, torch_pass
from ._tree_paths import flatten, with_path
from ._tree_paths import flatten_with_paths as flatten_with_paths  # diagnostics import it here
from .dtypes import DeviceLike, DTypeLike

__all__ = ["QuantizedParts", "tree_to_numpy", "tree_to_torch"]


# --- public API -------------------------------------------------------------------------------


def tree_to_numpy(
    tree: Any,
    *,
    dtype: DTypeLike | None = None,
    float_dtype: DTypeLike | None = None,
    copy: bool | None = None,
    readonly: bool = False,
    gather: bool = False,
    keep_quantized: bool = False,
) -> Any:
    """Convert every tensor in a nested structure to a NumPy array, keeping the structure.

    Args:
        tree: any nesting of dict / OrderedDict / defaultdict / list / tuple / namedtuple /
            deque / dataclass. ``torch.Tensor`` leaves are converted; ``np.ndarray``
            leaves follow the same ``dtype`` / ``copy`` / ``readonly`` contract; every
            other leaf is returned as is.
        dtype: cast every array leaf (a NumPy dtype, torch dtype or name).
        float_dtype: cast only the floating-point leaves (bfloat16, float16, float8, ...),
            leaving integer, bool and complex leaves alone.
        copy: as in :func:`~tensorbridge.to_numpy`: ``None`` shares memory when possible,
            ``True`` always copies, ``False`` raises when a leaf needs a copy.
        readonly: return arrays that cannot be written through.
        gather: gather every DTensor leaf whole onto every rank, as in
            :func:`~tensorbridge.to_numpy`: one collective per DTensor leaf, in leaf
            order, so every rank must pass the same structure. Without it a DTensor
            leaf raises :class:`~tensorbridge.ShardedTensorError`.
        keep_quantized: turn each quantized tensor subclass leaf (torchao's
            ``MXTensor``, ``NVFP4Tensor``, ``Float8Tensor``, ...) into a
            :class:`QuantizedParts` of its codes and scales as arrays (ml_dtypes for
            float8 / e8m0), zero-copy on the host. Without it such a leaf raises
            :class:`~tensorbridge.QuantizedTensorError` unless ``dtype=`` or
            ``float_dtype=`` asks for it dequantized.

    Returns:
        The same structure with arrays in place of tensors. Tied leaves (one object, or
        views overlapping one memory) stay tied. Arrays that came from a device are
        views of one pinned host buffer, released with the last of them.

    Raises:
        TypeError: both ``dtype`` and ``float_dtype`` were given.
        TensorBridgeError: a leaf cannot be converted; the message starts with its key
            path (``at ['encoder']['layers'][3]['weight']: ...``).

    >>> import torch, tensorbridge as tb
    >>> sd = {"w": torch.ones(2, dtype=torch.bfloat16), "steps": torch.tensor(3)}
    >>> out = tb.tree_to_numpy(sd, float_dtype="float32")
    >>> out["w"].dtype, out["steps"].dtype
    (dtype('float32'), dtype('int64'))
    """
    cast = Cast.of(dtype, float_dtype)

    def convert(leaves: list[Any], cursor: Cursor) -> list[Any]:
        return numpy_pass(leaves, cast, copy, readonly, cursor, gather, keep_quantized)

    return _converted(tree, convert)


def tree_to_torch(
    tree: Any,
    *,
    dtype: DTypeLike | None = None,
    float_dtype: DTypeLike | None = None,
    device: DeviceLike | None = None,
    copy: bool | None = None,
    gather: bool = False,
    keep_quantized: bool = False,
) -> Any:
    """Convert every NumPy array in a nested structure to a tensor, keeping the structure.

    Args:
        tree: any nesting of dict / OrderedDict / defaultdict / list / tuple / namedtuple /
            deque / dataclass. ``np.ndarray`` and NumPy scalar leaves are converted;
            ``torch.Tensor`` leaves follow the same ``dtype`` / ``device`` / ``copy``
            contract; every other leaf is returned as is.
        dtype: cast every array leaf (a torch dtype, NumPy dtype or name).
        float_dtype: cast only the floating-point leaves.
        device: where the tensors should live (``None``: arrays on the CPU, tensors where
            they are). Host leaves bound for an accelerator are staged through pinned
            memory and copied ``non_blocking``.
        copy: as in :func:`~tensorbridge.to_torch`.
        gather: gather every DTensor leaf whole onto every rank (one collective per
            DTensor leaf, in leaf order), as in :func:`~tensorbridge.to_torch`.
        keep_quantized: turn each quantized tensor subclass leaf into a
            :class:`QuantizedParts` of its inner tensors (moved to ``device=``,
            copied by ``copy=True``), as in :func:`tree_to_numpy`.

    Returns:
        The same structure with tensors in place of arrays; tied leaves stay tied.

    Raises:
        TypeError: both ``dtype`` and ``float_dtype`` were given.
        TensorBridgeError: a leaf cannot be converted; the message starts with its key
            path.

    >>> import numpy as np, tensorbridge as tb
    >>> w = np.arange(4.0)
    >>> tree = {"w": w, "head": w[2:]}
    >>> out = tb.tree_to_torch(tree, float_dtype="float32", copy=True)
    >>> out["head"].dtype, out["head"].data_ptr() == out["w"].data_ptr() + 8
    (torch.float32, True)
    """
    cast = Cast.of(dtype, float_dtype)
    target = None if device is None else torch.device(device)

    def convert(leaves: list[Any], cursor: Cursor) -> list[Any]:
        return torch_pass(leaves, cast, target, copy, cursor, gather, keep_quantized)

    return _converted(tree, convert)


def _converted(tree: Any, convert: Callable[[list[Any], Cursor], list[Any]]) -> Any:
    """Flatten, run a leaf pass, rebuild; an error gains the failing leaf's key path.

    The usual state dict, a plain dict of ``str`` keys to plain tensors or arrays, is
    converted without a tree walk (optree's costs more than converting a small leaf),
    in its own key order. Should a leaf fail there, the walk runs instead: it meets the
    leaves in optree's order (sorted keys), so the error names the same leaf either way.
    """
    if (
        type(tree) is dict
        and set(map(type, tree.values())) <= ARRAY_TYPES
        and set(map(type, tree)) <= {str}
    ):
        try:
            return dict(zip(list(tree), convert(list(tree.values()), Cursor()), strict=True))
        except Exception:
            pass  # converted again below, to raise the error with its key path
    leaves, spec = flatten(tree)
    cursor = Cursor()
    try:
        out = convert(leaves, cursor)
    except Exception as error:
        located = with_path(error, spec, cursor.index)
        if located is error:
            raise
        raise located from error.__cause__
    return optree.tree_unflatten(spec, out)
