"""Any DLPack producer (JAX, CuPy, MLX, TensorFlow, Paddle, ...) or capsule as an input.

``to_numpy`` and ``to_torch`` hand such objects here. The rules:

* **One export.** ``__dlpack__`` is called once per conversion: a capsule can be
  consumed once, and a producer may do work (a device sync, a copy) per call. A call
  that the producer rejects with ``TypeError`` (an old signature without
  ``max_version``) made no capsule, so it is retried without the keyword.
* **Two routes, one result.** ``to_numpy`` of host memory takes NumPy's own importer
  (``np.from_dlpack``) where the stack imports every type of the table through it
  (NumPy >= 2.5 with ml_dtypes >= 0.7: :data:`~tensorbridge._versions.NUMPY_DLPACK_EXTENDED`,
  the one place that compares versions); everywhere else, and for ``to_torch`` and
  device memory always, the capsule becomes a torch tensor through torch's importer
  (zero-copy wherever torch knows the device) and the tensor paths take it from there,
  so bfloat16, every float8 and complex32 arrive as themselves whatever NumPy can
  import. Both give the same dtype, bytes, sharing and writability (tested where both
  run). Negative strides, which torch cannot hold (its importer aborts the process on
  them), go through NumPy's importer on either route.
* **Types torch lacks.** A capsule of an ml_dtypes type torch has no dtype for
  (float8_e3m4, float8_e4m3, float8_e4m3b11fnuz, bcomplex32: the (code, bits) ml_dtypes
  registers with NumPy) is relabelled, before torch's importer takes it, as the
  same-width integer of its row's carrier, and its memory viewed as the ml_dtypes type:
  an array, as NumPy's route gives. float6 and float4 codes are refused (``dlpack.h``:
  a consumer must stop importing their bits other than 6 and 4, and neither NumPy nor
  torch imports those).
* **Sub-byte integers.** torch exports int1-int7 / uint1-uint7 as ``int8`` / ``uint8``
  (DLPack has no code for them; ``aten/src/ATen/DLConvertor.cpp``): a producer's int8
  stays int8. Handed the torch tensor itself, tensorbridge knows its dtype and never
  goes through DLPack.
* **Read-only stays read-only.** torch's importer ignores DLPack's read-only flag.
  A DLPack >= 1.0 ("versioned") capsule carries it; an unversioned capsule cannot say,
  so, as ``np.from_dlpack`` does, its memory counts as read-only too. Read-only
  memory becomes a read-only NumPy view, or a copied tensor (``copy=False`` raises
  :class:`~tensorbridge.CopyRequiredError`), exactly as a read-only NumPy array does.
* **Devices torch cannot read** (Metal, Vulkan, CUDA without a CUDA torch, ...) are
  asked for a host copy through ``__dlpack__(dl_device=(kDLCPU, 0), copy=True)``.

The layouts read with ctypes are DLPack's ``dlpack.h``: ``DLManagedTensorVersioned``
(1.x) and ``DLManagedTensor`` (0.x); only the header fields are read, and the only
pointer followed is the strides array, before torch takes ownership.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.utils.dlpack

from ._versions import NUMPY_DLPACK_EXTENDED
from .dtypes import BY_NAME, DTypeRow
from .errors import CopyRequiredError, UnsupportedDtypeError, UnsupportedTensorError

__all__ = ["Imported", "import_array", "is_producer", "numpy_from", "torch_from"]

READ_ONLY = 1 << 0  # DLPACK_FLAG_BITMASK_READ_ONLY
IS_COPIED = 1 << 1  # DLPACK_FLAG_BITMASK_IS_COPIED

CPU, CUDA, CUDA_HOST, ROCM, ROCM_HOST, CUDA_MANAGED, ONEAPI, MAIA = 1, 2, 3, 10, 11, 13, 14, 17
DEVICE_NAMES = {
    1: "kDLCPU", 2: "kDLCUDA", 3: "kDLCUDAHost", 4: "kDLOpenCL", 7: "kDLVulkan",
    8: "kDLMetal", 9: "kDLVPI", 10: "kDLROCM", 11: "kDLROCMHost", 12: "kDLExtDev",
    13: "kDLCUDAManaged", 14: "kDLOneAPI", 15: "kDLWebGPU", 16: "kDLHexagon", 17: "kDLMAIA",
}  # fmt: skip
# DLDataTypeCode -> name; codes 0, 1, 2 and 5 take the bit width as a suffix.
DTYPE_CODES = {
    0: "int", 1: "uint", 2: "float", 3: "opaque_handle", 4: "bfloat", 5: "complex",
    6: "bool", 7: "float8_e3m4", 8: "float8_e4m3", 9: "float8_e4m3b11fnuz",
    10: "float8_e4m3fn", 11: "float8_e4m3fnuz", 12: "float8_e5m2", 13: "float8_e5m2fnuz",
    14: "float8_e8m0fnu", 15: "float6_e2m3fn", 16: "float6_e3m2fn", 17: "float4_e2m1fn",
    18: "bcomplex",
}  # fmt: skip
SIZED = (0, 1, 2, 4, 5, 18)  # the codes whose name takes the bit width
SUB_BYTE = (15, 16, 17)  # float6 / float4: bits 6 / 4 only, never one value a byte
# What np.from_dlpack imports, by (code, bits): NumPy's own types (the switch in
# numpy/_core/src/multiarray/dlpack.c's from_dlpack) and, with NumPy >= 2.5, the types
# ml_dtypes 0.7 registers (register_dlpack_dtype of its _DLPACK_TYPES).
NUMPY_OWN = frozenset(
    {(6, 8), (2, 16), (2, 32), (2, 64), (5, 64), (5, 128)}
    | {(code, bits) for code in (0, 1) for bits in (8, 16, 32, 64)}
)
ML_DTYPES_REGISTERED = frozenset({(4, 16), (5, 32), (18, 32)} | {(c, 8) for c in range(7, 15)})
NUMPY_IMPORTS = NUMPY_OWN | (ML_DTYPES_REGISTERED if NUMPY_DLPACK_EXTENDED else frozenset())
NUMPY_DEVICES = (CPU, CUDA_HOST, ROCM_HOST)  # host memory np.from_dlpack reads
# to_numpy takes NumPy's importer where the stack imports every type of the table with it
NUMPY_ROUTE = NUMPY_DLPACK_EXTENDED


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):  # DLPack < 1.0, capsule name "dltensor"
    _fields_ = [
        ("dl_tensor", DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):  # DLPack >= 1.0, "dltensor_versioned"
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


# Private prototypes: setting argtypes on ctypes.pythonapi's shared functions would change
# them for every other user in the process.
capsule_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(
    ("PyCapsule_GetName", ctypes.pythonapi)
)
capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)

VERSIONED = b"dltensor_versioned"
UNVERSIONED = b"dltensor"


def is_capsule(x: Any) -> bool:
    return type(x).__name__ == "PyCapsule" and type(x).__module__ == "builtins"


def is_producer(x: Any) -> bool:
    """True for an object tensorbridge imports through DLPack: a producer or a capsule.

    Tensors and NumPy arrays (subclasses too) export ``__dlpack__`` as well, but have
    paths of their own that know more than DLPack says (conjugate bits, masks).
    """
    if isinstance(x, (torch.Tensor, np.ndarray, np.generic)):
        return False
    return hasattr(type(x), "__dlpack__") or is_capsule(x)


@dataclass(frozen=True)
class Header:
    """What a capsule says about its array before anyone imports it.

    ``dtype`` is the DLPack type's name ("float32", "bfloat16", "float8_e4m3"); ``code``
    and ``bits`` its ``DLDataType``.
    """

    versioned: bool
    version: tuple[int, int] | None
    flags: int
    device: tuple[int, int]
    dtype: str
    negative_strides: bool
    code: int = 0
    bits: int = 0
    lanes: int = 1

    @property
    def numpy_only(self) -> DTypeRow | None:
        """The row of a type NumPy has and torch lacks (float8_e4m3, bcomplex32), else None."""
        row = BY_NAME.get(self.dtype)
        if row is None or row.in_torch or self.code in SUB_BYTE or self.lanes != 1:
            return None
        return row if self.bits == 8 * row.itemsize else None

    @property
    def readonly(self) -> str | None:
        """Why the memory must not be written (marked so, or unmarkable), else ``None``."""
        if not self.versioned:
            return "an unversioned DLPack export cannot mark memory writable"
        if self.flags & READ_ONLY:
            return "its DLPack export marks it so"
        return None


def read_header(capsule: Any) -> Header:
    """Read a capsule's header fields (its ownership stays with the capsule)."""
    raw = capsule_name(capsule)
    if raw == VERSIONED:
        m = DLManagedTensorVersioned.from_address(capsule_pointer(capsule, VERSIONED))
        version: tuple[int, int] | None = (m.version.major, m.version.minor)
        if m.version.major != 1:
            raise UnsupportedTensorError(
                f"the DLPack capsule is version {m.version.major}.{m.version.minor}, and "
                "tensorbridge reads 1.x; upgrade tensorbridge and torch, or export with "
                "max_version=(1, 0)"
            )
        flags, dl = int(m.flags), m.dl_tensor
    elif raw == UNVERSIONED:
        dl = DLManagedTensor.from_address(capsule_pointer(capsule, UNVERSIONED)).dl_tensor
        version, flags = None, 0
    else:
        name = "(no name)" if raw is None else raw.decode(errors="replace")
        if name.startswith("used_"):
            raise UnsupportedTensorError(
                f"this DLPack capsule ({name!r}) was already imported, and a capsule can be "
                "imported once; pass the producing array itself, or a fresh x.__dlpack__()"
            )
        raise UnsupportedTensorError(
            f"a PyCapsule named {name!r} is not a DLPack capsule ('dltensor' or "
            "'dltensor_versioned'); pass the array that exports __dlpack__"
        )
    code, bits, lanes = int(dl.dtype.code), int(dl.dtype.bits), int(dl.dtype.lanes)
    dtype = DTYPE_CODES.get(code, f"code {code}")
    if code in SIZED:
        dtype += str(bits)
    if lanes != 1:
        dtype += f"x{lanes}"
    negative = bool(dl.strides) and any(dl.strides[i] < 0 for i in range(dl.ndim))
    return Header(
        raw == VERSIONED,
        version,
        flags,
        (int(dl.device.device_type), int(dl.device.device_id)),
        dtype,
        negative,
        code,
        bits,
        lanes,
    )


