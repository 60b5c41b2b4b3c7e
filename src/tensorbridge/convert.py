"""``to_numpy`` and ``to_torch``: zero-copy when possible, one copy when not, never a silent loss.

The rules, in one place:

* **Bits.** Without ``dtype=``, the result holds exactly the input's bits, in the
  counterpart dtype from the table in :mod:`tensorbridge.dtypes` (bfloat16 and the
  float8 family become ml_dtypes arrays, not float32).
* **Copies** follow NumPy 2's ``copy=``: ``None`` shares memory when possible and
  copies when it must, ``True`` always returns independent memory, ``False`` never
  copies and raises :class:`~tensorbridge.CopyRequiredError` saying why a copy is
  needed. A copy is needed for a device transfer, a dtype cast, a conjugate or
  negative bit, a read-only / byte-swapped / negatively-strided array.
* **Memory safety.** A shared result keeps its owner alive (the array's ``base`` is
  the tensor; the tensor holds the array). A read-only array is never aliased by a
  writable tensor: by default it is copied; ``readonly=True`` gives the reverse
  protection on the NumPy side.
* **Casts** (``dtype=``) run torch's conversion kernels into memory allocated by
  NumPy, so they are bit-identical to ``Tensor.to()``: round-to-nearest-even, every
  NaN narrowed to bfloat16 becomes 0xFFFF, float8_e4m3fn saturates overflow and
  inf to ±448 (torch >= 2.13; NaN before), float8_e5m2 overflows to inf.
  ``tb.cast_report`` shows what a cast would do before you run it.
* **Packed fp4.** torch's ``float4_e2m1fn_x2`` keeps two values a byte, element
  ``2i`` in the low nibble and ``2i + 1`` in the high nibble (the convention of
  torch's ``Float4_e2m1fn_x2.h`` and of safetensors' ``F4``); ml_dtypes'
  ``float4_e2m1fn`` keeps one a byte. Converting between them is an explicit
  pack/unpack: pass the other type as ``dtype=``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .dtypes import (
    BY_NUMPY,
    BY_SPEC,
    BY_TORCH,
    FLOAT4_PACKED,
    FLOAT4_UNPACKED,
    DeviceLike,
    DTypeLike,
    DTypeRow,
    explain_numpy,
    native_row,
    resolve_dtype,
)
from .errors import (
    CopyRequiredError,
    NoDataError,
    ShapeMismatchError,
    UnsupportedDtypeError,
    UnsupportedTensorError,
)

__all__ = ["to_numpy", "to_torch"]

_PLAIN_SUBCLASSES: tuple[type, ...] = tuple(
    cls for cls in (torch.nn.Parameter, getattr(torch.nn, "Buffer", None)) if cls is not None
)


# --- the one bit-cast, both ways -------------------------------------------------------------


def _as_numpy(t: torch.Tensor, row: DTypeRow) -> np.ndarray:
    """A NumPy view of a plain CPU strided tensor (no conj/neg bit): same memory, same bits."""
    if row.carrier is None:
        return t.numpy()
    return t.view(row.carrier).numpy().view(row.numpy)


def _as_tensor(a: np.ndarray, row: DTypeRow) -> torch.Tensor:
    """A tensor view of a native-order, non-negatively strided array: same memory, same bits."""
    if row.carrier is None:
        return torch.from_numpy(a)
    return torch.from_numpy(a.view(row.carrier_numpy)).view(row.torch)


class _WritableAlias:
    """Presents read-only memory to ``np.asarray`` as writable.

    Only ever used as the *source* of a copy that tensorbridge runs itself, so that
    torch's kernel can read it without the "non-writable array" warning; the alias
    is never handed to the caller.
    """

    def __init__(self, a: np.ndarray) -> None:
        iface = dict(a.__array_interface__)
        iface["data"] = (iface["data"][0], False)
        self.__array_interface__ = iface
        self._owner = a


def _reader(a: np.ndarray, row: DTypeRow) -> torch.Tensor:
    """A tensor over ``a``'s memory to copy *from* (never returned to the caller)."""
    if not a.flags.writeable:
        a = np.asarray(_WritableAlias(a.view(row.carrier_numpy))).view(row.numpy)
    return _as_tensor(a, row)


