"""describe(): what a tensor or array is, and what to_numpy / to_torch would do with it.

It gathers the dtype on each side, strides in elements and in bytes, where the view
starts in its storage and how big that is, autograd state and the conj/neg bits,
without reading a value. The verdict for each converter is not a second copy of
the conversion rules: it is the conversion plan itself (the one that ``to_numpy`` /
``to_torch`` would run), its steps and the reason a copy is needed. Notes add what
matters before sharing memory: stride-0 dimensions, non-contiguous views, writes
autograd cannot see, and for a dtype torch has no kernels for (int4) how its copies
and casts run. An array of a type torch lacks (float6_e2m3fn) has no ``to_torch``
without ``dtype=``; ``widening`` is the plan of the narrowest exact one its refusal
names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import ml_dtypes
import numpy as np
import torch

from .. import _dlpack as dlpack
from .. import _dtensor as dtensor
from .. import _quantized as quantized
from .._plan import Plan, plan_numpy, plan_torch
from ..dtypes import BY_NUMPY, DTypeRow, exact_widenings, explain_numpy, resolve_dtype
from ..errors import (
    TensorBridgeError,
    UnsupportedDtypeError,
    UnsupportedTensorError,
)
from ._record import Record
from ._values import Array


@dataclass(frozen=True)
class ConversionPlan(Record):
    """What one converter would do with a value: share its memory, copy it, or refuse.

    ``steps`` are the conversion plan's steps (``("view",)``, ``("transfer", "cast")``,
    ...); empty for an error.
    """

    verdict: Literal["share", "copy", "error"]
    reason: str
    steps: tuple[str, ...] = ()

    @property
    def shares(self) -> bool:
        return self.verdict == "share"


@dataclass(frozen=True)
class Description(Record):
    """Everything that decides how a tensor or array converts.

    Attributes:
        kind: the Python type ("torch.Tensor", "numpy.ndarray", ...).
        torch_dtype / numpy_dtype: the dtype on each side ("torch.bfloat16", "bfloat16"),
            ``None`` where there is none; ``dtype_note`` says why, or notes a byte swap.
        strides / strides_bytes: in elements and in bytes (``None`` for sparse/nested).
        storage_offset / storage_offset_bytes / storage_nbytes: where the view starts in
            its storage and how big that storage is (for arrays: the outermost ndarray
            of the ``.base`` chain).
        nbytes: ``numel * itemsize``, the bytes a dense copy takes.
        requires_grad / is_leaf / grad_fn: autograd state (``None`` for arrays).
        to_numpy / to_torch: what ``tb.to_numpy(x)`` / ``tb.to_torch(x)`` would do, and why.
        notes: aliasing and autograd caveats worth knowing before sharing memory.
        quantized: for a quantized tensor subclass (torchao's ``MXTensor``, ...), what
            it holds: ``"MXTensor (mxfp8): qdata (float8_e4m3fn [8, 64]) and scale
            (float8_e8m0fnu [8, 2])"``; its storage facts are ``None`` (its storage is
            not its values).
        dequantize: for such a tensor, the plan of ``to_numpy(x, dtype=np.float32)``
            (steps ``("dequantize",)``, and how: the ``reason``).
        widening: for an array of a type torch lacks (float8_e4m3, float6_e2m3fn, ...),
            the plan of ``to_torch(x, dtype=...)`` with the narrowest dtype that holds
            every value exactly (the first its ``to_torch`` refusal names), cast by
            ml_dtypes' ``astype``.
    """

    kind: str
    torch_dtype: str | None
    numpy_dtype: str | None
    dtype_note: str | None
    category: str | None
    itemsize: int
    shape: tuple[int, ...] | None
    numel: int | None
    strides: tuple[int, ...] | None
    strides_bytes: tuple[int, ...] | None
    storage_offset: int | None
    storage_offset_bytes: int | None
    storage_nbytes: int | None
    nbytes: int | None
    device: str
    layout: str
    requires_grad: bool | None
    is_leaf: bool | None
    grad_fn: str | None
    is_conj: bool
    is_neg: bool
    c_contiguous: bool | None
    f_contiguous: bool | None
    readonly: bool
    byteswapped: bool
    to_numpy: ConversionPlan
    to_torch: ConversionPlan
    notes: tuple[str, ...] = ()
    quantized: str | None = None
    dequantize: ConversionPlan | None = None
    widening: ConversionPlan | None = None


def _plan(make: Callable[[], Plan], share_reason: str) -> ConversionPlan:
    """The converter's own plan for the value (the default ``copy=None``)."""
    try:
        plan = make()
    except TensorBridgeError as e:
        return ConversionPlan("error", str(e))
    if plan.reason is not None:
        return ConversionPlan("copy", f"the input {plan.reason}", plan.steps)
    return ConversionPlan("share", share_reason, plan.steps)


