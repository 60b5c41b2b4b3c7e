"""torch's part of the pickle machine's table: dtypes, storages, sizes, and dense tensors.

A ``torch.save`` pickle names torch's dtypes, layouts and storage classes as globals
(:data:`CONSTANTS`: values, not constructors), and rebuilds each tensor by calling
``torch._utils._rebuild_tensor_v2`` (or ``_v3``, ``_rebuild_parameter``) on a storage
its persistent id names. Here those calls are value constructors of their own
(:data:`TENSOR_BUILDERS`): each checks its arguments and gives a
:class:`~.values.TensorRef` whose every element lies inside its storage, without
allocating anything; ``torch.Size``, ``torch.device`` and layouts by name likewise.
Nothing of torch is called but its dtype and size types.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from .values import StorageRef, StorageType, TensorRef, fail

__all__ = [
    "CONSTANTS",
    "PLAIN_TENSOR_TYPES",
    "TENSOR_BUILDERS",
    "itemsize",
    "torch_device",
    "torch_layout",
    "torch_size",
]

MAX_RANK = 64  # NumPy's limit on dimensions


def _ints(x: Any, what: str) -> tuple[int, ...]:
    if type(x) not in (tuple, list, torch.Size) or len(x) > MAX_RANK:
        raise fail(f"{what} is not a tuple of at most {MAX_RANK} integers")
    for v in x:
        if type(v) is not int or not 0 <= v < 1 << 62:
            raise fail(f"{what} holds {type(v).__name__} {v!r:.40}, not a size")
    return tuple(x)


def itemsize(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype`` (sub-byte packed dtypes count their carrier byte).

    ``torch.dtype.itemsize``: nothing is allocated, so no dtype makes torch warn.
    """
    return int(dtype.itemsize)


def _tensor(storage: Any, offset: Any, size: Any, stride: Any, dtype: Any) -> TensorRef:
    if not isinstance(storage, StorageRef):
        raise fail("a tensor is rebuilt from something other than a storage in the file")
    if not isinstance(dtype, torch.dtype):
        raise fail("a tensor is rebuilt without a dtype")
    shape, strides = _ints(size, "a tensor's size"), _ints(stride, "a tensor's stride")
    if type(offset) is not int or not 0 <= offset < 1 << 62:
        raise fail("a tensor's storage offset is not a non-negative integer")
    if len(shape) != len(strides):
        raise fail(f"a tensor's size {list(shape)} and stride {list(strides)} differ in rank")
    numel = storage.numel
    if storage.dtype is None:  # an untyped storage counts bytes
        width = itemsize(dtype)
        if numel % width:
            raise fail(f"an untyped storage of {numel} bytes holds no whole {dtype} values")
        numel //= width
    elif storage.dtype != dtype:
        raise fail(f"a {dtype} tensor is rebuilt on a {storage.dtype} storage")
    count = 1
    for n in shape:  # an empty tensor's other dimensions still count (NumPy's limit)
        count *= max(n, 1)
    if 0 in shape and count * itemsize(dtype) >= 1 << 62:
        raise fail(
            f"a tensor of size {list(shape)} would take over 2**62 bytes, more than NumPy can index"
        )
    if 0 not in shape:
        last = offset + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
        if last >= numel:
            raise fail(
                f"a tensor of size {list(shape)}, stride {list(strides)} at offset {offset} "
                f"reaches element {last} of a storage of {numel}"
            )
    return TensorRef(storage, dtype, numel, offset, shape, strides)


def _rebuild_v2(args: tuple[Any, ...]) -> TensorRef:
    # torch/_utils.py: _rebuild_tensor_v2(storage, storage_offset, size, stride,
    # requires_grad, backward_hooks, metadata=None)
    if not 4 <= len(args) <= 7:
        raise fail(f"_rebuild_tensor_v2 given {len(args)} arguments")
    storage = args[0]
    dtype = storage.dtype if isinstance(storage, StorageRef) else None
    return _tensor(storage, args[1], args[2], args[3], dtype)


