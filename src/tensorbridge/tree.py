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
"""

from __future__ import annotations

import contextlib
import copy as _copy
import dataclasses
import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Any, NamedTuple

import numpy as np
import optree
import torch

from ._staging import _array_layout, _convert_planned, _Cursor, _indexed, _Leaf, _tensor_layout
from .convert import to_numpy, to_torch
from .dtypes import (
    BY_TORCH,
    FLOAT4_PACKED,
    FLOAT4_UNPACKED,
    DeviceLike,
    DTypeLike,
    DTypeRow,
    native_row,
    resolve_dtype,
)
from .errors import UnsupportedDtypeError

__all__ = ["tree_to_numpy", "tree_to_torch"]

_NAMESPACE = "tensorbridge"
_CPU = torch.device("cpu")
_PLAIN_TYPES: tuple[type, ...] = tuple(
    cls for cls in (torch.nn.Parameter, getattr(torch.nn, "Buffer", None)) if cls is not None
)
_NEVER_DATACLASS = frozenset({torch.Tensor, np.ndarray, int, float, str, bytes, bool})


# --- public API -------------------------------------------------------------------------------


def tree_to_numpy(
    tree: Any,
    *,
    dtype: DTypeLike | None = None,
    float_dtype: DTypeLike | None = None,
    copy: bool | None = None,
    readonly: bool = False,
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
    cast = _Cast.of(dtype, float_dtype)
    leaves, spec = _flatten(tree)
    cursor = _Cursor()

    def convert() -> list[Any]:
        if cast.none and copy is None:
            out, rest = _numpy_fast(leaves, readonly, cursor)
        else:
            out, rest = list(leaves), list(range(len(leaves)))
        if rest:
            _numpy_rest(leaves, out, rest, cast, copy, readonly, cursor)
        return out

    return _rebuilt(spec, cursor, convert)


def tree_to_torch(
    tree: Any,
    *,
    dtype: DTypeLike | None = None,
    float_dtype: DTypeLike | None = None,
    device: DeviceLike | None = None,
    copy: bool | None = None,
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
    cast = _Cast.of(dtype, float_dtype)
    target = None if device is None else torch.device(device)
    leaves, spec = _flatten(tree)
    cursor = _Cursor()

    def convert() -> list[Any]:
        if cast.none and copy is None and target is None:
            out, rest = _torch_fast(leaves, cursor)
        else:
            out, rest = list(leaves), list(range(len(leaves)))
        if rest:
            _torch_rest(leaves, out, rest, cast, target, copy, cursor)
        return out

    return _rebuilt(spec, cursor, convert)


def _rebuilt(spec: optree.PyTreeSpec, cursor: _Cursor, convert: Callable[[], list[Any]]) -> Any:
    """Run a leaf pass and rebuild the tree; an error gains the failing leaf's key path."""
    try:
        out = convert()
    except Exception as error:
        located = _with_path(error, spec, cursor.index)
        if located is error:
            raise
        raise located from error.__cause__
    return optree.tree_unflatten(spec, out)


# --- flattening, dataclasses and key paths ----------------------------------------------------

_registered: set[type] = set()
_register_lock = threading.Lock()


def _flatten(tree: Any) -> tuple[list[Any], optree.PyTreeSpec]:
    while True:
        leaves, spec = optree.tree_flatten(tree, namespace=_NAMESPACE)
        fresh = {
            type(x)
            for x in leaves
            if type(x) not in _NEVER_DATACLASS
            and dataclasses.is_dataclass(x)
            and not isinstance(x, type)
        }
        if not fresh or fresh <= _registered:
            return leaves, spec
        for cls in fresh:
            _register_dataclass(cls)


class _Instance:
    """A dataclass node's original object (optree wants hashable metadata: this is, by id)."""

    __slots__ = ("names", "obj")

    def __init__(self, obj: Any, names: tuple[str, ...]) -> None:
        self.obj = obj
        self.names = names