# --- to_numpy ---------------------------------------------------------------------------------


def to_numpy(
    tensor: Any,
    *,
    dtype: DTypeLike | None = None,
    copy: bool | None = None,
    readonly: bool = False,
    out: np.ndarray | None = None,
) -> Any:
    """Convert a tensor to a NumPy array without losing a bit, sharing memory when possible.

    Args:
        tensor: a ``torch.Tensor`` (any dtype in the table, any device, strided,
            sparse, nested or quantized) or an ``nn.Parameter``.
        dtype: ``None`` for the exact counterpart (bfloat16 -> ``ml_dtypes.bfloat16``),
            or a NumPy dtype, torch dtype or name ("f32") to cast with torch's kernel.
        copy: ``None`` shares when possible, ``True`` always copies, ``False`` raises
            :class:`CopyRequiredError` when sharing is impossible.
        readonly: return an array that cannot be written through.
        out: a preallocated array of the same shape to write into (cast as needed,
            after the cast to ``dtype`` when both are given).

    Returns:
        An ``np.ndarray`` (its base keeps the tensor's memory alive); a
        ``scipy.sparse`` array for sparse tensors; a list of arrays for nested tensors;
        ``out`` when given.

    >>> import torch, tensorbridge as tb
    >>> t = torch.tensor([1.5, -0.0], dtype=torch.bfloat16)
    >>> a = tb.to_numpy(t)
    >>> a.dtype, a.tobytes() == t.view(torch.uint8).numpy().tobytes()
    (dtype(bfloat16), True)
    """
    if type(tensor) is torch.Tensor and out is None:
        row = BY_TORCH.get(tensor.dtype)
        if row is not None:
            arr = None
            dst = row if dtype is None else _spec_row(dtype)
            try:  # the common cases: one lookup, and torch's own checks do the rest
                if dst is row and not copy:
                    arr = _as_numpy(tensor, row)
                elif (
                    dst is not None
                    and copy is not False
                    and tensor.is_cpu
                    and tensor.layout is torch.strided
                    and not (tensor.requires_grad or tensor.is_nested)
                    and (row.category != "complex" or dst.category == "complex")
                ):
                    arr = _fresh_copy(tensor, row, dst)
            except (RuntimeError, TypeError):
                pass  # grad, device, conj/neg bit, layout: the general path says which
            if arr is not None:
                if readonly:
                    arr = arr.view()
                    arr.flags.writeable = False
                return arr
    return _to_numpy(tensor, dtype, copy, readonly, out)


def _spec_row(spec: DTypeLike) -> DTypeRow | None:
    try:
        return BY_SPEC.get(spec)
    except TypeError:  # unhashable: the general path explains
        return None


def _fresh_copy(t: torch.Tensor, src: DTypeRow, dst: DTypeRow) -> np.ndarray:
    """New NumPy memory filled by torch's (multi-threaded) copy/cast kernel.

    NumPy allocates (its large allocations fault in far faster than torch's), torch
    converts. A same-dtype copy keeps the tensor's memory order, like ``copy(order="K")``.
    """
    if dst is src:
        fresh = np.empty_like(_as_numpy(t, src), subok=False)
    else:
        fresh = np.empty(tuple(t.shape), dst.numpy)
    _as_tensor(fresh, dst).copy_(t)
    return fresh


def _check_cast(src: DTypeRow, dst: DTypeRow) -> None:
    if src.category == "complex" and dst.category != "complex":
        raise UnsupportedDtypeError(
            f"casting {src.name} to {dst.name} would discard the imaginary part; pass the real "
            "part (x.real) explicitly, or a complex dtype"
        )


