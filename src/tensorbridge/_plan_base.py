"""What every conversion plan shares: the :class:`Plan` record, signatures, caches, rules.

The plan modules are layered so that no import runs in a circle: this module holds the
record a plan is (:class:`Plan`), the *signature* plans are cached by
(:func:`signature`, :func:`strides_state`), the caches themselves and the quick
executors the planners fill (``QUICK_*``), and the rules both directions apply
(:func:`needs_copy`, :func:`check_cast`, :func:`device_of`, :func:`check_out`,
:func:`numpy_row`, :func:`plain_tensor`, :func:`dequantizing`). The decisions live
above it, one module per direction (:mod:`tensorbridge._plan_numpy`,
:mod:`tensorbridge._plan_torch`), and :mod:`tensorbridge._plan` runs them and is the
one name the rest of the package imports.

>>> strides_state(np.zeros((2, 3))[:, ::-1])
'negative'
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ._torch_checks import loaded as _loaded_torch
from .dtypes import DTypeRow, explain_numpy, native_row
from .errors import (
    CopyRequiredError,
    InvalidArgumentError,
    NoDataError,
    ShapeMismatchError,
    UnsupportedDtypeError,
    UnsupportedTensorError,
)

if TYPE_CHECKING:
    import torch

    from . import _quantized as quantized

Run = Callable[[Any, Any], Any]  # (value, out) -> result


@dataclass(frozen=True, eq=False)
class Plan:
    """What converting one kind of value does, and why.

    Attributes:
        to: ``"numpy"`` or ``"torch"``.
        steps: what happens, in order: ``detach``, ``view``, ``copy``, ``cast``,
            ``transfer``, ``resolve`` (a conj/neg bit), ``byteswap``, ``unpack``,
            ``pack``, ``dequantize``, ``sparse``, ``unbind``, ``into out``,
            ``readonly``, ``requires grad``.
        reason: why the input cannot be shared (``None`` when it can).
        copies: whether the result is new memory (a reason, or ``copy=True``).
        src / dst: the table rows before and after (``None`` where there is none).
        batch: a plain strided copy, cast or transfer that the tree functions may
            stage together with other leaves.
        run: the executor, ``run(value, out)``.
        quick: for a plain host tensor's (or a writable array's) plan, and an array's
            host cast, the same executor guarded so that it refuses (raises) any value
            whose full signature would plan another conversion: it may then serve every
            value of the dtype (``to_numpy`` / ``to_torch`` and the trees try it first).
    """

    to: str
    steps: tuple[str, ...]
    reason: str | None
    copies: bool
    src: DTypeRow | None
    dst: DTypeRow | None
    batch: bool
    run: Run
    quick: Run | None = None

    def __repr__(self) -> str:
        why = f" ({self.reason})" if self.reason else ""
        return f"Plan(to_{self.to}: {' -> '.join(self.steps)}{why})"


# --- signatures and the cache ------------------------------------------------------------------

VIEWABLE = "viewable"
NEGATIVE = "negative"


def signature(x: Any) -> Hashable | None:
    """Everything about ``x`` that a plan depends on (``None``: do not cache)."""
    cls = type(x)
    if cls is np.ndarray or cls is np.memmap:
        return (cls, x.dtype, x.flags.writeable, strides_state(x))
    torch = _loaded_torch()  # no tensor exists before torch is imported
    if torch is not None and isinstance(x, torch.Tensor):
        from . import _memory as mem

        if cls is not torch.Tensor and cls not in mem.PLAIN_SUBCLASSES:
            from . import _dtensor as dtensor
            from . import _quantized as quantized

            if dtensor.is_dtensor(x):
                return dtensor.signature(x)
            kind = quantized.kind_of(x)
            if kind is not None:  # a wrapper of codes and scales: its kind decides
                return (kind, x.device)
        dtype = x.dtype
        conj = dtype.is_complex and x.is_conj()
        return (cls, dtype, x.device, x.layout, x.requires_grad, x.is_neg(), conj, x.is_nested)
    return None


def strides_state(a: np.ndarray) -> Hashable:
    """Whether torch can view ``a``'s strides: viewable, negative, or the odd strides."""
    strides = a.strides
    if not strides or (min(strides) >= 0 and a.flags.c_contiguous):
        return VIEWABLE
    size = a.itemsize
    if any(s < 0 for s in strides):
        return NEGATIVE
    if size and any(s % size for s in strides):
        return tuple(strides)
    return VIEWABLE


CACHE_LIMIT = 4096
NUMPY_PLANS: dict[Hashable, Plan] = {}
TORCH_PLANS: dict[Hashable, Plan] = {}
decisions = [0]  # how many plans were decided (not found in the cache), for tests


def forget() -> None:
    """Empty the plan caches (for tests that count decisions)."""
    NUMPY_PLANS.clear()
    TORCH_PLANS.clear()
    QUICK_NUMPY.clear()
    QUICK_SHARES.clear()
    QUICK_VIEWS.clear()
    QUICK_TORCH.clear()


# --- the quick path of the zero-copy plans -----------------------------------------------------