def _flatten_dataclass(obj: Any) -> tuple[list[Any], _Instance, tuple[str, ...]]:
    names = tuple(f.name for f in dataclasses.fields(obj) if hasattr(obj, f.name))
    return [getattr(obj, n) for n in names], _Instance(obj, names), names


def _unflatten_dataclass(meta: Hashable | None, children: Iterable[Any]) -> Any:
    assert isinstance(meta, _Instance)
    # A shallow copy with the fields replaced: no __init__ / __post_init__ runs again,
    # init=False fields and frozen or slotted classes are handled alike.
    new = _copy.copy(meta.obj)
    for name, value in zip(meta.names, children, strict=True):
        object.__setattr__(new, name, value)
    return new


def _register_dataclass(cls: type) -> None:
    with _register_lock:
        if cls in _registered:
            return
        # ValueError: registered in our namespace already (by an earlier import of this module)
        with contextlib.suppress(ValueError):
            optree.register_pytree_node(
                cls,
                _flatten_dataclass,
                _unflatten_dataclass,
                path_entry_type=optree.DataclassEntry,
                namespace=_NAMESPACE,
            )
        _registered.add(cls)


def _key_path(spec: optree.PyTreeSpec, index: int) -> str:
    return spec.accessors()[index].codify("")


def _with_path(error: Exception, spec: optree.PyTreeSpec, index: int | None) -> Exception:
    """The same kind of exception, its message prefixed with the failing leaf's key path."""
    if index is None:
        return error
    path = _key_path(spec, index)
    if not path:  # the tree is a single leaf
        return error
    try:
        located = type(error)(f"at {path}: {error}")
    except Exception:
        return error  # an exception class that wants more than a message
    return located.with_traceback(error.__traceback__)


# --- dtype rules ------------------------------------------------------------------------------


class _Cast(NamedTuple):
    every: DTypeRow | None  # dtype=, resolved
    floats: DTypeRow | None  # float_dtype=, resolved
    given: Any  # dtype= as given: fp4 packing / unpacking has no row, so no ``every``

    @staticmethod
    def of(dtype: Any, float_dtype: Any) -> _Cast:
        if dtype is not None and float_dtype is not None:
            raise TypeError(
                "dtype= casts every array leaf and float_dtype= only the floating-point ones; "
                "pass one of them, not both"
            )
        floats = None if float_dtype is None else resolve_dtype(float_dtype)
        if floats is not None and not floats.is_floating:
            raise UnsupportedDtypeError(
                f"float_dtype={floats.name} is not a floating-point dtype; pass a float dtype "
                f"such as 'float32', or dtype={floats.name!r} to cast every leaf"
            )
        every = None
        if dtype is not None and not _is_fp4(dtype):
            every = resolve_dtype(dtype)
        return _Cast(every, floats, dtype)

    @property
    def none(self) -> bool:
        return self.given is None and self.floats is None

    @property
    def per_leaf(self) -> bool:
        """Every array leaf goes through to_numpy / to_torch alone (fp4 packing, unpacking)."""
        return self.given is not None and self.every is None

    def dst(self, row: DTypeRow) -> DTypeRow:
        """The row a leaf of ``row`` becomes."""
        if self.every is not None:
            return self.every
        if self.floats is not None and row.is_floating:
            return self.floats
        return row

    def spec(self, row: DTypeRow | None) -> Any:
        """The ``dtype=`` to hand to ``to_numpy`` / ``to_torch`` for one leaf (``None``: keep)."""
        if row is None or self.per_leaf:
            return self.given
        dst = self.dst(row)
        return None if dst is row else dst.torch


def _is_fp4(spec: DTypeLike) -> bool:
    if FLOAT4_PACKED is not None and (spec is FLOAT4_PACKED or str(spec) == "float4_e2m1fn_x2"):
        return True
    try:
        return FLOAT4_UNPACKED is not None and np.dtype(spec) == FLOAT4_UNPACKED  # type: ignore[arg-type]
    except TypeError:
        return False