def _plain(tensor: Any) -> torch.Tensor:
    """Unwrap the tensor types whose storage holds their values; refuse the rest."""
    cls = type(tensor)
    if cls is torch.Tensor:
        return tensor.detach() if tensor.requires_grad else tensor  # type: ignore[no-any-return]
    if isinstance(tensor, _PLAIN_SUBCLASSES):
        return tensor.detach()  # type: ignore[attr-defined,no-any-return]
    if isinstance(tensor, torch.Tensor):
        if tensor.is_nested:  # torch's jagged NestedTensor: unbind() gives plain views
            return tensor.detach() if tensor.requires_grad else tensor
        name = cls.__name__
        if name == "FakeTensor":
            raise NoDataError(
                f"a FakeTensor ({tensor.dtype}, shape {tuple(tensor.shape)}) holds no data; "
                "convert the real tensor it stands for"
            )
        if name == "DTensor":
            raise UnsupportedTensorError(
                "a DTensor is sharded across ranks and its local storage is not the whole "
                "tensor; pass x.full_tensor() (or x.to_local() for this rank's shard)"
            )
        raise UnsupportedTensorError(
            f"tensor subclass {cls.__module__}.{cls.__qualname__} may not keep its values in "
            "its storage; pass a plain tensor (x.as_subclass(torch.Tensor) if it does)"
        )
    if isinstance(tensor, np.ndarray):
        return tensor  # type: ignore[return-value]  # handled by the caller
    raise UnsupportedTensorError(
        f"to_numpy expects a torch.Tensor, got {cls.__qualname__}; pass torch.as_tensor(x) "
        "for other array-likes"
    )


def _needs_copy(what: str, reason: str, copy: bool | None) -> None:
    if copy is False:
        raise CopyRequiredError(
            f"{what}(copy=False) cannot share memory: the input {reason}; pass copy=None to "
            "allow the copy"
        )


def _to_numpy(
    tensor: Any, dtype: Any, copy: bool | None, readonly: bool, out: np.ndarray | None
) -> Any:
    t = _plain(tensor)
    if isinstance(t, np.ndarray):
        return _numpy_to_numpy(t, dtype, copy, readonly, out)
    if t.is_nested:
        if out is not None:
            raise UnsupportedTensorError("out= is not supported for nested tensors; omit it")
        return [to_numpy(c, dtype=dtype, copy=copy, readonly=readonly) for c in t.unbind()]
    if t.layout is not torch.strided:
        return _sparse_to_scipy(t, dtype, copy, readonly)
    if t.device.type == "meta":
        raise NoDataError(
            f"a meta tensor ({t.dtype}, shape {tuple(t.shape)}) holds no data; materialise it "
            "first (e.g. x.to_empty(device='cpu') and load its values)"
        )
    if t.is_quantized:
        if dtype is None:
            raise UnsupportedDtypeError(
                f"quantized {t.dtype} has no NumPy dtype; pass dtype=np.float32 to dequantize, "
                "or convert tensor.int_repr() for the raw integers"
            )
        _needs_copy("to_numpy", "is quantized (dequantizing makes new values)", copy)
        t = t.dequantize()
    if FLOAT4_PACKED is not None and t.dtype is FLOAT4_PACKED:
        _needs_copy("to_numpy", "is packed fp4 (unpacking makes a new array)", copy)
        return _finish(_unpack_fp4(t, dtype), readonly, out)

    src = resolve_dtype(t.dtype)
    dst = src if dtype is None else resolve_dtype(dtype)
    _check_cast(src, dst)
    reason = None
    if not t.is_cpu:
        reason = f"is on {t.device}"
    elif t.is_conj() or t.is_neg():
        reason = "has its conjugate or negative bit set (resolving it writes new values)"
    elif dst is not src:
        reason = f"is {src.name} and a cast to {dst.name} makes new values"

    if out is not None:
        _check_out(out, tuple(t.shape), "to_numpy")
        if not out.flags.writeable:
            raise UnsupportedTensorError("out= is read-only; pass a writable array")
        if dst is not src:
            t = t.to(dst.torch)  # dtype= first, then the cast into out's dtype
        if not t.is_cpu:
            t = _stage_to_host(t)
        if out.dtype.isnative and all(s >= 0 and s % out.itemsize == 0 for s in out.strides):
            _as_tensor(out, _numpy_row(out)).copy_(t)
        else:  # a layout torch cannot view: let NumPy write it
            np.copyto(out, to_numpy(t), casting="unsafe")
        return out
    if reason is None:
        arr = _fresh_copy(t, src, src) if copy else _as_numpy(t, src)
    else:
        _needs_copy("to_numpy", reason, copy)
        if not t.is_cpu:
            # Narrow on the device (less to move), widen on the host.
            if dst.itemsize < src.itemsize:
                t = t.to(dst.torch)
            t = t.cpu()
            if dst.torch is t.dtype and not (t.is_conj() or t.is_neg()):
                return _finish(_as_numpy(t, dst), readonly, None)
        arr = np.empty(tuple(t.shape), dst.numpy)
        _as_tensor(arr, dst).copy_(t)  # also resolves a conjugate / negative bit
    return _finish(arr, readonly, None)


