"""Memory primitives: bit-cast views, read-only sources, fresh host memory, pinned staging.

Everything that touches raw memory lives here, once: the zero-copy views between a
tensor and an array of the same bits, the window through which torch's kernels
*read* read-only memory (never handed to a caller), the choice of allocator for a
fresh host copy, and the pinned staging of device transfers. The conversion plan
(:mod:`tensorbridge._plan`) and the batched tree staging (:mod:`tensorbridge._staging`)
both build on these; neither re-implements them.

>>> import numpy as np, torch
>>> from tensorbridge.dtypes import BY_TORCH
>>> t = torch.ones(2, dtype=torch.bfloat16)
>>> a = as_numpy(t, BY_TORCH[torch.bfloat16])
>>> a.dtype, np.shares_memory(a, as_numpy(t, BY_TORCH[torch.bfloat16]))
(dtype(bfloat16), True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ._ml_cast import astype
from .dtypes import BY_TORCH, DTypeRow

# Tensor subclasses whose storage holds their values as a plain tensor's does.
PLAIN_SUBCLASSES: tuple[type, ...] = tuple(
    cls for cls in (torch.nn.Parameter, getattr(torch.nn, "Buffer", None)) if cls is not None
)
BYTE = BY_TORCH[torch.uint8]

# A fresh copy that ends as an array is allocated by NumPy at every size (measured: from
# 100 elements to 4M, NumPy's np.empty + torch's copy_ beats torch's own .to() + .numpy()).
# One that ends as a tensor is torch's single .to() below this many bytes (one op, no
# second view to build; measured: torch's allocator is as fast or faster up to about
# 6 MiB) and NumPy's memory above it (NumPy's large allocations are backed by huge pages
# and fault in faster: 2.4x at 32 MiB). See the benchmarks' cast table and trees.
TORCH_COPY_BYTES = 8 << 20


# --- the one bit-cast, both ways -------------------------------------------------------------


def as_numpy(t: torch.Tensor, row: DTypeRow) -> np.ndarray:
    """A NumPy view of a plain CPU strided tensor (no conj/neg bit): same memory, same bits."""
    if row.carrier is None:
        return t.numpy()
    return t.view(row.carrier).numpy().view(row.numpy)


def as_tensor(a: np.ndarray, row: DTypeRow) -> torch.Tensor:
    """A tensor view of a native-order, non-negatively strided array: same memory, same bits."""
    if row.carrier is None:
        return torch.from_numpy(a)
    return torch.from_numpy(a.view(row.carrier_numpy)).view(row.torch)


# --- dtypes torch has no kernels for (int4, ...): bytes on the carrier, values in NumPy ---------


def move_bits(t: torch.Tensor, row: DTypeRow, device: Any) -> torch.Tensor:
    """``t`` (of ``row``) on ``device``, a new tensor; moved as the carrier's bytes where
    torch has no kernels for ``row`` (``.to()`` of an int4 tensor raises)."""
    if row.kernels:
        return t.to(device)
    carrier = row.carrier
    assert carrier is not None  # a kernel-less row is carried
    return t.view(carrier).to(device).view(t.dtype)


def host_array(t: torch.Tensor, row: DTypeRow) -> np.ndarray:
    """``t``'s values as an array on the host: a view of a CPU tensor's memory, else a
    transfer (as the carrier's bytes where torch has no kernels). Conj/neg bits are
    resolved first (a copy)."""
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    if not t.is_cpu:
        t = move_bits(t, row, "cpu")
    return as_numpy(t, row)


def copy_into(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``out.copy_(t)`` for every table dtype: where torch has no kernels for either side,
    ``t`` is cast by ml_dtypes' ``astype`` on the host, and the carrier's bytes copied."""
    src, dst = BY_TORCH.get(t.dtype), BY_TORCH.get(out.dtype)
    if src is None or dst is None or (src.kernels and dst.kernels):
        return out.copy_(t)
    if src is not dst:
        t = as_tensor(astype(host_array(t, src), dst.numpy), dst)
    if dst.kernels:
        return out.copy_(t)
    carrier = dst.carrier
    assert carrier is not None  # a kernel-less row is carried
    out.view(carrier).copy_(t.view(carrier))
    return out


# --- reading memory that must not be written ---------------------------------------------------


class Window:
    """Presents host memory to ``np.asarray`` as a writable array, to be *read* by torch.

    Only ever the source of a copy tensorbridge runs itself, never handed to a caller;
    writable so that torch does not warn about read-only arrays. ``owner`` keeps the
    memory alive for as long as the window is.
    """

    def __init__(
        self, address: int, shape: tuple[int, ...], strides: Any, typestr: str, owner: Any
    ) -> None:
        self.__array_interface__ = {
            "data": (address, False),
            "shape": shape,
            "strides": strides,
            "typestr": typestr,
            "version": 3,
        }
        self.owner = owner


def address(a: np.ndarray) -> int:
    """The address of ``a``'s first element."""
    return int(a.__array_interface__["data"][0])


def host_view(
    start: int, shape: tuple[int, ...], strides: Any, row: DTypeRow, owner: Any
) -> torch.Tensor:
    """A tensor over host memory at ``start`` (to copy *from*); ``owner`` keeps it alive."""
    typestr = row.carrier_numpy.str
    t = torch.from_numpy(np.asarray(Window(start, shape, strides, typestr, owner)))
    return t if row.carrier is None else t.view(row.torch)


def reader(a: np.ndarray, row: DTypeRow) -> torch.Tensor:
    """A tensor over ``a``'s memory to copy *from* (through a window if ``a`` is read-only).

    ``a`` must be native-order with non-negative strides that are whole items.
    """
    if not a.flags.writeable:
        return host_view(address(a), a.shape, a.strides, row, a)
    return as_tensor(a if type(a) is np.ndarray else a.view(np.ndarray), row)


def host_tensor(a: np.ndarray, row: DTypeRow) -> torch.Tensor:
    """A CPU tensor with ``a``'s values, to copy from: a view where torch can see the memory."""
    if not a.dtype.isnative:
        a = a.astype(row.numpy)
    elif any(s < 0 or s % a.itemsize for s in a.strides):
        a = a.copy(order="K")
    return reader(a, row)


# --- fresh host memory -------------------------------------------------------------------------


# 8-bit sources that torch converts one element at a time (no vector kernel): for
# these, a 256-entry table of torch's own results, gathered by torch's index_select,
# gives the same bits several times faster (measured: the benchmarks' cast table).
# float8_e5m2 is the high byte of a float16 (torch converts it so, one element at a
# time): shifting the codes into float16s and widening those with torch's vector kernel
# gives the same bits, NaN payloads included, from this many elements up (measured).
LOOKUP_SOURCES = frozenset({torch.float8_e4m3fn, torch.float8_e5m2})
SHIFT_FROM = 1 << 15
WIDE = frozenset({torch.float32, torch.float64})  # float16 itself would keep signalling NaNs
_TABLES: dict[tuple[torch.dtype, torch.dtype], torch.Tensor] = {}


def lookup_table(src: torch.dtype, dst: torch.dtype) -> torch.Tensor:
    """``dst`` value of every bit pattern of the 8-bit ``src``, converted by torch itself."""
    table = _TABLES.get((src, dst))
    if table is None:
        table = torch.arange(256, dtype=torch.uint8).view(src).to(dst)
        _TABLES[(src, dst)] = table
    return table


def cast_into(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``out.copy_(t)`` for host tensors, with torch's own bits, faster for 8-bit floats.

    A C-contiguous floating-point ``out`` of another dtype than a float8_e4m3fn source
    is filled from its table; float8_e5m2 widens through float16.

    >>> t = torch.tensor([1.5, -448.0], dtype=torch.float8_e4m3fn)
    >>> cast_into(torch.empty(2), t).tolist()
    [1.5, -448.0]
    """
    if (
        t.dtype in LOOKUP_SOURCES
        and out.dtype is not t.dtype
        and out.dtype.is_floating_point
        and not t.is_neg()
    ):
        if t.dtype is torch.float8_e5m2:
            if t.numel() < SHIFT_FROM or out.dtype not in WIDE:
                return out.copy_(t)
            halves = np.left_shift(t.view(torch.uint8).numpy(), 8, dtype=np.uint16)
            return out.copy_(torch.from_numpy(halves).view(torch.float16))
        if not out.is_contiguous():
            return out.copy_(t)
        codes = t.view(torch.uint8).to(torch.int32).reshape(-1)  # in C order, as out
        torch.index_select(lookup_table(t.dtype, out.dtype), 0, codes, out=out.view(-1))
        return out
    return out.copy_(t)


def plain_cast(src: DTypeRow) -> bool:
    """Whether torch's own ``copy_`` is the fastest cast from ``src`` (no lookup table)."""
    return src.torch not in LOOKUP_SOURCES


def empty(shape: tuple[int, ...], row: DTypeRow) -> torch.Tensor:
    """Uninitialised host memory for a copy, allocated by NumPy, as a tensor view."""
    return as_tensor(np.empty(shape, row.numpy), row)


def host_copy(t: torch.Tensor, dst: DTypeRow) -> torch.Tensor:
    """A host copy of a CPU tensor as a tensor, cast to ``dst``: the faster way for its size."""
    if t.numel() * dst.itemsize < TORCH_COPY_BYTES and t.dtype not in LOOKUP_SOURCES:
        return t.to(dtype=dst.torch, copy=True)  # by keyword: torch's parser decides sooner
    return cast_into(empty(tuple(t.shape), dst), t)


# t.bfloat16() and its kin are torch's .to() without its argument parser (0.15 us a call)
CAST_METHODS = {
    torch.bfloat16: "bfloat16",
    torch.float16: "half",
    torch.float32: "float",
    torch.float64: "double",
}


def array_caster(src: DTypeRow, dst: DTypeRow) -> Callable[[np.ndarray, Any], torch.Tensor]:
    """``host_copy(reader(a, src), dst)`` for arrays of a plain ``src`` dtype, written out
    as a plan's executor (``out`` is unused).

    Every leaf of a tree's ``float_dtype=`` runs it. It refuses (``ValueError``) the
    strides torch cannot view, as ``reader`` does. ``src`` must be a row without a
    carrier that torch casts itself (``plain_cast``), and ``dst`` another row.
    """
    tdt, itemsize, from_numpy = dst.torch, dst.itemsize, torch.from_numpy
    method = CAST_METHODS.get(tdt)  # a new tensor: the dtypes differ
    to = getattr(torch.Tensor, method) if method else lambda t: t.to(dtype=tdt, copy=True)

    def cast(a: np.ndarray, out: Any = None) -> torch.Tensor:
        t = from_numpy(a) if a.flags.writeable else reader(a, src)
        if a.size * itemsize < TORCH_COPY_BYTES:  # host_copy's rule
            made: torch.Tensor = to(t)
            return made
        return cast_into(empty(a.shape, dst), t)

    return cast


def fresh_copy(t: torch.Tensor, dst: DTypeRow, keep_order: bool) -> np.ndarray:
    """A host copy of a CPU tensor as an array, cast to ``dst`` by torch's kernel.

    ``keep_order`` keeps a non-contiguous tensor's memory order, like
    ``copy(order="K")`` (for plain same-dtype copies); otherwise the result is
    C-contiguous. Conjugate and negative bits are resolved on the way.
    """
    if keep_order and not t.is_contiguous():
        fresh = np.empty_like(as_numpy(t, dst), subok=False)
    else:
        fresh = np.empty(t.shape, dst.numpy)
    cast_into(as_tensor(fresh, dst), t)  # also resolves a conjugate / negative bit
    return fresh


def fresh_array_copy(a: np.ndarray) -> np.ndarray:
    """An independent copy of a native array, in its memory order (``a.copy(order="K")``)."""
    fresh: np.ndarray = a.copy(order="K")
    return fresh


# --- devices and staging -----------------------------------------------------------------------


def accelerator_available() -> bool:
    """Whether torch has an accelerator here (pinned memory helps only then)."""
    acc = getattr(torch, "accelerator", None)  # torch >= 2.6
    return bool(acc.is_available()) if acc is not None else torch.cuda.is_available()


def indexed(device: torch.device) -> torch.device:
    """``cuda`` -> ``cuda:0`` (the current device), so devices compare as torch places them."""
    if device.type == "cpu" or device.index is not None:
        return device
    return torch.empty(0, device=device).device


def staging(nbytes: int) -> torch.Tensor:
    """A host byte buffer for device copies: pinned where torch can pin, plain otherwise."""
    if accelerator_available():
        try:
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        except RuntimeError:
            pass  # no pinned-memory allocator here: the copies simply block
    return torch.empty(nbytes, dtype=torch.uint8)


def wait(device: torch.device) -> None:
    """Wait for the copies queued on ``device``'s current stream."""
    if device.type == "cpu":
        return
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
        return
    acc = getattr(torch, "accelerator", None)
    if acc is not None:
        acc.synchronize(device)
    else:  # pragma: no cover - torch < 2.6 with a non-CUDA accelerator
        getattr(torch, device.type).synchronize()


def to_host(t: torch.Tensor) -> torch.Tensor:
    """Device -> host through a pinned buffer (DMA at full speed; torch caches the block).

    For the "preallocate once, copy every step" loop: the pinned block is reused from
    torch's host-allocator cache, and the final copy into the caller's buffer is a
    host memcpy.
    """
    if not accelerator_available():
        return t.cpu()
    buf = staging(t.numel() * t.element_size())
    staged = buf.view(t.dtype).view(t.shape) if t.numel() else t.new_empty(t.shape, device="cpu")
    staged.copy_(t, non_blocking=True)
    wait(t.device)
    return staged


def to_device(t: torch.Tensor, device: Any) -> torch.Tensor:
    """Host -> ``device`` through pinned memory, ``non_blocking`` (nothing waits)."""
    if device is None or torch.device(device).type == "cpu":
        return t
    staged = t.pin_memory() if accelerator_available() else t
    return staged.to(device, non_blocking=True)