# --- the per-leaf passes ----------------------------------------------------------------------


def _numpy_fast(leaves: list[Any], readonly: bool, cursor: _Cursor) -> tuple[list[Any], list[int]]:
    """No cast, no forced copy: CPU tensors become views in one lean loop; the rest waits."""
    out: list[Any] = []
    rest: list[int] = []
    seen: dict[int, Any] = {}
    try:
        for x in leaves:
            if type(x) is torch.Tensor and x.is_cpu:
                arr = seen.get(id(x))
                if arr is None:
                    arr = seen[id(x)] = to_numpy(x, readonly=readonly)
                out.append(arr)
            elif isinstance(x, (torch.Tensor, np.ndarray)):
                rest.append(len(out))
                out.append(x)
            else:
                out.append(x)
    except Exception:
        cursor.index = len(out)  # the leaf being converted
        raise
    return out, rest


def _torch_fast(leaves: list[Any], cursor: _Cursor) -> tuple[list[Any], list[int]]:
    """No cast, copy or device: writable arrays become views; tensors pass through."""
    out: list[Any] = []
    rest: list[int] = []
    seen: dict[int, Any] = {}
    try:
        for x in leaves:
            if type(x) is np.ndarray and x.flags.writeable:
                t = seen.get(id(x))
                if t is None:
                    t = seen[id(x)] = to_torch(x)
                out.append(t)
            elif isinstance(x, (np.ndarray, np.generic)):
                rest.append(len(out))
                out.append(x)
            else:
                out.append(x)
    except Exception:
        cursor.index = len(out)  # the leaf being converted
        raise
    return out, rest


def _plain_tensor(x: torch.Tensor) -> torch.Tensor | None:
    """``x`` as a plain strided tensor whose storage holds its values, or ``None``."""
    if type(x) is torch.Tensor:
        t = x.detach() if x.requires_grad else x
    elif isinstance(x, _PLAIN_TYPES):
        t = x.detach()
    else:
        return None  # a subclass: to_numpy / to_torch say what to do with it
    if (
        t.layout is not torch.strided
        or t.is_nested
        or t.is_quantized
        or t.is_conj()
        or t.is_neg()
        or t.device.type == "meta"
    ):
        return None
    return t


def _plain_array(a: np.ndarray, row: DTypeRow) -> bool:
    """Whether ``a``'s memory can be viewed from torch as it is (strides, alignment, order)."""
    return (
        type(a) in (np.ndarray, np.memmap)
        and a.dtype.isnative
        and a.flags.aligned
        and all(s >= 0 and s % row.itemsize == 0 for s in a.strides)
    )


def _first_of(leaves: list[Any], rest: Iterable[int]) -> tuple[list[int], dict[int, int]]:
    """Split ``rest`` into first occurrences and repeats (repeat index -> first index)."""
    first: dict[int, int] = {}
    unique: list[int] = []
    repeats: dict[int, int] = {}
    for i in rest:
        j = first.setdefault(id(leaves[i]), i)
        if j == i:
            unique.append(i)
        else:
            repeats[i] = j
    return unique, repeats