def _finish(arr: np.ndarray, readonly: bool, out: np.ndarray | None) -> np.ndarray:
    if out is not None:
        _check_out(out, arr.shape, "to_numpy")
        np.copyto(out, arr, casting="unsafe")
        return out
    if readonly:
        arr = arr.view()
        arr.flags.writeable = False
    return arr


def _check_out(out: Any, shape: tuple[int, ...], what: str) -> None:
    if tuple(out.shape) != shape:
        raise ShapeMismatchError(
            f"{what}: out= has shape {tuple(out.shape)} but the source has shape {shape}; "
            "pass an out of the source's shape"
        )


def _numpy_row(a: np.ndarray) -> DTypeRow:
    row = native_row(a.dtype)
    if row is None:
        raise UnsupportedDtypeError(explain_numpy(a.dtype))
    return row


def _numpy_to_numpy(
    a: np.ndarray, dtype: Any, copy: bool | None, readonly: bool, out: np.ndarray | None
) -> np.ndarray:
    """Arrays given to ``to_numpy`` (as tree leaves often are) follow the same contract."""
    if dtype is not None:
        dst = resolve_dtype(dtype)
        if dst.numpy != a.dtype:
            _needs_copy("to_numpy", f"is {a.dtype} and a cast to {dst.name} makes new values", copy)
            src = _numpy_row(a)
            _check_cast(src, dst)
            fresh = np.empty(a.shape, dst.numpy)
            _as_tensor(fresh, dst).copy_(_host_tensor(a, src))
            return _finish(fresh, readonly, out)
    if out is not None:
        return _finish(a, False, out)
    return _finish(a.copy(order="K") if copy else a, readonly, None)


# --- packed fp4 -------------------------------------------------------------------------------


def _unpack_fp4(t: torch.Tensor, dtype: Any) -> np.ndarray:
    """float4_e2m1fn_x2 (two a byte, element 2i in the low nibble) -> one value a byte."""
    if dtype is None or FLOAT4_UNPACKED is None:
        raise UnsupportedDtypeError(resolve_error_for(t.dtype))
    if t.ndim == 0:
        raise ShapeMismatchError(
            "unpacking float4_e2m1fn_x2 doubles the last dimension, but the tensor is 0-d; "
            "pass t.reshape(1)"
        )
    want = np.dtype(dtype) if not isinstance(dtype, torch.dtype) else None
    values = unpack_nibbles(t.view(torch.uint8).cpu().numpy())
    if want == FLOAT4_UNPACKED:
        return values
    widened: np.ndarray = to_numpy(torch.from_numpy(values.astype(np.float32)), dtype=dtype)
    return widened


def _pack_fp4(a: np.ndarray) -> torch.Tensor:
    """One float4_e2m1fn value a byte -> torch float4_e2m1fn_x2 (the last dimension halves)."""
    if a.ndim == 0 or a.shape[-1] % 2:
        raise ShapeMismatchError(
            f"packing float4_e2m1fn needs an even last dimension, got shape {a.shape}; pad the "
            "last dimension to an even length"
        )
    packed = np.ascontiguousarray(pack_nibbles(a))
    return torch.from_numpy(packed).view(FLOAT4_PACKED)  # type: ignore[arg-type]


def unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    """Bytes of packed fp4 -> ml_dtypes ``float4_e2m1fn``, one a byte (the last axis doubles).

    The one place the nibble order lives: value ``2i`` is the low nibble of byte ``i``
    (torch's ``Float4_e2m1fn_x2.h``, safetensors' ``F4``).
    """
    assert FLOAT4_UNPACKED is not None  # packed fp4 exists only where ml_dtypes has fp4
    out = np.empty((*packed.shape[:-1], packed.shape[-1] * 2), np.uint8)
    np.bitwise_and(packed, 0x0F, out=out[..., 0::2])
    np.right_shift(packed, 4, out=out[..., 1::2])
    return out.view(FLOAT4_UNPACKED)


def pack_nibbles(values: np.ndarray) -> np.ndarray:
    """ml_dtypes ``float4_e2m1fn`` (even last axis) -> uint8 bytes, two values a byte."""
    u = values.view(np.uint8)
    packed: np.ndarray = (u[..., 0::2] & 0x0F) | (u[..., 1::2] << 4)
    return packed


def resolve_error_for(tdt: torch.dtype) -> str:
    try:
        resolve_dtype(tdt)
    except UnsupportedDtypeError as e:
        return str(e)
    return f"{tdt} cannot be converted this way"  # pragma: no cover


# --- sparse -----------------------------------------------------------------------------------


def _sparse_to_scipy(t: torch.Tensor, dtype: Any, copy: bool | None, readonly: bool) -> Any:
    """COO/CSR/CSC/BSR tensors -> the matching scipy.sparse array; indices and values shared."""
    try:
        import scipy.sparse as sp
    except ImportError:
        raise UnsupportedTensorError(
            f"converting a {t.layout} tensor needs scipy; pip install tensorbridge[sparse]"
        ) from None
    if t.device.type != "cpu":
        _needs_copy("to_numpy", f"is on {t.device}", copy)
        t = t.cpu()
    shape = tuple(t.shape)
    if t.dense_dim() or (len(shape) != 2 and t.layout is not torch.sparse_coo):
        raise UnsupportedTensorError(
            f"scipy.sparse holds 2-D arrays of scalars; this {t.layout} tensor has shape "
            f"{shape} with {t.dense_dim()} dense dimension(s); pass x.to_dense()"
        )

    def arr(x: torch.Tensor, dt: Any = None) -> np.ndarray:
        return to_numpy(x, dtype=dt, copy=copy, readonly=readonly)  # type: ignore[no-any-return]

    values_dtype = dtype
    row = BY_TORCH.get(t.dtype)
    if dtype is None and row is not None and row.carrier:
        wide = "np.complex64" if row.category == "complex" else "np.float32"
        raise UnsupportedDtypeError(
            f"scipy.sparse cannot hold {t.dtype} values; pass dtype={wide} (lossless "
            f"for {row.name})"
        )
    layout = t.layout
    if layout is torch.sparse_coo:
        coords = arr(t._indices())
        values = arr(t._values(), values_dtype)
        return sp.coo_array((values, tuple(coords)), shape=shape, copy=False)
    if layout is torch.sparse_csr:
        parts = (arr(t.values(), values_dtype), arr(t.col_indices()), arr(t.crow_indices()))
        return sp.csr_array(parts, shape=shape, copy=False)
    if layout is torch.sparse_csc:
        parts = (arr(t.values(), values_dtype), arr(t.row_indices()), arr(t.ccol_indices()))
        return sp.csc_array(parts, shape=shape, copy=False)
    if layout is torch.sparse_bsr:
        parts = (arr(t.values(), values_dtype), arr(t.col_indices()), arr(t.crow_indices()))
        return sp.bsr_array(parts, shape=shape, copy=False)
    raise UnsupportedTensorError(
        f"{layout} tensors have no scipy.sparse counterpart; pass x.to_sparse_csr() or x.to_dense()"
    )