def describe(x: Any) -> Description:
    """Describe a tensor or array: dtypes, layout, autograd state, and how it would convert.

    >>> import torch, tensorbridge as tb
    >>> d = tb.describe(torch.zeros(2, 3).T)
    >>> d.strides, d.c_contiguous, d.to_numpy.verdict
    ((1, 3), False, 'share')
    >>> tb.describe(torch.zeros(2, dtype=torch.complex64).conj()).to_numpy.reason
    'the input has its conjugate or negative bit set (resolving it writes new values)'

    Args:
        x: a ``torch.Tensor`` (any subclass, device or layout) or an ``np.ndarray``.

    Returns:
        A :class:`Description`.

    Raises:
        UnsupportedTensorError: ``x`` is neither.
    """
    if isinstance(x, torch.Tensor):
        return _describe_tensor(x)
    if dlpack.is_producer(x):  # another library's array: what its one export holds
        return _describe_producer(x)
    if isinstance(x, np.generic):
        x = np.asarray(x)
    if isinstance(x, np.ndarray):
        return _describe_array(x)
    raise UnsupportedTensorError(
        f"describe expects a torch.Tensor or np.ndarray, got {type(x).__qualname__}; pass "
        "np.asarray(x)"
    )


def _describe_producer(x: Any) -> Description:
    got = dlpack.import_array(x, "describe", host_copy_allowed=False)
    value = got.value
    d = _describe_tensor(value) if isinstance(value, torch.Tensor) else _describe_array(value)
    note = f"a DLPack producer ({_kind(x)}), described through its one export"
    if got.readonly:
        why = f"is read-only ({got.readonly}), and a writable tensor must not alias it"
        to_torch = ConversionPlan("copy", f"the input {why}", ("copy",))
        to_numpy = ConversionPlan("share", "to_numpy returns a read-only view", ("view",))
    else:
        to_torch = ConversionPlan("share", "to_torch returns a tensor over its memory", ("view",))
        to_numpy = d.to_numpy
    return dataclasses.replace(
        d,
        kind=_kind(x),
        readonly=bool(got.readonly),
        to_numpy=to_numpy,
        to_torch=to_torch,
        notes=(note, *d.notes),
    )


def _kind(x: Any) -> str:
    cls = type(x)
    return "torch.Tensor" if cls is torch.Tensor else f"{cls.__module__}.{cls.__qualname__}"


def _contiguous(shape: tuple[int, ...], strides: tuple[int, ...], fortran: bool) -> bool:
    expected = 1
    order = range(len(shape)) if fortran else range(len(shape) - 1, -1, -1)
    for d in order:
        if shape[d] == 0:
            return True
        if shape[d] != 1 and strides[d] != expected:
            return False
        expected *= shape[d]
    return True


def _aliasing_notes(
    shape: tuple[int, ...] | None, strides: tuple[int, ...] | None, c: bool | None, f: bool | None
) -> list[str]:
    notes = []
    if shape is not None and strides is not None:
        zero = [d for d, (n, s) in enumerate(zip(shape, strides, strict=True)) if s == 0 and n > 1]
        if zero:
            notes.append(
                f"dimension(s) {tuple(zero)} have stride 0 (expanded/broadcast): one stored "
                "element stands for many, so a write through a shared view changes them all"
            )
        if c is False and f is False:
            notes.append(
                "not contiguous: a shared view keeps these strides; np.ascontiguousarray(a) "
                "or t.contiguous() makes a dense copy"
            )
    return notes


def _describe_tensor(t: torch.Tensor) -> Description:
    try:
        row: DTypeRow | None = resolve_dtype(t.dtype)
        note = None
    except UnsupportedDtypeError as e:
        row, note = None, str(e)
    itemsize = t.element_size()
    strided = t.layout is torch.strided and not t.is_nested
    try:
        shape: tuple[int, ...] | None = tuple(t.shape)
    except RuntimeError:  # nested tensors with ragged dimensions have no single shape
        shape = None
    strides = tuple(t.stride()) if strided else None
    c = f = None
    if strided and shape is not None and strides is not None:
        c, f = _contiguous(shape, strides, False), _contiguous(shape, strides, True)
    sharded = dtensor.is_dtensor(t)
    kind = quantized.kind_of(t) if type(t) is not torch.Tensor else None
    wrapper = sharded or kind is not None  # its storage is not its values
    offset = int(t.storage_offset()) if strided and not wrapper else None
    numel = t.numel() if shape is not None else None
    notes = _aliasing_notes(shape, strides, c, f) + _kernel_notes(row)
    if sharded:  # its storage is this rank's local tensor: no storage facts about the whole
        notes.insert(0, dtensor.note(t))
    share = "to_numpy returns a NumPy view of the tensor's memory"
    if t.requires_grad:
        share += " (through t.detach())"
        notes.append(
            "requires grad: a shared NumPy view is detached, so writes through it are "
            "invisible to autograd"
        )
    return Description(
        kind=_kind(t),
        torch_dtype=str(t.dtype),
        numpy_dtype=str(row.numpy) if row is not None else None,
        dtype_note=note,
        category=row.category if row is not None else None,
        itemsize=itemsize,
        shape=shape,
        numel=numel,
        strides=strides,
        strides_bytes=tuple(s * itemsize for s in strides) if strides is not None else None,
        storage_offset=offset,
        storage_offset_bytes=offset * itemsize if offset is not None else None,
        storage_nbytes=t.untyped_storage().nbytes() if strided and not wrapper else None,
        nbytes=numel * itemsize if numel is not None else None,
        device=str(t.device),
        layout=str(t.layout).removeprefix("torch."),
        requires_grad=t.requires_grad,
        is_leaf=t.is_leaf,
        grad_fn=type(t.grad_fn).__name__ if t.grad_fn is not None else None,
        is_conj=bool(t.is_conj()),
        is_neg=bool(t.is_neg()),
        c_contiguous=c,
        f_contiguous=f,
        readonly=False,
        byteswapped=False,
        to_numpy=_plan(lambda: plan_numpy(t), share),
        to_torch=_plan(lambda: plan_torch(t), "already a tensor: to_torch returns it as is"),
        notes=tuple(notes),
        **(_quantized_facts(t, kind) if kind is not None else {}),
    )


