"""The ``to_torch`` half of the conversion plan: :func:`plan_torch` and its decisions.

:func:`plan_torch` looks up (or decides, with :func:`decide_torch`) the plan for one
value signature; the builders below it decide each kind of input (an array, a packed
array, a tensor, a quantized subclass, a DTensor) and write the executor, which ends
in :func:`finish_tensor` (``out=``, ``requires_grad=``). They plan their parts
through :func:`plan_torch` again, which is why the planner and the decisions share a
module; what both directions share is in :mod:`tensorbridge._plan_base`, and the
package imports all of it through :mod:`tensorbridge._plan`.

>>> import numpy as np
>>> plan_torch(np.zeros(2)).steps
('view',)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ._ml_cast import astype
from ._plan_base import (
    CACHE_LIMIT,
    NEGATIVE,
    QUICK_TORCH,
    TORCH_PLANS,
    VIEWABLE,
    Plan,
    Run,
    check_cast,
    check_out,
    decisions,
    dequantizing,
    device_of,
    needs_copy,
    signature,
    strides_state,
)
from .dtypes import (
    DTypeRow,
    PackedRow,
    explain_numpy,
    is_byte,
    packed_of_numpy,
    packed_target,
    resolve_dtype,
    row_of_numpy,
)
from .errors import (
    ShapeMismatchError,
    UnsupportedDtypeError,
    UnsupportedTensorError,
)

if TYPE_CHECKING:
    import torch

    from . import _quantized as quantized


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
        return TORCH_PLANS[key]
    except KeyError:
        pass
    except TypeError:
        return decide_torch(x, dtype, device, copy, requires_grad, into, gather)
    plan = decide_torch(x, dtype, device, copy, requires_grad, into, gather)
    if len(TORCH_PLANS) >= CACHE_LIMIT:
        TORCH_PLANS.clear()
        QUICK_TORCH.clear()
    TORCH_PLANS[key] = plan
    if plan.quick is not None and dtype is None and device is None and not into:
        QUICK_TORCH[x.dtype] = plan.quick  # to_torch asks for it with those defaults only
    return plan


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
    """Decide :func:`plan_torch` (uncached).

    One decision table read top to bottom (refusals, producers, dtype, device, copy),
    long on purpose: every branch returns a plan whose steps and reason say what it
    does, and the order of the branches is the order of precedence.
    """
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
    src = row_of_numpy(a.dtype)
    reason = None
    steps: tuple[str, ...] = ()
    if src is None:
        native = row_of_numpy(a.dtype.newbyteorder("="))
        if a.dtype.byteorder not in "=|" and native is not None:
            src = native
            reason = f"is byte-swapped ({a.dtype.str})"
            steps = ("byteswap",)
        else:
            raise UnsupportedDtypeError(explain_numpy(a.dtype))
    if not src.in_torch:
        return _numpy_only_to_torch(src, dtype, device, copy, requires_grad, into)
    dst = src if dtype is None else resolve_dtype(dtype)
    check_cast(src, dst)
    target = device_of(device)
    remote = target is not None and target.type != "cpu"
    state = strides_state(a) if a.dtype.isnative else VIEWABLE
    if reason is None:
        if state == NEGATIVE:
            reason = "has negative strides (torch has none)"
        elif state != VIEWABLE:
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
    batch = a.dtype.isnative and state == VIEWABLE and (target is None or target.type != "meta")
    if not (src.kernels and dst.kernels) and (into or copy or reason is not None):
        if reason is not None and not into:
            needs_copy("to_torch", reason, copy)
        batch = batch and dst is src and not into  # the trees stage its bytes on the carrier
        shown = (*steps, *moves, *(("into out",) if into else ())) or ("copy",)
        run = _through_numpy(src, dst, target if remote else None, requires_grad)
        return Plan("torch", (*shown, *grad), reason, True, src, dst, batch, run)

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

    flip = dst is src and state == NEGATIVE
    direct = a.dtype.isnative and state == VIEWABLE  # torch can read the memory as it is

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


def _through_numpy(
    src: DTypeRow, dst: DTypeRow, target: torch.device | None, requires_grad: bool
) -> Run:
    """The executor of a copy, cast or transfer that involves a dtype torch has no kernels
    for (int4, ...): NumPy copies, ml_dtypes' ``astype`` casts, and the new array becomes
    a tensor (moved as its carrier's bytes)."""
    from . import _memory as mem

    cast = dst is not src

    def run(x: np.ndarray, out: Any) -> torch.Tensor:
        fresh = astype(x, dst.numpy) if cast else np.array(x, order="K", subok=False)
        t = mem.as_tensor(fresh, dst)
        if target is not None:
            t = mem.move_bits(t, dst, target)
        return finish_tensor(t, requires_grad, out)

    return run


def _numpy_only_to_torch(
    src: DTypeRow, dtype: Any, device: Any, copy: bool | None, requires_grad: bool, into: bool
) -> Plan:
    """An array of a dtype torch lacks (float8_e4m3, float4_e2m1fn, ...): refused without
    ``dtype=``, packed for a packed torch dtype, else cast by ml_dtypes' ``astype`` to the
    ``dtype=`` and converted as an array of that dtype."""
    packed = packed_of_numpy(src.numpy)
    if packed is not None and dtype is not None and packed_target(dtype) is packed:
        return _pack_to_torch(packed, device, copy, requires_grad, into)
    if dtype is None:
        raise UnsupportedDtypeError(explain_numpy(src.numpy))
    dst = resolve_dtype(dtype)
    dst.torch  # noqa: B018  # raises for a NumPy-only target, naming the fix
    check_cast(src, dst)
    reason = f"is {src.name} and a cast to {dst.name} makes new values"
    needs_copy("to_torch", reason, copy)
    ndt = dst.numpy
    rest = plan_torch(np.empty(0, ndt), None, device, None, requires_grad, into)

    def run(x: np.ndarray, out: Any) -> torch.Tensor:
        wide = astype(x, ndt)
        made: torch.Tensor = rest.run(wide, out)
        return made

    steps = ("cast", *(s for s in rest.steps if s != "view"))
    return Plan("torch", steps, reason, True, src, dst, False, run)


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
    packed: PackedRow, device: Any, copy: bool | None, requires_grad: bool, into: bool
) -> Plan:
    import torch

    from . import _memory as mem

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
    from .dtypes import BY_TORCH, SHELL_BY_TORCH

    dst = None if dtype is None else resolve_dtype(dtype)
    row = BY_TORCH.get(t.dtype)
    if row is None and t.dtype in SHELL_BY_TORCH and (dst is not None or copy or device):
        # int3, uint5, ...: no kernels, no NumPy type. dtype= int8 / uint8 views its bytes;
        # a copy or a move copies them (and keeps the dtype); other casts are refused
        if dst is not None and not is_byte(dst):
            resolve_dtype(t.dtype)  # raises, naming dtype=torch.int8 / torch.uint8
        as_bytes = SHELL_BY_TORCH[t.dtype].torch if dst is None else dst.torch
        rest = _tensor_to_torch(t.view(as_bytes), None, device, copy, requires_grad, into)
        keep = dst is None

        def run_bytes(x: torch.Tensor, out: Any) -> torch.Tensor:
            made: torch.Tensor = rest.run(x.view(as_bytes), out)
            return made.view(x.dtype) if keep else made

        return Plan("torch", rest.steps, rest.reason, rest.copies, dst, dst, False, run_bytes)
    cast = dst is not None and dst.torch is not t.dtype
    move = device is not None and mem.indexed(torch.device(device)) != t.device
    reason = "needs a cast or a device transfer" if cast or move else None
    grad = ("requires grad",) if requires_grad else ()
    target = dst.torch if dst is not None else None
    moves = (*(("cast",) if cast else ()), *(("transfer",) if move else ()))
    if row is not None and not (row.kernels and (dst or row).kernels) and (reason or copy):
        needs_copy("to_torch", reason or "", copy)
        return _tensor_through_numpy(row, dst or row, device, moves, reason, requires_grad)
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