def _numpy_rest(
    leaves: list[Any],
    out: list[Any],
    rest: Iterable[int],
    cast: _Cast,
    copy: bool | None,
    readonly: bool,
    cursor: _Cursor,
) -> None:
    unique, repeats = _first_of(leaves, rest)
    planned: list[_Leaf] = []
    for i in unique:
        x = leaves[i]
        cursor.index = i
        if isinstance(x, torch.Tensor):
            t = _plain_tensor(x)
            row = None if t is None else BY_TORCH.get(t.dtype)
            if t is None or row is None or cast.per_leaf:
                out[i] = to_numpy(x, dtype=cast.spec(row), copy=copy, readonly=readonly)
                continue
            dst = cast.dst(row)
            on_host = t.device.type == "cpu"
            if on_host and dst is row and not copy:
                out[i] = to_numpy(t, readonly=readonly)
            elif copy is False:
                out[i] = to_numpy(t, dtype=cast.spec(row), copy=False)  # raises, saying why
            else:
                planned.append(_Leaf(i, t, row, dst, _tensor_layout(t, row, on_host)))
        elif isinstance(x, np.ndarray):
            row = native_row(x.dtype)
            if row is None or not _plain_array(x, row) or cast.per_leaf:
                out[i] = to_numpy(x, dtype=cast.spec(row), copy=copy, readonly=readonly)
                continue
            dst = cast.dst(row)
            if dst is row and not copy:
                out[i] = to_numpy(x, readonly=readonly)
            elif copy is False:
                out[i] = to_numpy(x, dtype=dst.numpy, copy=False)  # raises, saying why
            else:
                planned.append(_Leaf(i, x, row, dst, _array_layout(x, row)))
    if planned:
        made = _convert_planned(planned, _CPU, cursor)
        for leaf in planned:
            arr = _as_array(made[leaf.at])
            if readonly:
                arr.flags.writeable = False
            out[leaf.at] = arr
    cursor.index = None
    for i, j in repeats.items():
        out[i] = out[j]


def _torch_rest(
    leaves: list[Any],
    out: list[Any],
    rest: Iterable[int],
    cast: _Cast,
    target: torch.device | None,
    copy: bool | None,
    cursor: _Cursor,
) -> None:
    unique, repeats = _first_of(leaves, rest)
    planned: list[_Leaf] = []
    device = None if target is None else str(target)
    indexed: list[torch.device] = []  # the target with its index, found once when needed
    for i in unique:
        x = leaves[i]
        cursor.index = i
        if isinstance(x, np.ndarray):
            row = native_row(x.dtype)
            dest = target if target is not None else _CPU
            if row is None or not _plain_array(x, row) or not _stageable(dest) or cast.per_leaf:
                out[i] = to_torch(x, dtype=cast.spec(row), device=device, copy=copy)
                continue
            dst = cast.dst(row)
            if dst is row and dest.type == "cpu" and not copy and x.flags.writeable:
                out[i] = to_torch(x)
            elif copy is False:
                out[i] = to_torch(x, dtype=dst.torch, device=device, copy=False)  # raises
            else:
                planned.append(_Leaf(i, x, row, dst, _array_layout(x, row)))
        elif isinstance(x, np.generic):
            out[i] = to_torch(x, dtype=cast.spec(native_row(x.dtype)), device=device, copy=copy)
        elif isinstance(x, torch.Tensor):
            t = _plain_tensor(x)
            row = None if t is None else BY_TORCH.get(t.dtype)
            if t is None or row is None or cast.per_leaf:
                out[i] = to_torch(x, dtype=cast.spec(row), device=device, copy=copy)
                continue
            dst = cast.dst(row)
            if target is not None and not indexed:
                indexed.append(_indexed(target))
            dest = t.device if target is None else indexed[0]
            on_host = t.device.type == "cpu"
            if dest == t.device and dst is row and not copy:
                out[i] = x
            elif copy is False or not (
                dest == t.device or (on_host and _stageable(dest)) or dest.type == "cpu"
            ):
                # a refusal to copy, or a move between two accelerators: torch's own path
                out[i] = to_torch(x, dtype=cast.spec(row), device=device, copy=copy)
            else:
                planned.append(_Leaf(i, t, row, dst, _tensor_layout(t, row, on_host)))
    if planned:
        made = _convert_planned(planned, target, cursor)
        for leaf in planned:
            out[leaf.at] = made[leaf.at]
    cursor.index = None
    for i, j in repeats.items():
        out[i] = out[j]


def _stageable(device: torch.device) -> bool:
    """Whether host memory can be staged for ``device`` (the CPU itself or an accelerator)."""
    return device.type != "meta"


def _as_array(t: torch.Tensor) -> np.ndarray:
    """The NumPy view of a converted host tensor (zero-copy, like every plain to_numpy)."""
    arr: np.ndarray = to_numpy(t)
    return arr