# --- to_torch ---------------------------------------------------------------------------------


def to_torch(
    array: Any,
    *,
    dtype: DTypeLike | None = None,
    device: DeviceLike | None = None,
    copy: bool | None = None,
    requires_grad: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Convert a NumPy array (or scalar) to a tensor without losing a bit, sharing when possible.

    Args:
        array: an ``np.ndarray`` of any dtype in the table (ml_dtypes included), a
            NumPy or ml_dtypes scalar, a ``np.memmap``, or anything ``np.asarray`` takes.
        dtype: ``None`` for the exact counterpart, or a dtype / name to cast to.
        device: where the tensor should live; accelerators are fed through pinned
            memory with ``non_blocking=True``.
        copy: ``None`` shares when possible, ``True`` always copies, ``False`` raises
            :class:`CopyRequiredError` when sharing is impossible (read-only memory,
            negative strides, byte-swapped data, a cast, a device transfer).
        requires_grad: make the result a leaf tensor that requires grad.
        out: a preallocated tensor of the same shape to write into (cast as needed,
            after the cast to ``dtype`` when both are given); it is returned itself, and
            ``requires_grad=True`` sets it on ``out``.

    >>> import numpy as np, ml_dtypes, tensorbridge as tb
    >>> a = np.array([1.0, 2.5], dtype=ml_dtypes.bfloat16)
    >>> t = tb.to_torch(a)
    >>> t.dtype, np.shares_memory(a, tb.to_numpy(t))
    (torch.bfloat16, True)
    """
    if (
        type(array) is np.ndarray
        and dtype is None
        and device is None
        and copy is None
        and out is None
        and not requires_grad
    ):
        row = BY_NUMPY.get(array.dtype)
        if row is not None and array.flags.writeable:
            try:
                return _as_tensor(array, row)
            except ValueError:
                pass  # negative strides: the general path copies
    return _to_torch(array, dtype, device, copy, requires_grad, out)


def _to_torch(
    array: Any,
    dtype: Any,
    device: Any,
    copy: bool | None,
    requires_grad: bool,
    out: torch.Tensor | None,
) -> torch.Tensor:
    if isinstance(array, torch.Tensor):
        return _finish_tensor(_tensor_to_torch(array, dtype, device, copy), requires_grad, out)
    if isinstance(array, np.ma.MaskedArray):
        raise UnsupportedTensorError(
            "a masked array's mask would be lost; pass a.filled(fill_value), or convert a.data "
            "and np.ma.getmaskarray(a) separately"
        )
    a = array.view(np.ndarray) if isinstance(array, np.ndarray) else np.asarray(array)
    if isinstance(a, np.ma.MaskedArray):  # np.asarray of an object that produced one
        raise UnsupportedTensorError("a masked array's mask would be lost; pass a.filled()")

    src = BY_NUMPY.get(a.dtype)
    reason = None
    if src is None:
        native = a.dtype.newbyteorder("=")
        if a.dtype.byteorder not in "=|" and native in BY_NUMPY:
            src = BY_NUMPY[native]
            reason = f"is byte-swapped ({a.dtype.str})"
        elif FLOAT4_UNPACKED is not None and a.dtype == FLOAT4_UNPACKED and dtype is not None:
            dst_is_packed = dtype is FLOAT4_PACKED or str(dtype) == "float4_e2m1fn_x2"
            if not dst_is_packed:
                a = a.astype(np.float32)
                src = BY_NUMPY[a.dtype]
            else:
                _needs_copy("to_torch", "is float4_e2m1fn (packing makes a new array)", copy)
                return _finish_tensor(_place(_pack_fp4(a), device), requires_grad, out)
        else:
            raise UnsupportedDtypeError(explain_numpy(a.dtype))
    dst = src if dtype is None else resolve_dtype(dtype)
    _check_cast(src, dst)
    target = torch.device(device) if device is not None else None
    if reason is None:
        if any(s < 0 for s in a.strides):
            reason = "has negative strides (torch has none)"
        elif any(s % a.itemsize for s in a.strides):
            reason = f"has strides {a.strides} that are not a multiple of its item size"
        elif dst is not src:
            reason = f"is {src.name} and a cast to {dst.name} makes new values"
        elif target is not None and target.type != "cpu":
            reason = f"must move to {target}"
        elif not a.flags.writeable:
            reason = (
                "is read-only, and a writable tensor must not alias it; for a zero-copy tensor "
                "of a file, open it copy-on-write (np.load(path, mmap_mode='c'))"
            )

    if out is not None:
        host = _host_tensor(a, src)
        return _finish_tensor(host if dst is src else host.to(dst.torch), requires_grad, out)
    if reason is None:
        t = _as_tensor(a, src)
        if copy:
            fresh = np.empty_like(a, subok=False)
            t = _as_tensor(fresh, src).copy_(t)
        return _finish_tensor(t, requires_grad, None)
    _needs_copy("to_torch", reason, copy)
    if target is not None and target.type != "cpu":
        host = _host_tensor(a, src)
        staged = host.pin_memory() if _accelerator_available() else host.clone()
        t = staged.to(target, non_blocking=True).to(dst.torch)
        return _finish_tensor(t, requires_grad, None)
    fresh = np.empty(a.shape, dst.numpy)
    if dst is src and a.dtype.isnative and any(s < 0 for s in a.strides):
        np.copyto(fresh, a)  # one copy; torch cannot view negative strides
    else:
        _as_tensor(fresh, dst).copy_(_host_tensor(a, src))
    return _finish_tensor(_as_tensor(fresh, dst), requires_grad, None)


def _host_tensor(a: np.ndarray, row: DTypeRow) -> torch.Tensor:
    """A CPU tensor with ``a``'s values, to copy from: a view where torch can see the memory."""
    if not a.dtype.isnative:
        a = a.astype(row.numpy)
    elif any(s < 0 or s % a.itemsize for s in a.strides):
        a = a.copy(order="K")
    return _reader(a, row)


def _stage_to_host(t: torch.Tensor) -> torch.Tensor:
    """Device -> host through pinned memory (DMA at full speed; torch caches the block).

    For the "preallocate once, copy every step" loop: the pinned block is reused from
    torch's host-allocator cache, and the final copy into the caller's buffer is a
    host memcpy.
    """
    if not _accelerator_available():
        return t.cpu()
    staged = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    staged.copy_(t, non_blocking=True)
    acc = getattr(torch, "accelerator", None)
    if acc is not None and hasattr(acc, "synchronize"):  # torch >= 2.6
        acc.synchronize(t.device)
    else:
        torch.cuda.synchronize(t.device)
    return staged


def _accelerator_available() -> bool:
    acc = getattr(torch, "accelerator", None)  # torch >= 2.6
    return bool(acc.is_available()) if acc is not None else torch.cuda.is_available()


def _place(t: torch.Tensor, device: Any) -> torch.Tensor:
    if device is None or torch.device(device).type == "cpu":
        return t
    staged = t.pin_memory() if _accelerator_available() else t
    return staged.to(device, non_blocking=True)


def _finish_tensor(t: torch.Tensor, requires_grad: bool, out: torch.Tensor | None) -> torch.Tensor:
    if out is not None:
        _check_out(out, tuple(t.shape), "to_torch")
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


def _tensor_to_torch(t: torch.Tensor, dtype: Any, device: Any, copy: bool | None) -> torch.Tensor:
    """A tensor given to ``to_torch`` follows the same copy contract (useful inside trees)."""
    dst = None if dtype is None else resolve_dtype(dtype).torch
    moved = t.to(device=device, dtype=dst)
    if moved.data_ptr() == t.data_ptr() and moved.device == t.device:
        if copy:
            moved = moved.clone()
    else:
        _needs_copy("to_torch", "needs a cast or a device transfer", copy)
    return moved