def _rebuild_v3(args: tuple[Any, ...]) -> TensorRef:
    # _rebuild_tensor_v3(storage, storage_offset, size, stride, requires_grad,
    # backward_hooks, dtype, metadata=None)
    if not 7 <= len(args) <= 8:
        raise fail(f"_rebuild_tensor_v3 given {len(args)} arguments")
    return _tensor(args[0], args[1], args[2], args[3], args[6])


def _rebuild_parameter(args: tuple[Any, ...]) -> TensorRef:
    # _rebuild_parameter(data, requires_grad, backward_hooks) and
    # _rebuild_parameter_with_state(data, requires_grad, backward_hooks, state)
    if not 3 <= len(args) <= 4 or not isinstance(args[0], TensorRef):
        raise fail("a parameter is rebuilt from something other than a tensor")
    return args[0]


def torch_size(args: tuple[Any, ...]) -> torch.Size:
    if len(args) != 1:
        raise fail("torch.Size given arguments it never takes")
    return torch.Size(_ints(args[0], "torch.Size"))


def torch_device(args: tuple[Any, ...]) -> str:
    # torch.device("cuda:0") or torch.device("cuda", 0): kept as its name, "cuda:0"
    name = args[0] if args and type(args[0]) is str else None
    if len(args) == 2 and type(args[1]) is int and 0 <= args[1] < 1 << 16:
        name = f"{name}:{args[1]}"
    elif len(args) != 1:
        name = None
    if name is None or not re.fullmatch(r"[a-z_]{1,32}(:[0-9]{1,5})?", name):
        raise fail("torch.device given arguments other than a device's name")
    return name


def torch_layout(args: tuple[Any, ...]) -> str:
    # torch/serialization.py: _get_layout("torch.strided")
    if len(args) != 1 or args[0] not in _LAYOUT_NAMES:
        raise fail("torch.serialization._get_layout given no layout's name")
    result: str = args[0]
    return result


TENSOR_BUILDERS = {
    "torch._utils._rebuild_tensor_v2": _rebuild_v2,
    "torch._utils._rebuild_tensor_v3": _rebuild_v3,
    "torch._utils._rebuild_parameter": _rebuild_parameter,
    "torch._utils._rebuild_parameter_with_state": _rebuild_parameter,
}
PLAIN_TENSOR_TYPES = {"torch.Tensor", "torch._tensor.Tensor", "torch.nn.parameter.Parameter"}

# the storage classes torch.save names in persistent ids (torch/storage.py's legacy names)
_STORAGE_DTYPES = {
    "DoubleStorage": torch.float64,
    "FloatStorage": torch.float32,
    "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ShortStorage": torch.int16,
    "CharStorage": torch.int8,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
    "ComplexDoubleStorage": torch.complex128,
    "ComplexFloatStorage": torch.complex64,
    # quantized tensors' storages: known, so the file reads; their tensors (rebuilt by
    # torch._utils._rebuild_qtensor, a placeholder) are listed as unsupported
    "QInt8Storage": torch.qint8,
    "QUInt8Storage": torch.quint8,
    "QInt32Storage": torch.qint32,
    "QUInt4x2Storage": torch.quint4x2,
    "QUInt2x4Storage": torch.quint2x4,
}


def _constants() -> dict[str, Any]:
    """Globals that name a value, not a constructor: dtypes, layouts, storage types."""
    out: dict[str, Any] = {}
    for name, value in vars(torch).items():  # vars(): no lazy-import __getattr__ runs
        if isinstance(value, torch.dtype):
            out[f"torch.{name}"] = value
        elif isinstance(value, torch.layout):
            out[f"torch.{name}"] = f"torch.{name}"
    for name, dtype in _STORAGE_DTYPES.items():
        out[f"torch.{name}"] = StorageType(name, dtype)
    for name in ("torch.UntypedStorage", "torch.storage.UntypedStorage"):
        out[name] = StorageType("UntypedStorage", None)
    return out


CONSTANTS = _constants()
_LAYOUT_NAMES = {k for k, v in CONSTANTS.items() if v == k}
