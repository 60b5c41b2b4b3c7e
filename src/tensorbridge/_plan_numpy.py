"""The ``to_numpy`` half of the conversion plan: :func:`plan_numpy` and its decisions.

:func:`plan_numpy` looks up (or decides, with :func:`decide_numpy`) the plan for one
value signature; the builders below it decide each kind of input (a plain strided
tensor, an array, a nested, sparse, quantized, packed or DTensor value) and write
the executor that carries the steps out. They plan their parts through
:func:`plan_numpy` again, which is why the planner and the decisions share a module;
what both directions share is in :mod:`tensorbridge._plan_base`, and the package
imports all of it through :mod:`tensorbridge._plan`.

>>> import torch
>>> plan_numpy(torch.zeros(2)).steps
('view',)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from . import _plan_numpy_runs as runs
from ._ml_cast import astype
from ._plan_base import (
    CACHE_LIMIT,
    NUMPY_PLANS,
    QUICK_NUMPY,
    QUICK_SHARES,
    QUICK_VIEWS,
    VIEWABLE,
    Plan,
    Run,
    check_cast,
    decisions,
    dequantizing,
    needs_copy,
    numpy_row,
    plain_tensor,
    signature,
    strides_state,
)
from .dtypes import (
    DTypeRow,
    PackedRow,
    is_byte,
    native_row,
    resolve_dtype,
    unpacked_target,
)
from .errors import (
    MissingExtraError,
    NoDataError,
    ShapeMismatchError,
    UnsupportedDtypeError,
    UnsupportedTensorError,
)

if TYPE_CHECKING:
    import torch

    from . import _quantized as quantized


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
        return NUMPY_PLANS[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable dtype spec: decide (and explain) without the cache
        return decide_numpy(x, dtype, copy, readonly, into, gather)
    plan = decide_numpy(x, dtype, copy, readonly, into, gather)
    if len(NUMPY_PLANS) >= CACHE_LIMIT:
        NUMPY_PLANS.clear()
        QUICK_NUMPY.clear()
        QUICK_SHARES.clear()
        QUICK_VIEWS.clear()
    NUMPY_PLANS[key] = plan
    if plan.quick is not None and not into:  # a tensor's plan: torch is loaded
        import torch

        if type(x) is torch.Tensor:
            QUICK_NUMPY[(x.dtype, dtype, copy, readonly)] = plan.quick
            if not plan.copies:
                QUICK_SHARES[(x.dtype, dtype, copy, readonly)] = plan.quick
            if dtype is None and copy is None and not readonly:
                QUICK_VIEWS[x.dtype] = plan.quick  # to_numpy asks for it with those defaults
    return plan


def _spec_row(dtype: Any) -> DTypeRow | None:
    return None if dtype is None else resolve_dtype(dtype)


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
    from .dtypes import PACKED_BY_TORCH, SHELL_BY_TORCH

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
    if t.dtype in SHELL_BY_TORCH:
        return _shell_to_numpy(t, dtype, copy, readonly, into)
    src = resolve_dtype(t.dtype)
    dst = src if dtype is None else resolve_dtype(dtype)
    check_cast(src, dst)
    return _strided_to_numpy(t, src, dst, detach, copy, readonly, into)


def _shell_to_numpy(
    t: torch.Tensor, dtype: Any, copy: bool | None, readonly: bool, into: bool
) -> Plan:
    """torch's int3, uint5, ... (no NumPy type, no kernels): only ``dtype=`` int8 / uint8,
    which views the tensor's bytes as torch holds them; anything else is refused."""
    as_bytes = None if dtype is None else resolve_dtype(dtype)
    if as_bytes is None or not is_byte(as_bytes):
        resolve_dtype(t.dtype)  # raises, naming dtype=np.int8 / np.uint8
    assert as_bytes is not None
    tdt = as_bytes.torch
    rest = plan_numpy(plain_tensor(t).view(tdt), None, copy, readonly, into)

    def run(x: torch.Tensor, out: Any) -> Any:
        return rest.run(plain_tensor(x).view(tdt), out)

    return Plan("numpy", rest.steps, rest.reason, rest.copies, rest.src, rest.dst, False, run)


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
    if not (src.kernels and dst.kernels) and (into or copy or reason is not None):
        steps = (*steps, "resolve") if resolve else steps
        return _through_numpy(src, dst, steps, reason, copy, readonly, into, on_host)

    def plain(x: torch.Tensor) -> torch.Tensor:
        return x.detach() if detach else x

    if into:
        moves = tuple(s for s, on in (("cast", dst is not src), ("transfer", not on_host)) if on)

        def run_into(x: torch.Tensor, out: np.ndarray) -> np.ndarray:
            return runs.into_numpy(plain(x), src, dst, out)

        return Plan("numpy", (*steps, *moves, "into out"), reason, True, src, dst, False, run_into)
    if reason is None:
        if copy:
            run: Run = runs.fresh(src, detach, readonly, keep_order=True)
            quick = None if detach else run
            return Plan("numpy", (*steps, "copy", *tail), None, True, src, dst, True, run, quick)
        view = runs.view(src, detach, readonly)
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
            runs.finishing(run_device, readonly, False),
        )
    shown = ("resolve",) if resolve else ()
    if dst is not src:
        shown = (*shown, "cast")
    run = runs.fresh(dst, detach, readonly, keep_order=False, src=src)
    quick = None if detach or resolve else run
    return Plan("numpy", (*steps, *shown, *tail), reason, True, src, dst, not resolve, run, quick)