def _quantized_facts(t: torch.Tensor, kind: quantized.Kind) -> dict[str, Any]:
    """What a quantized subclass holds, and the plan that dequantizes it."""
    scheme = f" ({kind.scheme})" if kind.scheme else ""
    try:
        plan = plan_numpy(t, "float32")
        how = ConversionPlan(
            "copy", f"the input {plan.reason}; dequantized by {kind.route}", plan.steps
        )
    except TensorBridgeError as e:
        how = ConversionPlan("error", str(e))
    return {"quantized": f"{kind.name}{scheme}: {quantized.parts_text(t)}", "dequantize": how}


def _address(a: Array) -> int:
    return int(a.__array_interface__["data"][0])


def _describe_array(a: Array) -> Description:
    row = BY_NUMPY.get(a.dtype)
    note = None
    swapped = not a.dtype.isnative
    if row is None:
        native = BY_NUMPY.get(a.dtype.newbyteorder("=")) if swapped else None
        if native is not None:
            row = native
            note = f"byte-swapped ({a.dtype.str}); torch holds native byte order only"
        else:
            note = explain_numpy(a.dtype)
    if row is not None and not row.in_torch:  # float8_e4m3, ...: NumPy alone has it
        note = explain_numpy(row.numpy)
    size = a.dtype.itemsize
    bstrides = tuple(int(s) for s in a.strides)
    strides = (
        tuple(s // size for s in bstrides)
        if size and all(s % size == 0 for s in bstrides)
        else None
    )
    root = a
    while isinstance(root.base, np.ndarray):
        root = root.base
    offset_b = _address(a) - _address(root)
    c, f = bool(a.flags.c_contiguous), bool(a.flags.f_contiguous)
    return Description(
        kind=_kind(a),
        torch_dtype=str(row.torch) if row is not None and row.in_torch else None,
        numpy_dtype=str(a.dtype),
        dtype_note=note,
        category=row.category if row is not None else None,
        itemsize=size,
        shape=tuple(a.shape),
        numel=int(a.size),
        strides=strides,
        strides_bytes=bstrides,
        storage_offset=offset_b // size if size and offset_b % size == 0 else None,
        storage_offset_bytes=offset_b,
        storage_nbytes=int(root.nbytes),
        nbytes=int(a.nbytes),
        device="cpu",
        layout="strided",
        requires_grad=None,
        is_leaf=None,
        grad_fn=None,
        is_conj=False,
        is_neg=False,
        c_contiguous=c,
        f_contiguous=f,
        readonly=not a.flags.writeable,
        byteswapped=swapped,
        to_numpy=_plan(lambda: plan_numpy(a), "already an array: to_numpy returns it as is"),
        to_torch=_plan(lambda: plan_torch(a), "to_torch returns a tensor over the array's memory"),
        notes=tuple(_aliasing_notes(tuple(a.shape), strides, c, f) + _kernel_notes(row)),
        widening=_widening(a, row) if row is not None and not row.in_torch else None,
    )


def _kernel_notes(row: DTypeRow | None) -> list[str]:
    """How a dtype torch has no kernels for (int4) is copied and cast."""
    if row is None or row.kernels or not row.in_torch:
        return []
    info: Any = ml_dtypes.iinfo(row.numpy)  # type: ignore[no-untyped-call]
    bits = int(info.bits)
    return [
        f"torch has no kernels for {row.name} (clone, copy_, .to() raise): tensorbridge "
        f"copies and moves its bytes as {row.carrier_numpy} and casts it with ml_dtypes' "
        f"astype, which reads the low {bits} bit{'s' if bits > 1 else ''} of each byte"
    ]


def _widening(a: Array, row: DTypeRow) -> ConversionPlan:
    """The plan of ``to_torch(a, dtype=...)`` into the narrowest exact widening of ``row``."""
    wide = exact_widenings(row)[0]
    made = _plan(lambda: plan_torch(a, wide), "")
    if made.verdict != "copy":
        return made
    how = f"{made.reason}, each exactly (ml_dtypes' astype)"
    return dataclasses.replace(made, reason=how)