def relabel(capsule: Any, row: DTypeRow) -> None:
    """Name a capsule's type the integer of ``row``'s carrier (same width), so that torch's
    importer, which lacks ``row``'s type, takes the memory; the consumer (us) owns the
    capsule's ``DLManagedTensor`` once it has it, and the bytes are viewed as ``row`` next."""
    raw = capsule_name(capsule)
    if raw == VERSIONED:
        dl = DLManagedTensorVersioned.from_address(capsule_pointer(capsule, VERSIONED)).dl_tensor
    else:
        dl = DLManagedTensor.from_address(capsule_pointer(capsule, UNVERSIONED)).dl_tensor
    carrier = row.carrier_numpy
    dl.dtype.code = 1 if carrier.kind == "u" else 0  # kDLUInt / kDLInt
    dl.dtype.bits = 8 * carrier.itemsize


def numpy_route(header: Header) -> bool:
    """Whether ``to_numpy`` takes NumPy's importer for this capsule (see the module doc)."""
    return (
        NUMPY_ROUTE
        and header.device[0] in NUMPY_DEVICES
        and header.lanes == 1
        and (header.code, header.bits) in NUMPY_IMPORTS
    )


@functools.cache
def max_version() -> tuple[int, int]:
    """The newest DLPack version torch's importer reads (every supported torch reads 1.x)."""
    own = torch.empty(0).__dlpack__(max_version=(1, 255))  # torch writes its own version
    header = DLManagedTensorVersioned.from_address(capsule_pointer(own, VERSIONED))
    return (int(header.version.major), int(header.version.minor))