# The zero-copy plans of a plain CPU tensor / a writable array, by dtype alone. Their
# executors (``t.numpy()``, ``torch.from_numpy(a)``) refuse every value whose full
# signature would be planned differently (grad, another device, a conj/neg bit, a
# sparse or nested layout, negative or odd strides), so a refusal only means "plan by
# the full signature"; they are filled by the planner, never written by hand.
QUICK_NUMPY: dict[tuple[torch.dtype, Any, bool | None, bool], Run] = {}
QUICK_TORCH: dict[np.dtype[Any], Run] = {}
# The zero-copy subset of QUICK_NUMPY: what a tree may run leaf by leaf without looking
# for ties (views share memory anyway; copies may have to keep ties).
QUICK_SHARES: dict[tuple[torch.dtype, Any, bool | None, bool], Run] = {}
# The plain view of QUICK_NUMPY (no dtype=, copy=None, readonly=False) by dtype alone: every
# call's hot path, without a key to build.
QUICK_VIEWS: dict[torch.dtype, Run] = {}
REFUSALS = (RuntimeError, TypeError, ValueError)


# --- shared rules ------------------------------------------------------------------------------


def needs_copy(what: str, reason: str, copy: bool | None) -> None:
    """Refuse a copy that ``copy=False`` forbids, saying why it is needed."""
    if copy is False:
        raise CopyRequiredError(
            f"{what}(copy=False) cannot share memory: the input {reason}; pass copy=None to "
            "allow the copy"
        )


def check_cast(src: DTypeRow, dst: DTypeRow) -> None:
    if src.category == "complex" and dst.category != "complex":
        raise UnsupportedDtypeError(
            f"casting {src.name} to {dst.name} would discard the imaginary part; pass the real "
            "part (x.real) explicitly, or a complex dtype"
        )


def device_of(device: Any) -> torch.device | None:
    """``device=`` as a ``torch.device``, or the error naming the devices this torch has."""
    import torch

    if device is None:
        return None
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError):
        raise InvalidArgumentError(
            f"device={device!r} is not a device; pass 'cpu', 'cuda', 'cuda:1', 'mps' or a "
            "torch.device"
        ) from None
    backend = getattr(torch, target.type, None)
    if target.type != "meta" and not getattr(backend, "is_available", lambda: True)():
        raise InvalidArgumentError(
            f"device={device!r}: this torch has no {target.type} device; pass device='cpu' "
            "(or leave out device=)"
        )
    return target


def check_out(out: Any, shape: tuple[int, ...], what: str) -> None:
    if tuple(out.shape) != shape:
        raise ShapeMismatchError(
            f"{what}: out= has shape {tuple(out.shape)} but the source has shape {shape}; "
            "pass an out of the source's shape"
        )


def numpy_row(a: np.ndarray) -> DTypeRow:
    """The row of an array's dtype (byte-swapped ones too), or the error that explains why not."""
    row = native_row(a.dtype)
    if row is None:
        raise UnsupportedDtypeError(explain_numpy(a.dtype))
    return row


def plain_tensor(x: Any) -> torch.Tensor:
    """Unwrap the tensor types whose storage holds their values; refuse the rest."""
    import torch

    from . import _dtensor as dtensor
    from . import _memory as mem

    cls = type(x)
    if cls is torch.Tensor:
        return x.detach() if x.requires_grad else x  # type: ignore[no-any-return]
    if isinstance(x, mem.PLAIN_SUBCLASSES):
        return x.detach()  # type: ignore[attr-defined,no-any-return]
    if isinstance(x, torch.Tensor):
        if x.is_nested:  # torch's jagged NestedTensor: unbind() gives plain views
            return x.detach() if x.requires_grad else x
        name = cls.__name__
        if name == "FakeTensor":
            raise NoDataError(
                f"a FakeTensor ({x.dtype}, shape {tuple(x.shape)}) holds no data; "
                "convert the real tensor it stands for"
            )
        if dtensor.is_dtensor(x):
            raise dtensor.refusal(x, "to_numpy")
        raise UnsupportedTensorError(
            f"tensor subclass {cls.__module__}.{cls.__qualname__} may not keep its values in "
            "its storage; pass a plain tensor (x.as_subclass(torch.Tensor) if it does)"
        )
    raise UnsupportedTensorError(
        f"to_numpy expects a torch.Tensor, got {cls.__qualname__}; pass "
        "tb.tree_to_numpy(x) for a dict or list of tensors, torch.as_tensor(x) for other "
        "array-likes"
    )


def dequantizing(x: Any, kind: quantized.Kind, dtype: Any, where: str) -> tuple[str, torch.device]:
    """The reason a quantized subclass is copied, and where its float32 values are made."""
    import torch

    from . import _quantized as quantized

    if dtype is None:
        raise quantized.refusal(x, kind, where)
    if kind.scheme is None and not kind.call:
        raise quantized.undequantizable(x, kind)
    if x.device.type == "meta":
        raise NoDataError(
            f"a meta {kind.name} ({kind.dtype}, shape {tuple(x.shape)}) holds no codes or "
            "scales; materialise it first"
        )
    return (
        f"is a quantized {kind.name} (dequantizing makes new values)",
        torch.device("cpu") if kind.scheme is not None else x.device,
    )