def _through_numpy(
    src: DTypeRow,
    dst: DTypeRow,
    steps: tuple[str, ...],
    reason: str | None,
    copy: bool | None,
    readonly: bool,
    into: bool,
    on_host: bool,
) -> Plan:
    """A copy, cast or transfer of a dtype torch has no kernels for (int4, ...), or into one
    NumPy alone has (float8_e4m3, ...): the values reach the host (a kernel-less dtype as
    its carrier's bytes), NumPy copies them and ml_dtypes' ``astype`` casts them.

    A plain copy or transfer (no cast) may be staged by the trees, which move a kernel-less
    dtype's bytes on its carrier too.
    """
    from . import _memory as mem

    if reason is not None and not into:
        needs_copy("to_numpy", reason, copy)
    cast = dst is not src
    ndt = dst.numpy

    def run(x: torch.Tensor) -> np.ndarray:
        t = plain_tensor(x)
        a = mem.host_array(t, src)
        if cast:
            return astype(a, ndt)  # ml_dtypes' own cast
        fresh: np.ndarray = a.copy(order="K") if t.is_cpu else a  # a transfer is new memory
        return fresh

    moves = (*(("transfer",) if not on_host else ()), *(("cast",) if cast else ()))
    done = ("into out",) if into else (*(moves or ("copy",)), *(("readonly",) if readonly else ()))
    shown = (*steps, *moves, *done) if into else (*steps, *done)
    batch = not (cast or into)
    return Plan("numpy", shown, reason, True, src, dst, batch, runs.finishing(run, readonly, into))


def _array_to_numpy(
    a: np.ndarray, dtype: Any, copy: bool | None, readonly: bool, into: bool
) -> Plan:
    """Arrays given to ``to_numpy`` (as tree leaves often are) follow the same contract.

    Only a cast by torch's kernel imports torch: a view, a plain copy, or a cast from or
    into a dtype torch has no kernels for (ml_dtypes' ``astype``) needs none of it.
    """
    dst = _spec_row(dtype)
    src = native_row(a.dtype)
    plain_type = type(a) in (np.ndarray, np.memmap)
    viewable = plain_type and a.dtype.isnative and strides_state(a) == VIEWABLE
    if dst is not None and dst.numpy != a.dtype:
        reason = f"is {a.dtype} and a cast to {dst.name} makes new values"
        needs_copy("to_numpy", reason, copy)
        src = numpy_row(a)
        check_cast(src, dst)
        cast_to = dst
        if src.kernels and dst.kernels:
            from . import _memory as mem

            def run_cast(x: np.ndarray) -> np.ndarray:
                return mem.fresh_copy(mem.host_tensor(x, src), cast_to, keep_order=False)

        else:  # a dtype torch has no kernels for (int4) or lacks (float8_e4m3): ml_dtypes'

            def run_cast(x: np.ndarray) -> np.ndarray:
                return astype(x, cast_to.numpy)

            viewable = False  # not for the trees' staging, which casts with torch

        steps = ("byteswap", "cast") if not a.dtype.isnative else ("cast",)
        return Plan(
            "numpy",
            steps,
            reason,
            True,
            src,
            dst,
            viewable,
            runs.finishing(run_cast, readonly, into),
        )
    if into:
        return Plan(
            "numpy",
            ("into out",),
            None,
            True,
            src,
            src,
            False,
            lambda x, out: runs.fill_out(x, out),
        )
    if copy:
        from . import _memory as mem

        run: Run = runs.finishing(mem.fresh_array_copy, readonly, False)
        batch = viewable and src is not None and src.in_torch  # the trees stage with torch
        return Plan("numpy", ("copy",), None, True, src, src, batch, run)
    if readonly:
        return Plan(
            "numpy",
            ("view", "readonly"),
            None,
            False,
            src,
            src,
            False,
            lambda x, out: runs.readonly_view(x),
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


def _subclass_to_numpy(
    x: Any, kind: quantized.Kind, dtype: Any, copy: bool | None, readonly: bool, into: bool
) -> Plan:
    """A quantized tensor subclass: refused without dtype=, else dequantized (float32) and cast."""
    import torch

    from . import _quantized as quantized
    from .dtypes import BY_TORCH

    reason, made_on = dequantizing(x, kind, dtype, "to_numpy")
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
    return Plan(
        "numpy", steps, reason, True, None, None, False, runs.finishing(unpack, readonly, into)
    )


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