def torch_reads(device_type: int) -> bool:
    """Whether this torch can import memory of a DLPack device type in place."""
    if device_type in (CPU, CUDA_HOST, ROCM_HOST):
        return True
    if device_type in (CUDA, ROCM, CUDA_MANAGED):
        return torch.cuda.is_available()
    if device_type == ONEAPI:
        xpu = getattr(torch, "xpu", None)
        return xpu is not None and bool(xpu.is_available())
    return device_type == MAIA


def device_name(device: tuple[int, int]) -> str:
    return f"{DEVICE_NAMES.get(device[0], f'device type {device[0]}')}:{device[1]}"


@dataclass(frozen=True)
class Imported:
    """A producer's array as a tensor (or, for negative strides, a NumPy array).

    Attributes:
        value: zero-copy where the device allows; a NumPy array carries its own
            read-only flag.
        readonly: why the memory must not be written (marked read-only, or from an
            unversioned capsule that cannot say); ``None`` when it may be.
        copied: the producer made this memory for us (a host copy), so nobody else
            sees it and a further copy is never needed.
    """

    value: torch.Tensor | np.ndarray
    readonly: str | None
    copied: bool


class CapsuleHolder:
    """Presents an already exported capsule to ``np.from_dlpack`` (which wants an object)."""

    def __init__(self, capsule: Any, device: tuple[int, int]) -> None:
        self.capsule, self.device = capsule, device

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device


