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

>>> import torch
>>> p = plan_numpy(torch.zeros(2, dtype=torch.complex64).conj())
>>> p.steps, p.reason
(('resolve',), 'has its conjugate or negative bit set (resolving it writes new values)')
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ._torch_checks import is_tensor
from ._torch_checks import loaded as _loaded_torch
from .dtypes import (
    BY_NUMPY,
    PACKED_BY_NUMPY,
    DTypeRow,
    PackedRow,
    explain_numpy,
    native_row,
    packed_target,
    resolve_dtype,
    unpacked_target,
)
from .errors import (
    CopyRequiredError,
    InvalidArgumentError,
    MissingExtraError,
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

_VIEWABLE = "viewable"
_NEGATIVE = "negative"


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
        return _VIEWABLE
    size = a.itemsize
    if any(s < 0 for s in strides):
        return _NEGATIVE
    if size and any(s % size for s in strides):
        return tuple(strides)
    return _VIEWABLE


_CACHE_LIMIT = 4096
_NUMPY_PLANS: dict[Hashable, Plan] = {}
_TORCH_PLANS: dict[Hashable, Plan] = {}
decisions = [0]  # how many plans were decided (not found in the cache), for tests


def plan_numpy(
    x: Any,
    dtype: Any = None,
    copy: bool | None = None,
    readonly: bool = False,
    into: bool = False,
    gather: bool = False,
) -> Plan:
    """The plan for ``to_numpy(x, dtype=, copy=, readonly=, out=, gather=)``; ``into``: out=.

    Raises the error the conversion would raise (unsupported value or dtype, a copy
    that ``copy=False`` forbids, a DTensor without ``gather``).
    """
    sig = signature(x)
    if sig is None:
        return decide_numpy(x, dtype, copy, readonly, into, gather)
    key = (sig, dtype, copy, readonly, into, gather)
    try:
        return _NUMPY_PLANS[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable dtype spec: decide (and explain) without the cache
        return decide_numpy(x, dtype, copy, readonly, into, gather)
    plan = decide_numpy(x, dtype, copy, readonly, into, gather)
    if len(_NUMPY_PLANS) >= _CACHE_LIMIT:
        _NUMPY_PLANS.clear()
        QUICK_NUMPY.clear()
        QUICK_SHARES.clear()
        QUICK_VIEWS.clear()
    _NUMPY_PLANS[key] = plan
    if plan.quick is not None and not into:  # a tensor's plan: torch is loaded
        import torch

        if type(x) is torch.Tensor:
            QUICK_NUMPY[(x.dtype, dtype, copy, readonly)] = plan.quick
            if not plan.copies:
                QUICK_SHARES[(x.dtype, dtype, copy, readonly)] = plan.quick
            if dtype is None and copy is None and not readonly:
                QUICK_VIEWS[x.dtype] = plan.quick  # to_numpy asks for it with those defaults
    return plan


def plan_torch(
    x: Any,
    dtype: Any = None,
    device: Any = None,
    copy: bool | None = None,
    requires_grad: bool = False,
    into: bool = False,
    gather: bool = False,
) -> Plan:
    """The plan for ``to_torch(x, dtype=, device=, copy=, requires_grad=, out=, gather=)``.

    ``x`` is a tensor or an array (other inputs are turned into arrays first).
    """
    sig = signature(x)
    if sig is None:
        return decide_torch(x, dtype, device, copy, requires_grad, into, gather)
    key = (sig, dtype, device, copy, requires_grad, into, gather)
    try:
        return _TORCH_PLANS[key]
    except KeyError:
        pass
    except TypeError:
        return decide_torch(x, dtype, device, copy, requires_grad, into, gather)
    plan = decide_torch(x, dtype, device, copy, requires_grad, into, gather)
    if len(_TORCH_PLANS) >= _CACHE_LIMIT:
        _TORCH_PLANS.clear()
        QUICK_TORCH.clear()
    _TORCH_PLANS[key] = plan
    if plan.quick is not None and dtype is None and device is None and not into:
        QUICK_TORCH[x.dtype] = plan.quick  # to_torch asks for it with those defaults only
    return plan


def forget() -> None:
    """Empty the plan caches (for tests that count decisions)."""
    _NUMPY_PLANS.clear()
    _TORCH_PLANS.clear()
    QUICK_NUMPY.clear()
    QUICK_SHARES.clear()
    QUICK_VIEWS.clear()
    QUICK_TORCH.clear()


# --- running plans, and the quick path of the zero-copy ones -----------------------------------

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


def _spec_row(dtype: Any) -> DTypeRow | None:
    return None if dtype is None else resolve_dtype(dtype)


def _readonly(arr: np.ndarray) -> np.ndarray:
    arr = arr.view()
    arr.flags.writeable = False
    return arr


def _fill_out(arr: np.ndarray, out: np.ndarray) -> np.ndarray:
    check_out(out, arr.shape, "to_numpy")
    np.copyto(out, arr, casting="unsafe")
    return out


def _finishing(run: Callable[[Any], np.ndarray], readonly: bool, into: bool) -> Run:
    """Wrap a value -> array executor with ``out=`` or ``readonly=``."""
    if into:
        return lambda x, out: _fill_out(run(x), out)
    if readonly:
        return lambda x, out: _readonly(run(x))
    return lambda x, out: run(x)


# --- to_numpy ---------------------------------------------------------------------------------


def decide_numpy(
    x: Any, dtype: Any, copy: bool | None, readonly: bool, into: bool, gather: bool = False
) -> Plan:
    """Decide :func:`plan_numpy` (uncached)."""
    decisions[0] += 1
    if isinstance(x, np.ndarray):
        return _array_to_numpy(x, dtype, copy, readonly, into)
    import torch  # a tensor (or not convertible): torch is loaded already, or needed

    from . import _dtensor as dtensor
    from . import _quantized as quantized
    from .dtypes import PACKED_BY_TORCH

    if type(x) is not torch.Tensor and dtensor.is_dtensor(x):
        return _dtensor_to_numpy(x, dtype, copy, readonly, into, gather)
    kind = quantized.kind_of(x) if type(x) is not torch.Tensor else None
    if kind is not None:
        return _subclass_to_numpy(x, kind, dtype, copy, readonly, into)
    t = plain_tensor(x)
    detach: tuple[str, ...] = ("detach",) if t is not x else ()
    if t.is_nested:
        return _nested_to_numpy(t, dtype, copy, readonly, into)
    if t.layout is not torch.strided:
        return _sparse_to_numpy(t, dtype, copy, readonly, into)
    if t.device.type == "meta":
        raise NoDataError(
            f"a meta tensor ({t.dtype}, shape {tuple(t.shape)}) holds no data; materialise it "
            "first (e.g. x.to_empty(device='cpu') and load its values)"
        )
    if t.is_quantized:
        return _quantized_to_numpy(t, dtype, copy, readonly, into)
    packed = PACKED_BY_TORCH.get(t.dtype)
    if packed is not None:
        return _unpack_to_numpy(packed, t, dtype, copy, readonly, into)
    src = resolve_dtype(t.dtype)
    dst = src if dtype is None else resolve_dtype(dtype)
    check_cast(src, dst)
    return _strided_to_numpy(t, src, dst, detach, copy, readonly, into)


def _strided_to_numpy(
    t: torch.Tensor,
    src: DTypeRow,
    dst: DTypeRow,
    steps: tuple[str, ...],
    copy: bool | None,
    readonly: bool,
    into: bool,
) -> Plan:
    """A plain strided tensor of a table dtype: the heart of ``to_numpy``."""
    from . import _memory as mem

    on_host = t.is_cpu
    resolve = bool(t.is_conj() or t.is_neg())
    detach = "detach" in steps
    reason = None
    if not on_host:
        reason = f"is on {t.device}"
    elif resolve:
        reason = "has its conjugate or negative bit set (resolving it writes new values)"
    elif dst is not src:
        reason = f"is {src.name} and a cast to {dst.name} makes new values"
    tail = ("readonly",) if readonly and not into else ()

    def plain(x: torch.Tensor) -> torch.Tensor:
        return x.detach() if detach else x

    if into:
        moves = tuple(s for s, on in (("cast", dst is not src), ("transfer", not on_host)) if on)

        def run_into(x: torch.Tensor, out: np.ndarray) -> np.ndarray:
            return _into_numpy(plain(x), src, dst, out)

        return Plan("numpy", (*steps, *moves, "into out"), reason, True, src, dst, False, run_into)
    if reason is None:
        if copy:
            run: Run = _fresh(src, detach, readonly, keep_order=True)
            quick = None if detach else run
            return Plan("numpy", (*steps, "copy", *tail), None, True, src, dst, True, run, quick)
        view = _view(src, detach, readonly)
        quick = None if detach or resolve else view
        return Plan("numpy", (*steps, "view", *tail), None, False, src, dst, False, view, quick)
    needs_copy("to_numpy", reason, copy)
    if not on_host:
        moves = ("cast", "transfer") if dst.itemsize < src.itemsize else ("transfer", "cast")
        moves = tuple(m for m in moves if m != "cast" or dst is not src)
        shown = (*moves, "resolve") if resolve else moves

        def run_device(x: torch.Tensor) -> np.ndarray:
            t = plain(x)
            if dst.itemsize < src.itemsize:  # narrow on the device (less to move)
                t = t.to(dst.torch)
            t = t.cpu()
            if dst.torch is t.dtype and not (t.is_conj() or t.is_neg()):
                return mem.as_numpy(t, dst)
            return mem.fresh_copy(t, dst, keep_order=False)

        return Plan(
            "numpy",
            (*steps, *shown, *tail),
            reason,
            True,
            src,
            dst,
            not resolve,
            _finishing(run_device, readonly, False),
        )
    shown = ("resolve",) if resolve else ()
    if dst is not src:
        shown = (*shown, "cast")
    run = _fresh(dst, detach, readonly, keep_order=False, src=src)
    quick = None if detach or resolve else run
    return Plan("numpy", (*steps, *shown, *tail), reason, True, src, dst, not resolve, run, quick)


def _fresh(
    dst: DTypeRow, detach: bool, readonly: bool, keep_order: bool, src: DTypeRow | None = None
) -> Run:
    """The host copy / cast executor: NumPy allocates, torch's kernel converts.

    It refuses a tensor off the host (raising ``TypeError``), so that it can serve as
    the plan's quick executor; conj/neg bits are resolved by the copy itself. A C-order
    cast from a source torch converts itself is written out inline: it is every
    ``dtype=`` call's hot path.
    """
    import torch

    from . import _memory as mem

    if src is not None and not (detach or readonly or keep_order):
        ndt, tdt = dst.numpy, dst.torch
        if not mem.plain_cast(src):

            def cast_table(x: torch.Tensor, out: Any) -> np.ndarray:
                if not x.is_cpu:
                    raise TypeError("not a host tensor")
                fresh = np.empty(x.shape, ndt)
                mem.cast_into(mem.as_tensor(fresh, dst), x)
                return fresh

            return cast_table
        if dst.carrier is None:

            def cast(x: torch.Tensor, out: Any) -> np.ndarray:
                if not x.is_cpu:
                    raise TypeError("not a host tensor")
                fresh = np.empty(x.shape, ndt)
                torch.from_numpy(fresh).copy_(x)
                return fresh

            return cast
        bits = dst.carrier_numpy

        def cast_carried(x: torch.Tensor, out: Any) -> np.ndarray:
            if not x.is_cpu:
                raise TypeError("not a host tensor")
            fresh = np.empty(x.shape, ndt)
            torch.from_numpy(fresh.view(bits)).view(tdt).copy_(x)
            return fresh

        return cast_carried

    def run(x: torch.Tensor, out: Any) -> np.ndarray:
        if not x.is_cpu:
            raise TypeError("not a host tensor")
        fresh = mem.fresh_copy(x.detach() if detach else x, dst, keep_order)
        if readonly:
            fresh.flags.writeable = False
        return fresh

    return run


def _view(row: DTypeRow, detach: bool, readonly: bool) -> Run:
    """The zero-copy executors, written out: this is every call's hot path."""
    from . import _memory as mem

    if row.carrier is None and not detach and not readonly:
        return lambda x, out: x.numpy()
    carrier, ndt = row.carrier, row.numpy
    if carrier is not None and not detach and not readonly:
        return lambda x, out: x.view(carrier).numpy().view(ndt)
    if readonly:
        return lambda x, out: _readonly(mem.as_numpy(x.detach() if detach else x, row))
    return lambda x, out: mem.as_numpy(x.detach(), row)


def _into_numpy(t: torch.Tensor, src: DTypeRow, dst: DTypeRow, out: np.ndarray) -> np.ndarray:
    from . import _memory as mem
    from .dtypes import BY_TORCH

    check_out(out, tuple(t.shape), "to_numpy")
    if not out.flags.writeable:
        raise UnsupportedTensorError("out= is read-only; pass a writable array")
    if dst is not src:
        t = t.to(dst.torch)  # dtype= first, then the cast into out's dtype
    if not t.is_cpu:
        t = mem.to_host(t)
    same = BY_TORCH.get(t.dtype)
    if same is not None and same.numpy == out.dtype and not (t.is_conj() or t.is_neg()):
        np.copyto(out, mem.as_numpy(t, same))  # a plain copy: memcpy, NumPy's fastest
    elif out.dtype.isnative and all(s >= 0 and s % out.itemsize == 0 for s in out.strides):
        mem.as_tensor(out, numpy_row(out)).copy_(t)
    else:  # a layout torch cannot view: let NumPy write it
        row = BY_TORCH[t.dtype]
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        np.copyto(out, mem.as_numpy(t, row), casting="unsafe")
    return out


def _array_to_numpy(
    a: np.ndarray, dtype: Any, copy: bool | None, readonly: bool, into: bool
) -> Plan:
    """Arrays given to ``to_numpy`` (as tree leaves often are) follow the same contract.

    Only a cast imports torch (its kernel makes the new values): a view, or a plain copy,
    of an array needs none of it.
    """
    dst = _spec_row(dtype)
    src = native_row(a.dtype)
    plain_type = type(a) in (np.ndarray, np.memmap)
    viewable = plain_type and a.dtype.isnative and strides_state(a) == _VIEWABLE
    if dst is not None and dst.numpy != a.dtype:
        reason = f"is {a.dtype} and a cast to {dst.name} makes new values"
        needs_copy("to_numpy", reason, copy)
        src = numpy_row(a)
        check_cast(src, dst)
        cast_to = dst
        from . import _memory as mem

        def run_cast(x: np.ndarray) -> np.ndarray:
            return mem.fresh_copy(mem.host_tensor(x, src), cast_to, keep_order=False)

        steps = ("byteswap", "cast") if not a.dtype.isnative else ("cast",)
        return Plan(
            "numpy",
            steps,
            reason,
            True,
            src,
            dst,
            viewable,
            _finishing(run_cast, readonly, into),
        )
    if into:
        return Plan(
            "numpy", ("into out",), None, True, src, src, False, lambda x, out: _fill_out(x, out)
        )
    if copy:
        from . import _memory as mem

        run: Run = _finishing(mem.fresh_array_copy, readonly, False)
        return Plan("numpy", ("copy",), None, True, src, src, viewable and src is not None, run)
    if readonly:
        return Plan(
            "numpy", ("view", "readonly"), None, False, src, src, False, lambda x, out: _readonly(x)
        )
    return Plan("numpy", ("view",), None, False, src, src, False, lambda x, out: x)


def _nested_to_numpy(
    t: torch.Tensor, dtype: Any, copy: bool | None, readonly: bool, into: bool
) -> Plan:
    if into:
        raise UnsupportedTensorError("out= is not supported for nested tensors; omit it")

    def run(x: torch.Tensor, out: Any) -> list[np.ndarray]:
        parts = plain_tensor(x).unbind()
        return [plan_numpy(c, dtype, copy, readonly).run(c, None) for c in parts]

    return Plan("numpy", ("unbind",), None, bool(copy), None, None, False, run)


def _sparse_to_numpy(
    t: torch.Tensor, dtype: Any, copy: bool | None, readonly: bool, into: bool
) -> Plan:
    """COO/CSR/CSC/BSR tensors -> the matching scipy.sparse array; indices and values shared."""
    import torch

    from .dtypes import BY_TORCH

    try:
        import scipy.sparse  # noqa: F401
    except ImportError:
        raise MissingExtraError(
            f"converting a {t.layout} tensor needs scipy; pip install tensorbridge[sparse]"
        ) from None
    if into:
        raise UnsupportedTensorError(f"out= is not supported for {t.layout} tensors; omit it")
    if t.layout not in (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr):
        raise UnsupportedTensorError(
            f"{t.layout} tensors have no scipy.sparse counterpart; pass x.to_sparse_csr() or "
            "x.to_dense()"
        )
    reason = None
    if t.device.type != "cpu":
        reason = f"is on {t.device}"
        needs_copy("to_numpy", reason, copy)
    row = BY_TORCH.get(t.dtype)
    if dtype is None and row is not None and row.carrier:
        wide = "np.complex64" if row.category == "complex" else "np.float32"
        raise UnsupportedDtypeError(
            f"scipy.sparse cannot hold {t.dtype} values; pass dtype={wide} (lossless "
            f"for {row.name})"
        )

    def run(x: torch.Tensor, out: Any) -> Any:
        return _to_scipy(plain_tensor(x), dtype, copy, readonly)

    steps = ("transfer", "sparse") if reason else ("sparse",)
    return Plan("numpy", steps, reason, reason is not None or bool(copy), row, row, False, run)


def _to_scipy(t: torch.Tensor, dtype: Any, copy: bool | None, readonly: bool) -> Any:
    import scipy.sparse as sp
    import torch

    if t.device.type != "cpu":
        t = t.cpu()
    shape = tuple(t.shape)
    if t.dense_dim() or (len(shape) != 2 and t.layout is not torch.sparse_coo):
        raise UnsupportedTensorError(
            f"scipy.sparse holds 2-D arrays of scalars; this {t.layout} tensor has shape "
            f"{shape} with {t.dense_dim()} dense dimension(s); pass x.to_dense()"
        )

    def arr(x: torch.Tensor, dt: Any = None) -> np.ndarray:
        result: np.ndarray = plan_numpy(x, dt, copy, readonly).run(x, None)
        return result

    layout = t.layout
    if layout is torch.sparse_coo:
        coords = arr(t._indices())
        values = arr(t._values(), dtype)
        return sp.coo_array((values, tuple(coords)), shape=shape, copy=False)
    if layout is torch.sparse_csr:
        parts = (arr(t.values(), dtype), arr(t.col_indices()), arr(t.crow_indices()))
        return sp.csr_array(parts, shape=shape, copy=False)
    if layout is torch.sparse_csc:
        parts = (arr(t.values(), dtype), arr(t.row_indices()), arr(t.ccol_indices()))
        return sp.csc_array(parts, shape=shape, copy=False)
    parts = (arr(t.values(), dtype), arr(t.col_indices()), arr(t.crow_indices()))
    return sp.bsr_array(parts, shape=shape, copy=False)


def _quantized_to_numpy(
    t: torch.Tensor, dtype: Any, copy: bool | None, readonly: bool, into: bool
) -> Plan:
    import torch

    from .dtypes import BY_TORCH

    if dtype is None:
        raise UnsupportedDtypeError(
            f"quantized {t.dtype} has no NumPy dtype; pass dtype=np.float32 to dequantize, "
            "or convert tensor.int_repr() for the raw integers"
        )
    reason = "is quantized (dequantizing makes new values)"
    needs_copy("to_numpy", reason, copy)
    src = BY_TORCH[torch.float32]
    dst = resolve_dtype(dtype)
    check_cast(src, dst)
    on_host = t.device.type == "cpu"
    rest = _strided_to_numpy(torch.empty(0, device=t.device), src, dst, (), None, readonly, into)

    def run(x: torch.Tensor, out: Any) -> Any:
        return rest.run(plain_tensor(x).dequantize(), out)

    steps = ("dequantize", *(s for s in rest.steps if s != "view" or not on_host))
    return Plan("numpy", steps, reason, True, None, dst, False, run)


def _dequantizing(x: Any, kind: quantized.Kind, dtype: Any, where: str) -> tuple[str, torch.device]:
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


def _subclass_to_numpy(
    x: Any, kind: quantized.Kind, dtype: Any, copy: bool | None, readonly: bool, into: bool
) -> Plan:
    """A quantized tensor subclass: refused without dtype=, else dequantized (float32) and cast."""
    import torch

    from . import _quantized as quantized
    from .dtypes import BY_TORCH

    reason, made_on = _dequantizing(x, kind, dtype, "to_numpy")
    needs_copy("to_numpy", reason, copy)
    src = BY_TORCH[torch.float32]
    dst = resolve_dtype(dtype)
    check_cast(src, dst)
    rest = _strided_to_numpy(torch.empty(0, device=made_on), src, dst, (), None, readonly, into)

    def run(v: Any, out: Any) -> Any:
        return rest.run(quantized.dequantize(v, kind), out)

    fetch = ("transfer",) if made_on != x.device else ()
    steps = (*fetch, "dequantize", *(s for s in rest.steps if s != "view"))
    return Plan("numpy", steps, reason, True, None, dst, False, run)


def _unpack_to_numpy(
    packed: PackedRow, t: torch.Tensor, dtype: Any, copy: bool | None, readonly: bool, into: bool
) -> Plan:
    import torch

    reason = f"is packed {packed.name} (unpacking makes a new array)"
    needs_copy("to_numpy", reason, copy)
    if dtype is None:
        resolve_dtype(t.dtype)  # raises, naming the dtype= that unpacks
    widen = None if unpacked_target(dtype) is packed else dtype

    def unpack(x: torch.Tensor) -> np.ndarray:
        t = plain_tensor(x)
        if t.ndim == 0:
            raise ShapeMismatchError(
                f"unpacking {packed.name} multiplies the last dimension by {packed.per_byte}, "
                "but the tensor is 0-d; pass t.reshape(1)"
                if packed.per_byte != 2
                else f"unpacking {packed.name} doubles the last dimension, but the tensor is "
                "0-d; pass t.reshape(1)"
            )
        values = packed.unpack(t.view(torch.uint8).cpu().numpy())
        if widen is None:
            return values
        wide = torch.from_numpy(values.astype(np.float32))
        widened: np.ndarray = plan_numpy(wide, widen).run(wide, None)
        return widened

    steps = ("unpack",) if widen is None else ("unpack", "cast")
    if t.device.type != "cpu":
        steps = ("transfer", *steps)
    return Plan("numpy", steps, reason, True, None, None, False, _finishing(unpack, readonly, into))


def _dtensor_to_numpy(
    x: Any, dtype: Any, copy: bool | None, readonly: bool, into: bool, gather: bool
) -> Plan:
    """A DTensor: refused, or gathered whole (a collective) and then planned as a host tensor."""
    from . import _dtensor as dtensor

    if not gather:
        raise dtensor.refusal(x, "to_numpy")
    dtensor.check_placements(x)
    reason = "is a DTensor split across ranks (gathering it makes new memory)"
    needs_copy("to_numpy", reason, copy)
    # the gathered tensor is fresh host memory of x's dtype: the rest is its own plan
    rest = plan_numpy(dtensor.stand_in(x), dtype, None, readonly, into)

    def run(v: Any, out: Any) -> Any:
        return rest.run(dtensor.gather(v), out)

    return Plan("numpy", ("gather", *rest.steps), reason, True, rest.src, rest.dst, False, run)


# --- to_torch ---------------------------------------------------------------------------------


def decide_torch(
    x: Any,
    dtype: Any,
    device: Any,
    copy: bool | None,
    requires_grad: bool,
    into: bool,
    gather: bool = False,
) -> Plan:
    """Decide :func:`plan_torch` (uncached)."""
    import torch

    from . import _dtensor as dtensor
    from . import _memory as mem
    from . import _quantized as quantized

    decisions[0] += 1
    if type(x) is not torch.Tensor and dtensor.is_dtensor(x):
        return _dtensor_to_torch(x, dtype, device, copy, requires_grad, into, gather)
    if isinstance(x, torch.Tensor):
        kind = quantized.kind_of(x) if type(x) is not torch.Tensor else None
        if kind is not None:
            return _subclass_to_torch(x, kind, dtype, device, copy, requires_grad, into)
        return _tensor_to_torch(x, dtype, device, copy, requires_grad, into)
    if isinstance(x, np.ma.MaskedArray):
        raise UnsupportedTensorError(
            "a masked array's mask would be lost; pass a.filled(fill_value), or convert a.data "
            "and np.ma.getmaskarray(a) separately"
        )
    a: np.ndarray = x
    src = BY_NUMPY.get(a.dtype)
    reason = None
    steps: tuple[str, ...] = ()
    if src is None:
        native = a.dtype.newbyteorder("=")
        if a.dtype.byteorder not in "=|" and native in BY_NUMPY:
            src = BY_NUMPY[native]
            reason = f"is byte-swapped ({a.dtype.str})"
            steps = ("byteswap",)
        elif a.dtype in PACKED_BY_NUMPY and dtype is not None:
            return _pack_to_torch(
                PACKED_BY_NUMPY[a.dtype], dtype, device, copy, requires_grad, into
            )
        else:
            raise UnsupportedDtypeError(explain_numpy(a.dtype))
    dst = src if dtype is None else resolve_dtype(dtype)
    check_cast(src, dst)
    target = device_of(device)
    remote = target is not None and target.type != "cpu"
    state = strides_state(a) if a.dtype.isnative else _VIEWABLE
    if reason is None:
        if state == _NEGATIVE:
            reason = "has negative strides (torch has none)"
        elif state != _VIEWABLE:
            reason = f"has strides {a.strides} that are not a multiple of its item size"
        elif dst is not src:
            reason = f"is {src.name} and a cast to {dst.name} makes new values"
        elif remote:
            reason = f"must move to {target}"
        elif not a.flags.writeable:
            reason = (
                "is read-only, and a writable tensor must not alias it; for a zero-copy tensor "
                "of a file, open it copy-on-write (np.load(path, mmap_mode='c'))"
            )
    subclass = type(a) is not np.ndarray
    moves = (*(("cast",) if dst is not src else ()), *(("transfer",) if remote else ()))
    grad = ("requires grad",) if requires_grad else ()
    batch = a.dtype.isnative and state == _VIEWABLE and (target is None or target.type != "meta")

    if into:

        def run_into(x: np.ndarray, out: torch.Tensor) -> torch.Tensor:
            host = mem.host_tensor(x, src)
            return finish_tensor(host if dst is src else host.to(dst.torch), requires_grad, out)

        return Plan(
            "torch", (*steps, *moves, "into out", *grad), reason, True, src, dst, False, run_into
        )
    if reason is None:
        if copy:

            def run_copy(x: np.ndarray, out: Any) -> torch.Tensor:
                fresh = np.empty_like(x, subok=False)
                t = mem.as_tensor(fresh, src).copy_(mem.as_tensor(x.view(np.ndarray), src))
                return finish_tensor(t, requires_grad, None)

            return Plan("torch", ("copy", *grad), None, True, src, dst, batch, run_copy)
        view = _tensor_view(src, subclass, requires_grad)
        quick = None if subclass or requires_grad else view
        return Plan("torch", ("view", *grad), None, False, src, dst, False, view, quick)
    needs_copy("to_torch", reason, copy)
    if remote:

        def run_remote(x: np.ndarray, out: Any) -> torch.Tensor:
            t = mem.to_device(mem.host_tensor(x, src), target).to(dst.torch)
            return finish_tensor(t, requires_grad, None)

        return Plan("torch", (*steps, *moves, *grad), reason, True, src, dst, batch, run_remote)

    flip = dst is src and state == _NEGATIVE
    direct = a.dtype.isnative and state == _VIEWABLE  # torch can read the memory as it is

    def run_host(x: np.ndarray, out: Any) -> torch.Tensor:
        if flip:  # one copy; torch cannot view negative strides
            fresh = np.empty(x.shape, dst.numpy)
            np.copyto(fresh, x)
            made = mem.as_tensor(fresh, dst)
        else:
            host = mem.reader(x, src) if direct else mem.host_tensor(x, src)
            made = mem.host_copy(host, dst)
        return finish_tensor(made, True, None) if requires_grad else made

    shown = (*steps, *moves) if moves or steps else ("copy",)
    # A cast of memory torch can read serves writable and read-only arrays alike (the
    # reader picks the window); torch.from_numpy refuses the strides that plan otherwise.
    quick = None
    if direct and dst is not src and not (subclass or requires_grad):
        plain = src.carrier is None and mem.plain_cast(src)
        quick = mem.array_caster(src, dst) if plain else run_host
    return Plan("torch", (*shown, *grad), reason, True, src, dst, batch, run_host, quick)


def _tensor_view(row: DTypeRow, subclass: bool, requires_grad: bool) -> Run:
    """The zero-copy executors, written out: this is every call's hot path."""
    import torch

    from . import _memory as mem

    if not subclass and not requires_grad and row.carrier is None:
        return lambda x, out: torch.from_numpy(x)
    if not subclass and not requires_grad:
        carrier, tdt = row.carrier_numpy, row.torch
        frombuffer, from_numpy = torch.frombuffer, torch.from_numpy
        unit = (row.itemsize,)

        def bits(x: np.ndarray, out: Any) -> torch.Tensor:
            # A 1-D array of unit stride: one call instead of three (the carrier view,
            # from_numpy, the dtype view), the same tensor (shares x's memory, keeps x
            # alive); frombuffer refuses an empty one (ValueError).
            if x.strides == unit:
                try:
                    return frombuffer(x, dtype=tdt)
                except ValueError:
                    pass
            return from_numpy(x.view(carrier)).view(tdt)

        return bits
    return lambda x, out: finish_tensor(mem.as_tensor(x.view(np.ndarray), row), requires_grad, None)


def _pack_to_torch(
    packed: PackedRow, dtype: Any, device: Any, copy: bool | None, requires_grad: bool, into: bool
) -> Plan:
    import torch

    from . import _memory as mem

    if packed_target(dtype) is not packed:  # widen first, then the usual cast
        dst = resolve_dtype(dtype)
        reason = f"is {packed.numpy} and a cast to {dst.name} makes new values"
        needs_copy("to_torch", reason, copy)
        wide = np.empty(0, np.float32)

        def run_wide(x: np.ndarray, out: Any) -> torch.Tensor:
            w = x.astype(np.float32)
            made: torch.Tensor = plan_torch(w, dtype, device, None, requires_grad, into).run(w, out)
            return made

        rest = plan_torch(wide, dtype, device, None, requires_grad, into)
        return Plan("torch", ("cast", *rest.steps[1:]), reason, True, None, dst, False, run_wide)
    reason = f"is {packed.numpy} (packing makes a new array)"
    needs_copy("to_torch", reason, copy)

    def run_pack(x: np.ndarray, out: Any) -> torch.Tensor:
        if x.ndim == 0 or x.shape[-1] % packed.per_byte:
            raise ShapeMismatchError(
                f"packing {packed.numpy} needs a last dimension divisible by {packed.per_byte}, "
                f"got shape {x.shape}; pad the last dimension"
                if packed.per_byte != 2
                else f"packing {packed.numpy} needs an even last dimension, got shape {x.shape}; "
                "pad the last dimension to an even length"
            )
        t = torch.from_numpy(np.ascontiguousarray(packed.pack(x))).view(packed.torch)
        return finish_tensor(mem.to_device(t, device), requires_grad, out)

    steps = (
        ("pack", "transfer")
        if device is not None and torch.device(device).type != "cpu"
        else ("pack",)
    )
    return Plan("torch", steps, reason, True, None, None, False, run_pack)


def _tensor_to_torch(
    t: torch.Tensor, dtype: Any, device: Any, copy: bool | None, requires_grad: bool, into: bool
) -> Plan:
    """A tensor given to ``to_torch`` follows the same copy contract (useful inside trees)."""
    import torch

    from . import _memory as mem
    from .dtypes import BY_TORCH

    dst = None if dtype is None else resolve_dtype(dtype)
    row = BY_TORCH.get(t.dtype)
    cast = dst is not None and dst.torch is not t.dtype
    move = device is not None and mem.indexed(torch.device(device)) != t.device
    reason = "needs a cast or a device transfer" if cast or move else None
    grad = ("requires grad",) if requires_grad else ()
    target = dst.torch if dst is not None else None
    moves = (*(("cast",) if cast else ()), *(("transfer",) if move else ()))
    plain = type(t) is torch.Tensor or isinstance(t, mem.PLAIN_SUBCLASSES)
    batch = (
        plain
        and row is not None
        and t.layout is torch.strided
        and not (t.is_nested or t.is_quantized or t.is_conj() or t.is_neg())
        and t.device.type != "meta"
    )
    if reason is None:
        if copy:

            def run_clone(x: torch.Tensor, out: Any) -> torch.Tensor:
                return finish_tensor(x.to(device=device, dtype=target).clone(), requires_grad, out)

            return Plan("torch", ("copy", *grad), None, True, row, dst or row, batch, run_clone)

        def run_same(x: torch.Tensor, out: Any) -> torch.Tensor:
            return finish_tensor(x, requires_grad, out)

        steps = ("into out",) if into else ("view",)
        return Plan("torch", (*steps, *grad), None, into, row, dst or row, False, run_same)
    needs_copy("to_torch", reason, copy)

    def run_move(x: torch.Tensor, out: Any) -> torch.Tensor:
        return finish_tensor(x.to(device=device, dtype=target), requires_grad, out)

    return Plan("torch", (*moves, *grad), reason, True, row, dst or row, batch, run_move)


def _subclass_to_torch(
    x: Any,
    kind: quantized.Kind,
    dtype: Any,
    device: Any,
    copy: bool | None,
    requires_grad: bool,
    into: bool,
) -> Plan:
    """A quantized tensor subclass: as :func:`_subclass_to_numpy`, on ``x``'s device by default."""
    import torch

    from . import _quantized as quantized

    reason, made_on = _dequantizing(x, kind, dtype, "to_torch")
    needs_copy("to_torch", reason, copy)
    if device is None and x.device != made_on:
        device = x.device
    rest = plan_torch(torch.empty(0, device=made_on), dtype, device, None, requires_grad, into)

    def run(v: Any, out: Any) -> torch.Tensor:
        made: torch.Tensor = rest.run(quantized.dequantize(v, kind), out)
        return made

    fetch = ("transfer",) if made_on != x.device else ()
    steps = (*fetch, "dequantize", *(s for s in rest.steps if s != "view"))
    return Plan("torch", steps, reason, True, None, rest.dst, False, run)


def _dtensor_to_torch(
    x: Any,
    dtype: Any,
    device: Any,
    copy: bool | None,
    requires_grad: bool,
    into: bool,
    gather: bool,
) -> Plan:
    """A DTensor: refused, or gathered whole (a collective), back on its device by default."""
    from . import _dtensor as dtensor

    if not gather:
        raise dtensor.refusal(x, "to_torch")
    dtensor.check_placements(x)
    reason = "is a DTensor split across ranks (gathering it makes new memory)"
    needs_copy("to_torch", reason, copy)
    if device is None and x.device.type != "cpu":
        device = x.device
    rest = plan_torch(dtensor.stand_in(x), dtype, device, None, requires_grad, into)

    def run(v: Any, out: Any) -> torch.Tensor:
        made: torch.Tensor = rest.run(dtensor.gather(v), out)
        return made

    return Plan("torch", ("gather", *rest.steps), reason, True, rest.src, rest.dst, False, run)


def finish_tensor(t: torch.Tensor, requires_grad: bool, out: torch.Tensor | None) -> torch.Tensor:
    """Fill ``out=`` and set ``requires_grad=``: the last steps of every ``to_torch``."""
    import torch

    if out is not None:
        check_out(out, tuple(t.shape), "to_torch")
        with torch.no_grad():  # filling a caller's buffer is not an op to differentiate
            out.copy_(t)
        t = out
    if requires_grad:
        if not (t.is_floating_point() or t.is_complex()):
            raise UnsupportedDtypeError(
                f"a {t.dtype} tensor cannot require grad; pass dtype=torch.float32 as well"
            )
        # out= is returned itself; anything else becomes a leaf of its own
        t = t.requires_grad_(True) if t is out else t.detach().requires_grad_(True)
    return t