def _tensor_through_numpy(
    row: DTypeRow,
    dst: DTypeRow,
    device: Any,
    moves: tuple[str, ...],
    reason: str | None,
    requires_grad: bool,
) -> Plan:
    """A tensor's copy, cast or move where torch has no kernels for a side (int4, ...):
    copies and moves run on the carrier's bytes; a cast reaches the host, where ml_dtypes'
    ``astype`` makes the values, and goes back to ``device`` (by default the tensor's)."""
    import torch

    from . import _memory as mem

    cast = dst is not row
    carrier = row.carrier  # not a cast: the row itself is kernel-less, so carried

    def run(x: torch.Tensor, out: Any) -> torch.Tensor:
        t = x.detach()
        where = t.device if device is None else mem.indexed(torch.device(device))
        if cast:
            made = mem.as_tensor(astype(mem.host_array(t, row), dst.numpy), dst)
        elif t.device == where:
            assert carrier is not None
            made = t.view(carrier).clone().view(t.dtype)
        else:
            made = mem.move_bits(t, row, where)
        if made.device != where:
            made = mem.move_bits(made, dst, where)
        return finish_tensor(made, requires_grad, out)

    steps = moves or ("copy",)
    grad = ("requires grad",) if requires_grad else ()
    return Plan("torch", (*steps, *grad), reason, True, row, dst, False, run)


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

    reason, made_on = dequantizing(x, kind, dtype, "to_torch")
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
        from . import _memory as mem

        check_out(out, tuple(t.shape), "to_torch")
        with torch.no_grad():  # filling a caller's buffer is not an op to differentiate
            mem.copy_into(out, t)
        t = out
    if requires_grad:
        if not (t.is_floating_point() or t.is_complex()):
            raise UnsupportedDtypeError(
                f"a {t.dtype} tensor cannot require grad; pass dtype=torch.float32 as well"
            )
        # out= is returned itself; anything else becomes a leaf of its own
        t = t.requires_grad_(True) if t is out else t.detach().requires_grad_(True)
    return t