def export(x: Any, what: str, host_copy_allowed: bool) -> tuple[Any, bool]:
    """One ``__dlpack__`` call: the capsule, and whether it is a host copy we asked for."""
    if is_capsule(x):
        return x, False
    kind, index = x.__dlpack_device__()
    device = (int(kind), int(index))
    kwargs: dict[str, Any] = {"max_version": max_version()}
    host_copy = not torch_reads(device[0])
    if host_copy:
        if not host_copy_allowed:
            raise CopyRequiredError(
                f"{what}(copy=False) cannot share memory: the input is on "
                f"{device_name(device)}, which torch cannot read in place; pass copy=None to "
                "allow a copy to the host"
            )
        kwargs["dl_device"], kwargs["copy"] = (CPU, 0), True
    elif device[0] in (CUDA, ROCM):
        # The consumer's stream, as torch.from_dlpack passes it: the producer orders its
        # pending work before it (1 is CUDA's legacy default stream).
        stream = torch.cuda.current_stream(device[1]).cuda_stream
        kwargs["stream"] = 1 if device[0] == CUDA and stream == 0 else stream
    try:
        try:
            capsule = x.__dlpack__(**kwargs)
        except TypeError:
            if "max_version" not in kwargs:
                raise
            del kwargs["max_version"]  # a producer older than DLPack 1.0
            capsule = x.__dlpack__(**kwargs)
    except (BufferError, TypeError, ValueError, NotImplementedError, RuntimeError) as e:
        where = f"from {device_name(device)} to the host" if host_copy else "through DLPack"
        raise UnsupportedTensorError(
            f"{type(x).__qualname__} could not export its data {where} ({type(e).__name__}: "
            f"{e}); convert it to a NumPy array or torch tensor with its own library first"
        ) from e
    return capsule, host_copy


def import_array(
    x: Any, what: str = "import", *, host_copy_allowed: bool = True, numpy: bool = False
) -> Imported:
    """Import a producer or capsule with one export; zero-copy where torch can read it.

    ``numpy``: the caller wants an array (``to_numpy``), so NumPy's own importer is used
    where :func:`numpy_route` says so.

    >>> t = torch.arange(3.0)
    >>> got = import_array(t.__dlpack__(max_version=(1, 0)))
    >>> got.value.data_ptr() == t.data_ptr(), got.readonly
    (True, None)
    """
    capsule, host_copy = export(x, what, host_copy_allowed)
    header = read_header(capsule)
    copied = host_copy or bool(header.flags & IS_COPIED)
    readonly = None if host_copy else header.readonly
    if numpy and numpy_route(header):
        try:
            arr = np.from_dlpack(CapsuleHolder(capsule, header.device))
        except (BufferError, TypeError, ValueError, RuntimeError):
            pass  # NumPy refused it (a rank past its limit): the capsule is unused, go on
        else:
            return Imported(arr, readonly, copied)
    row = header.numpy_only
    if row is not None:
        relabel(capsule, row)
    if header.negative_strides:
        # torch has no negative strides (its importer aborts the process on them); NumPy
        # keeps them, and the NumPy paths copy or share as they do for any such array.
        try:
            arr = np.from_dlpack(CapsuleHolder(capsule, header.device))
        except (BufferError, TypeError, ValueError, RuntimeError) as e:
            raise UnsupportedTensorError(
                f"the {header.dtype} DLPack array on {device_name(header.device)} has "
                f"negative strides, which torch cannot hold, and NumPy {np.__version__} "
                f"cannot import it ({e}); pass a copy with positive strides (x.copy() in "
                "its own library)"
            ) from e
        return Imported(arr if row is None else arr.view(row.numpy), readonly, copied)
    try:
        tensor = torch.utils.dlpack.from_dlpack(capsule)
    except (BufferError, ImportError, RuntimeError, TypeError, ValueError) as e:
        what_failed = f"the {header.dtype} DLPack array on {device_name(header.device)}"
        known = BY_NAME.get(header.dtype)
        if known is not None and known.in_torch:  # a dtype torch has: the device or layout
            raise UnsupportedTensorError(
                f"torch {torch.__version__} cannot import {what_failed} ({e}); move it to "
                "the CPU with its own library first"
            ) from e
        raise UnsupportedDtypeError(
            f"torch {torch.__version__} cannot import {what_failed} ({e}); cast it to a "
            "dtype torch has (e.g. float32) with its own library first"
        ) from e
    if row is not None:  # the carrier's integers: the memory as the type torch lacks
        return numpy_only(tensor, row, header, what, host_copy_allowed, readonly, copied)
    return Imported(tensor, readonly, copied)


