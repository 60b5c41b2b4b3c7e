"""The executors the ``to_numpy`` plans run: every call's hot path, written out.

:mod:`tensorbridge._plan_numpy` decides; the functions here make the closures it puts in
a :class:`~tensorbridge._plan_base.Plan` (``run`` and ``quick``): the zero-copy views
(:func:`view`), the host copies and casts by torch's kernels into memory NumPy allocates
(:func:`fresh`), ``out=`` (:func:`into_numpy`, :func:`fill_out`) and ``readonly=``
(:func:`finishing`). They decide nothing a plan has not decided: which closure to make
is the plan's choice, made once per value signature.

>>> import torch
>>> from tensorbridge.dtypes import resolve_dtype
>>> t = torch.ones(2, dtype=torch.bfloat16)
>>> a = view(resolve_dtype(torch.bfloat16), False, False)(t, None)
>>> a.dtype, a.ctypes.data == t.data_ptr()
(dtype(bfloat16), True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ._plan_base import Run, check_out, numpy_row
from .dtypes import DTypeRow
from .errors import UnsupportedTensorError

if TYPE_CHECKING:
    import torch

__all__ = ["fill_out", "finishing", "fresh", "into_numpy", "readonly_view", "view"]


def readonly_view(arr: np.ndarray) -> np.ndarray:
    """A view of ``arr`` that cannot be written through."""
    arr = arr.view()
    arr.flags.writeable = False
    return arr


def fill_out(arr: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out=`` for an array already made: NumPy casts it into ``out``."""
    check_out(out, arr.shape, "to_numpy")
    np.copyto(out, arr, casting="unsafe")
    return out


def finishing(run: Callable[[Any], np.ndarray], readonly: bool, into: bool) -> Run:
    """Wrap a value -> array executor with ``out=`` or ``readonly=``."""
    if into:
        return lambda x, out: fill_out(run(x), out)
    if readonly:
        return lambda x, out: readonly_view(run(x))
    return lambda x, out: run(x)


def fresh(
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
                made = np.empty(x.shape, ndt)
                mem.cast_into(mem.as_tensor(made, dst), x)
                return made

            return cast_table
        if dst.carrier is None:

            def cast(x: torch.Tensor, out: Any) -> np.ndarray:
                if not x.is_cpu:
                    raise TypeError("not a host tensor")
                made = np.empty(x.shape, ndt)
                torch.from_numpy(made).copy_(x)
                return made

            return cast
        bits = dst.carrier_numpy

        def cast_carried(x: torch.Tensor, out: Any) -> np.ndarray:
            if not x.is_cpu:
                raise TypeError("not a host tensor")
            made = np.empty(x.shape, ndt)
            torch.from_numpy(made.view(bits)).view(tdt).copy_(x)
            return made

        return cast_carried

    def run(x: torch.Tensor, out: Any) -> np.ndarray:
        if not x.is_cpu:
            raise TypeError("not a host tensor")
        made = mem.fresh_copy(x.detach() if detach else x, dst, keep_order)
        if readonly:
            made.flags.writeable = False
        return made

    return run


def view(row: DTypeRow, detach: bool, readonly: bool) -> Run:
    """The zero-copy executors, written out: this is every call's hot path."""
    from . import _memory as mem

    if row.carrier is None and not detach and not readonly:
        return lambda x, out: x.numpy()
    carrier, ndt = row.carrier, row.numpy
    if carrier is not None and not detach and not readonly:
        return lambda x, out: x.view(carrier).numpy().view(ndt)
    if readonly:
        return lambda x, out: readonly_view(mem.as_numpy(x.detach() if detach else x, row))
    return lambda x, out: mem.as_numpy(x.detach(), row)


def into_numpy(t: torch.Tensor, src: DTypeRow, dst: DTypeRow, out: np.ndarray) -> np.ndarray:
    """``out=``: a tensor of a dtype torch has kernels for, cast to ``dst``, into ``out``."""
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
        mem.copy_into(mem.as_tensor(out, numpy_row(out)), t)  # int4 out: its carrier
    else:  # a layout torch cannot view: let NumPy write it
        row = BY_TORCH[t.dtype]
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        np.copyto(out, mem.as_numpy(t, row), casting="unsafe")
    return out
