"""The leaf passes of the tree functions: plan each leaf once per signature, batch copies.

:func:`numpy_pass` / :func:`torch_pass` take the flattened leaves of
:mod:`tensorbridge.tree` and convert them: each kind of leaf by the planner's quick
plan where there is one, else by its full plan; copies that may tie leaves (views
overlapping one memory) or move to a device go to :mod:`tensorbridge._staging`
together. Here too are the dtype rules of ``dtype=`` / ``float_dtype=`` (:class:`Cast`)
and a quantized subclass leaf taken apart (:class:`QuantizedParts`).

>>> import torch
>>> numpy_pass([torch.ones(2)], Cast.of(None, "float16"), None, False, Cursor())[0].dtype
dtype('float16')
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from . import _dlpack as dlpack
from . import _memory as mem
from . import _quantized as quantized
from ._plan import (
    QUICK_NUMPY,
    QUICK_SHARES,
    REFUSALS,
    Plan,
    plain_tensor,
    plan_numpy,
    plan_torch,
    run_numpy,
    run_torch,
)
from ._staging import Cursor, Leaf, array_layout, convert_planned, tensor_layout
from .dtypes import (
    BY_TORCH,
    PACKED_BY_TORCH,
    DTypeLike,
    DTypeRow,
    native_row,
    packed_target,
    resolve_dtype,
    unpacked_target,
)
from .errors import UnsupportedDtypeError

_CPU = torch.device("cpu")

ARRAY_TYPES = frozenset({torch.Tensor, np.ndarray})


@dataclass(frozen=True)
class QuantizedParts:
    """A quantized tensor subclass taken apart (``keep_quantized=True``): codes, scales, metadata.

    Example (with torchao installed)::

        w = MXTensor.to_mx(torch.randn(4, 64), torch.float8_e4m3fn, 32)
        p = tb.tree_to_numpy({"w": w}, keep_quantized=True)["w"]
        p.scheme, p.shape  # ('mxfp8', (4, 64))
        p.parts["qdata"].dtype, p.parts["scale"].dtype  # float8_e4m3fn, float8_e8m0fnu

    Attributes:
        kind: the subclass (``"torchao.prototype.mx_formats.mx_tensor.MXTensor"``).
        scheme: the :mod:`tensorbridge.quant` scheme of its layout (``"mxfp8"``,
            ``"mxfp4"``, ``"nvfp4-modelopt"``, ``"fp8"``), or ``None``.
        shape: the shape of the values it stands for.
        dtype: their dtype (the subclass's own dtype), NumPy's or torch's.
        parts: its inner tensors by name, in ``__tensor_flatten__``'s order, each
            converted as a leaf without ``dtype=`` (float8 and e8m0 as ml_dtypes arrays,
            packed fp4 as its ``uint8`` bytes on the NumPy side), sharing memory where
            that leaf would; a nested quantized part is a ``QuantizedParts`` itself.
        attributes: its other metadata as ``__tensor_flatten__`` gives it
            (``block_size``, ``elem_dtype``, ``orig_dtype``, ...).
    """

    kind: str
    scheme: str | None
    shape: tuple[int, ...]
    dtype: Any
    parts: dict[str, Any]
    attributes: dict[str, Any]


def _parts(
    x: Any, kind: quantized.Kind, convert: Callable[[torch.Tensor], Any], numpy: bool
) -> QuantizedParts:
    """``x`` taken apart through ``__tensor_flatten__``, each inner tensor converted."""
    found = quantized.flatten(x)
    assert found is not None  # x has a Kind
    inner, attributes = found
    parts: dict[str, Any] = {}
    for name, t in inner:
        sub = quantized.kind_of(t)
        parts[name] = convert(t) if sub is None else _parts(t, sub, convert, numpy)
    cls = kind.cls
    return QuantizedParts(
        f"{cls.__module__}.{cls.__qualname__}",
        kind.scheme,
        tuple(x.shape),
        _numpy_dtype(x.dtype) if numpy else x.dtype,
        parts,
        attributes,
    )


# --- dtype rules ------------------------------------------------------------------------------


class Cast(NamedTuple):
    every: DTypeRow | None  # dtype=, resolved
    floats: DTypeRow | None  # float_dtype=, resolved
    given: Any  # dtype= as given: fp4 packing / unpacking has no row, so no ``every``

    @staticmethod
    def of(dtype: Any, float_dtype: Any) -> Cast:
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
        if dtype is not None and not _is_packing(dtype):
            every = resolve_dtype(dtype)
        return Cast(every, floats, dtype)

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

    def spec_of(self, x: Any) -> Any:
        """The ``dtype=`` for one leaf (a tensor or an array)."""
        if self.none:
            return None
        if isinstance(x, torch.Tensor):
            if type(x) is not torch.Tensor and quantized.kind_of(x) is not None:
                wanted = self.every or self.floats  # dequantized, even to its own dtype
                return self.given if wanted is None else wanted.torch
            return self.spec(BY_TORCH.get(x.dtype))
        return self.spec(native_row(x.dtype))

    def spec(self, row: DTypeRow | None) -> Any:
        """The ``dtype=`` to hand to ``to_numpy`` / ``to_torch`` for one leaf (``None``: keep)."""
        if row is None or self.per_leaf:
            return self.given
        dst = self.dst(row)
        if dst is row:
            return None
        return dst.torch if dst.in_torch else dst  # a NumPy-only row: to_numpy takes the row


def _is_packing(spec: DTypeLike) -> bool:
    """Whether ``spec`` names a packed dtype or its one-a-byte side (packing, per leaf)."""
    return packed_target(spec) is not None or unpacked_target(spec) is not None


# --- the leaf passes ---------------------------------------------------------------------------


def numpy_pass(
    leaves: list[Any],
    cast: Cast,
    copy: bool | None,
    readonly: bool,
    cursor: Cursor,
    gather: bool = False,
    keep_quantized: bool = False,
) -> list[Any]:
    """Plan every array leaf (once per signature), run the plans that share, batch the copies."""
    out = list(leaves)
    planned: list[Leaf] = []
    batched: list[tuple[int, Plan]] = []
    firsts, repeats = _firsts(leaves)
    i = 0
    try:
        # Copies ahead and nothing overlaps: each leaf converts on its own, by its quick plan
        # where there is one; otherwise zero-copy leaves do, and copies may keep ties.
        alone = (copy or not cast.none) and _separate(leaves, firsts)
        quicks = QUICK_NUMPY if alone else QUICK_SHARES
        plain_cast = cast.none
        keys: dict[torch.dtype, tuple[Any, ...]] = {}  # a dtype's quick-plan key, made once
        found: dict[torch.dtype, Any] = {}  # and its quick plan, once there is one
        for i in firsts:
            x = leaves[i]
            if type(x) is torch.Tensor:  # the planner's quick plan for the dtype
                dt = x.dtype
                quick = found.get(dt)
                if quick is None:
                    key = keys.get(dt)
                    if key is None:
                        spec = None if plain_cast else cast.spec(BY_TORCH.get(dt))
                        key = keys[dt] = (dt, spec, copy, readonly)
                    quick = found[dt] = quicks.get(key)
                if quick is not None:
                    try:
                        out[i] = quick(x, None)
                        continue
                    except REFUSALS:
                        pass  # a flag the quick plan does not cover: the full signature decides
                spec = keys[dt][1]
            elif keep_quantized and (kind := quantized.kind_of(x)) is not None:
                out[i] = _parts(x, kind, lambda t: _numpy_part(t, copy, readonly), True)
                continue
            elif dlpack.is_producer(x):  # another library's array: import it, then cast it
                made = run_numpy(x, cast.every, copy, readonly)
                out[i] = made if cast.none else run_numpy(made, cast.spec_of(made), None, readonly)
                continue
            else:
                spec = None if plain_cast else cast.spec_of(x)
            plan = plan_numpy(x, spec, copy, readonly, False, gather)
            if plan.batch and _stageable(x) and not alone:
                batched.append((i, plan))
            else:
                out[i] = plan.run(x, None)
        planned = _run_or_stage(leaves, out, batched, True, cursor)
    except Exception:
        if cursor.index is None:
            cursor.index = i
        raise
    if planned:
        made = convert_planned(planned, _CPU, cursor)
        for leaf in planned:
            arr = mem.as_numpy(made[leaf.at], leaf.dst)
            if readonly:
                arr.flags.writeable = False
            out[leaf.at] = arr
    for i, j in repeats.items():
        out[i] = out[j]
    return out


def torch_pass(
    leaves: list[Any],
    cast: Cast,
    target: torch.device | None,
    copy: bool | None,
    cursor: Cursor,
    gather: bool = False,
    keep_quantized: bool = False,
) -> list[Any]:
    """As :func:`numpy_pass`, towards torch (and ``device=``)."""
    out = list(leaves)
    leaves = list(leaves)
    planned: list[Leaf] = []
    batched: list[tuple[int, Plan]] = []
    firsts, repeats = _firsts(leaves, torch_side=True)
    device = None if target is None else str(target)
    indexed: list[torch.device] = []  # the target with its index (_between_accelerators)
    specs: dict[Any, Any] = {}  # an array dtype's dtype=, resolved once
    found: dict[Any, Any] = {}  # and its quick plan, once there is one
    views: dict[Any, Any] = {}  # a writable array's zero-copy quick plan, by dtype
    i = 0
    try:
        # Host casts ahead and nothing overlaps: each array converts on its own, by the
        # planner's quick plan for its dtype where there is one.
        alone = target is None and not cast.none and _separate(leaves, firsts)
        for i in firsts:
            x = leaves[i]
            if type(x) is np.ndarray:
                dt = x.dtype
                quick = found.get(dt) if alone else None
                if quick is None and views and x.flags.writeable:
                    quick = views.get(dt)
                if quick is not None:
                    try:
                        out[i] = quick(x, None)
                        continue
                    except REFUSALS:
                        pass  # strides torch cannot view: the full signature decides
                try:
                    spec = specs[dt]
                except KeyError:
                    spec = specs[dt] = cast.spec_of(x)
                plan = plan_torch(x, spec, device, copy)
                if plan.quick is not None:
                    if not plan.copies:  # from_numpy: it refuses what it cannot view
                        if x.flags.writeable:
                            views[dt] = plan.quick
                    elif alone:
                        found[dt] = plan.quick  # a cast: it serves every array of the dtype
                if plan.batch and x.flags.aligned:  # stageable: see _stageable
                    batched.append((i, plan))
                else:
                    out[i] = plan.run(x, None)
                continue
            if isinstance(x, np.generic):
                x = np.asarray(x)
            elif keep_quantized and (kind := quantized.kind_of(x)) is not None:
                out[i] = _parts(x, kind, lambda t: run_torch(t, None, device, copy), False)
                continue
            elif dlpack.is_producer(x):  # another library's array: import it, then cast it
                imported = run_torch(x, cast.every, device, copy)
                out[i] = (
                    imported
                    if cast.none
                    else run_torch(imported, cast.spec_of(imported), None, None)
                )
                continue
            plan = plan_torch(x, cast.spec_of(x), device, copy, False, False, gather)
            if plan.batch and _stageable(x) and not _between_accelerators(x, target, indexed):
                leaves[i] = x  # a scalar leaf, as the array it became
                batched.append((i, plan))
            else:
                out[i] = plan.run(x, None)  # (between two accelerators: torch's own path)
        host = target is None or target.type == "cpu"
        planned = _run_or_stage(leaves, out, batched, host, cursor)
    except Exception:
        if cursor.index is None:
            cursor.index = i
        raise
    if planned:
        made = convert_planned(planned, target, cursor)
        for leaf in planned:
            out[leaf.at] = made[leaf.at]
    for i, j in repeats.items():
        out[i] = out[j]
    return out


def _between_accelerators(x: Any, target: torch.device | None, indexed: list[Any]) -> bool:
    """Whether ``x`` is a tensor on an accelerator and ``target`` another one: torch copies
    it there itself, not staged through the host. ``indexed`` keeps the target with its
    index, found once."""
    if not isinstance(x, torch.Tensor) or target is None or x.is_cpu:
        return False
    if not indexed:
        indexed.append(mem.indexed(target))
    return bool(indexed[0].type != "cpu" and indexed[0] != x.device)


def _numpy_dtype(dtype: torch.dtype) -> Any:
    row = BY_TORCH.get(dtype)
    return dtype if row is None else row.numpy


def _numpy_part(t: torch.Tensor, copy: bool | None, readonly: bool) -> Any:
    """One inner tensor of a quantized subclass as an array: its bits, packed fp4 as bytes."""
    if PACKED_BY_TORCH.get(t.dtype) is not None:
        t = t.view(torch.uint8)
    return run_numpy(t, None, copy, readonly)


def _firsts(leaves: list[Any], torch_side: bool = False) -> tuple[Iterable[int], dict[int, int]]:
    """The positions of array leaves to convert, and repeats (repeat -> first occurrence)."""
    kinds = (torch.Tensor, np.ndarray, np.generic) if torch_side else (torch.Tensor, np.ndarray)
    if set(map(type, leaves)) <= ARRAY_TYPES:  # all plain tensors and arrays: all of them
        arrays = list(range(len(leaves)))
    else:
        arrays = [i for i, x in enumerate(leaves) if isinstance(x, kinds) or dlpack.is_producer(x)]
    if len(arrays) == len(leaves):  # the usual state dict: every leaf is an array
        if len(set(map(id, leaves))) == len(leaves):
            return arrays, {}
    elif len({id(leaves[i]) for i in arrays}) == len(arrays):
        return arrays, {}
    first: dict[int, int] = {}
    unique: list[int] = []
    repeats: dict[int, int] = {}
    for i in arrays:
        j = first.setdefault(id(leaves[i]), i)
        if j == i:
            unique.append(i)
        else:
            repeats[i] = j
    return unique, repeats


def _run_or_stage(
    leaves: list[Any], out: list[Any], batched: list[tuple[int, Plan]], host: bool, cursor: Cursor
) -> list[Leaf]:
    """Run the copy plans leaf by leaf where nothing ties them; else hand them to staging."""
    if host and _separate(leaves, [i for i, _ in batched]):  # no ties, no device to wait for
        for i, plan in batched:
            cursor.index = i
            out[i] = plan.run(leaves[i], None)
        cursor.index = None
        return []
    return [_leaf(i, leaves[i], plan.src, plan.dst) for i, plan in batched]


def _separate(leaves: list[Any], at: Iterable[int]) -> bool:
    """Whether the leaves at ``at`` are host memory that provably overlaps nowhere.

    Then each converts on its own (no tie to keep, no transfer to batch); otherwise the
    staging keeps overlapping leaves as views of one converted span. The proof tries
    cheap spans first (an array viewing a tensor lies within the tensor's storage) and
    the exact ones (array addresses) only when those overlap.
    """
    at = list(at)
    try:
        rough = _spans(leaves, at, rough=True)
        if rough is None:
            return False
        if _disjoint(rough):
            return True
        exact = _spans(leaves, at, rough=False)
        return exact is not None and _disjoint(exact)
    except (RuntimeError, NotImplementedError):
        return False


def _spans(leaves: list[Any], at: list[int], rough: bool) -> list[tuple[int, int]] | None:
    """Byte ranges that hold the leaves at ``at`` (``None``: not host memory we can place).

    ``rough``: an array that views a tensor is placed at the tensor's whole storage (a
    superset of its bytes: no address to ask NumPy for, the slow part).
    """
    spans: list[tuple[int, int]] = []
    owners: list[np.ndarray] = []
    add, own, ndarray, tensor = spans.append, owners.append, np.ndarray, torch.Tensor
    for i in at:
        x = leaves[i]
        if isinstance(x, ndarray):  # the usual leaf first: this runs for every leaf
            base = x.base
            if base is None:  # owns its memory: only a tensor leaf could view it
                own(x)
                continue
            if rough and isinstance(base, tensor):  # within the tensor's storage
                st = base.untyped_storage()
                lo = st.data_ptr()
                add((lo, lo + st.nbytes()))
            elif x.flags.c_contiguous:
                lo = mem.address(x)
                add((lo, lo + x.nbytes))
            else:
                return None
        elif isinstance(x, tensor):
            if not x.is_cpu:
                return None
            st = x.untyped_storage()  # sparse / nested tensors have none: they raise
            lo = st.data_ptr()
            add((lo, lo + st.nbytes()))
        else:  # a producer or a scalar: not worth proving
            return None
    if spans:  # other leaves could view an owner's memory: place the owners too
        for x in owners:
            lo = mem.address(x)
            add((lo, lo + x.nbytes))
    return spans


def _disjoint(spans: list[tuple[int, int]]) -> bool:
    spans.sort()
    end = 0
    for lo, hi in spans:
        if lo < end:
            return False
        end = hi
    return True


def _stageable(x: Any) -> bool:
    """Whether a leaf the plan would copy can join the batched staging (aligned memory)."""
    return not isinstance(x, np.ndarray) or bool(x.flags.aligned)


def _leaf(at: int, x: Any, src: DTypeRow | None, dst: DTypeRow | None) -> Leaf:
    assert src is not None and dst is not None  # batchable plans have rows
    if isinstance(x, np.ndarray):
        return Leaf(at, x, src, dst, array_layout(x, src))
    t = plain_tensor(x)
    return Leaf(at, t, src, dst, tensor_layout(t, src, t.is_cpu))