def numpy_only(
    tensor: torch.Tensor,
    row: DTypeRow,
    header: Header,
    what: str,
    host_copy_allowed: bool,
    readonly: str | None,
    copied: bool,
) -> Imported:
    """A relabelled import of a type torch lacks, as the array NumPy alone can hold."""
    if not tensor.is_cpu:
        if not host_copy_allowed:
            raise CopyRequiredError(
                f"{what}(copy=False) cannot share memory: the input is {row.name} on "
                f"{device_name(header.device)}, and only NumPy holds {row.name}, on the host; "
                "pass copy=None to allow a copy to the host"
            )
        tensor, readonly, copied = tensor.cpu(), None, True
    arr = tensor.numpy().view(row.numpy)
    if readonly:
        arr.flags.writeable = False
    return Imported(arr, readonly, copied)


def aliases(result: Any, source: torch.Tensor) -> bool:
    """Whether a NumPy result lies in the memory of ``source`` (so shares it)."""
    if not isinstance(result, np.ndarray) or source.device.type != "cpu":
        return False
    storage = source.untyped_storage()
    lo = storage.data_ptr()
    here = int(result.__array_interface__["data"][0])
    return lo <= here < lo + max(storage.nbytes(), 1)


def numpy_from(
    x: Any,
    convert: Callable[..., Any],
    *,
    dtype: Any,
    copy: bool | None,
    readonly: bool,
    out: np.ndarray | None,
) -> Any:
    """``to_numpy`` of a producer: ``convert`` (the public ``to_numpy``) on its import.

    A result that shares read-only memory comes back read-only, whatever ``readonly``.
    """
    got = import_array(x, "to_numpy", host_copy_allowed=copy is not False, numpy=True)
    if got.copied and copy:
        copy = None  # the producer's copy is already new memory
    result = convert(got.value, dtype=dtype, copy=copy, readonly=readonly, out=out)
    if (
        got.readonly
        and out is None
        and isinstance(got.value, torch.Tensor)
        and result.flags.writeable
        and aliases(result, got.value)
    ):
        result = result.view()
        result.flags.writeable = False
    return result


def torch_from(
    x: Any,
    convert: Callable[..., torch.Tensor],
    *,
    dtype: Any,
    device: Any,
    copy: bool | None,
    requires_grad: bool,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """``to_torch`` of a producer: ``convert`` (the public ``to_torch``) on its import.

    Read-only memory is copied (``copy=False`` raises), as for a read-only NumPy array.
    """
    got = import_array(x, "to_torch", host_copy_allowed=copy is not False)
    if got.copied and copy:
        copy = None
    if got.readonly and out is None and isinstance(got.value, torch.Tensor):
        if copy is False:
            raise CopyRequiredError(
                f"to_torch(copy=False) cannot share memory: the input is read-only "
                f"({got.readonly}), and a writable tensor must not alias it; pass copy=None "
                "to allow the copy"
            )
        copy = True
    return convert(
        got.value, dtype=dtype, device=device, copy=copy, requires_grad=requires_grad, out=out
    )
