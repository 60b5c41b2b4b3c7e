"""Writing GGUF files: :func:`save` (streamed, atomic) and the metadata it takes.

The format and what writing promises are in :mod:`tensorbridge.io.gguf`. A save checks
every tensor and the metadata first (:func:`check_architecture`, :data:`NAMES`), builds
the header with :mod:`tensorbridge.io._gguf_header`'s encoders, then streams each
tensor's bytes, cast or quantized (Q8_0, by the ``gguf`` package) chunk by chunk. It
shares nothing with the reader but the header's constants, so it lives apart.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._atomic import atomic_write
from ..._chunks import DEFAULT_CHUNK, iter_bytes, write_counted
from ..._keys import NameRules, at_most_bytes, mapping_of, no_nul, valid_unicode
from ..._progress import progress_bar
from ..._tensorfile import cast_target, check_dense, keeping, row_of
from ..._torch_checks import is_tensor
from ...dtypes import DTypeLike, DTypeRow
from ...errors import (
    FormatError,
    InvalidArgumentError,
    UnsupportedDtypeError,
    UnsupportedTensorError,
)
from ...quant.ggml import BY_NAME, BY_PLAIN, GgmlType, gguf_qtype, gguf_quants
from .._gguf_header import (
    ALIGNMENT_KEY,
    ARCHITECTURE_KEY,
    DEFAULT_ALIGNMENT,
    MAGIC,
    MAX_DIMS,
    NUMPY_OF,
    VALUE_CODE,
    VERSION,
    encode_value,
)

if TYPE_CHECKING:
    import torch

__all__ = ["NAMES", "Quantize", "check_architecture", "metadata_value", "save"]

_WRITES_QUANTIZED = ("Q8_0",)


@dataclass(frozen=True)
class _Item:
    name: str
    value: Any
    src: DTypeRow
    type: GgmlType
    row: DTypeRow | None  # the stored dtype of a plain type; None for a quantized one
    shape: tuple[int, ...]  # PyTorch order
    nbytes: int


# llama.cpp's reader refuses a tensor name of GGML_MAX_NAME (64) bytes or more, and ends a
# name at a NUL (ggml_set_name copies a C string): the rules of tensorbridge._keys
NAMES = NameRules(
    (no_nul, valid_unicode, at_most_bytes(63, "llama.cpp (GGML_MAX_NAME is 64 with the final NUL)"))
)

Quantize = str | Mapping[str, str] | Callable[[str, tuple[int, ...]], "str | None"] | None


def save(
    tensors: Mapping[str, torch.Tensor | np.ndarray],
    path: str | os.PathLike[str],
    *,
    float_dtype: DTypeLike | None = None,
    metadata: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    quantize: Quantize = None,
    chunk_bytes: int = DEFAULT_CHUNK,
) -> None:
    """Write tensors or arrays and metadata to a GGUF file, streamed and atomic.

    >>> import os, tempfile, torch
    >>> p = os.path.join(tempfile.mkdtemp(), "m.gguf")
    >>> save({"w": torch.ones(2, 3, dtype=torch.bfloat16)}, p,
    ...      metadata={"general.architecture": "llama", "llama.block_count": 1})
    >>> with open(p) as f:
    ...     f.ggml_type("w"), f.metadata_types["llama.block_count"]
    ('BF16', 'UINT32')

    Args:
        tensors: names (kept as given) to tensors or arrays of float32, float16,
            bfloat16, float64, int8, int16, int32 or int64, with at most 4 dimensions.
        path: the file to write (replaced atomically: temporary file, fsync, rename).
        float_dtype: store floating-point values as this dtype (cast chunk by chunk).
        metadata: the key-value pairs; ``general.architecture`` is required. Python
            values get the GGUF type llama.cpp reads such keys as (an int >= 0 UINT32,
            a float FLOAT32, a list of ints INT32); NumPy scalars and 1-d arrays keep
            their own type (``np.int32(-1)``, ``np.float64(x)``).
            ``general.alignment`` (a ``np.uint32`` power of two) sets the alignment.
        quantize: ``"q8_0"`` quantizes every floating-point tensor of 2 or more
            dimensions (1-d norms and biases stay as they are, as llama.cpp keeps
            them); a mapping ``{name: "q8_0"}`` or a function ``(name, shape) -> type
            or None`` picks tensors. Bit-identical to the ``gguf`` package's quantizer.
        progress: show a progress bar (``None``: when stderr is a terminal).
        chunk_bytes: about how many bytes to hold at once when casting or quantizing.

    Raises:
        FormatError: no ``general.architecture`` in ``metadata``.
        InvalidNameError: a name :data:`NAMES` refuses (a NUL, a lone surrogate, more
            than 63 bytes).
        UnsupportedDtypeError: a dtype GGUF has no type for (bool, uint8, fp8, complex).
        UnsupportedTensorError: more than 4 dimensions, or a quantized row that is no
            whole number of blocks.
    """
    target = Path(path)
    meta = dict(metadata or {})
    check_architecture(meta, target)
    arch = meta.pop(ARCHITECTURE_KEY)
    alignment = _alignment(meta.get(ALIGNMENT_KEY, DEFAULT_ALIGNMENT))
    NAMES.check(mapping_of(tensors, repr(str(target))), repr(str(target)))
    items = []
    for name, value in tensors.items():
        try:
            items.append(_item(name, value, float_dtype, _wanted(quantize, name, value)))
        except (TypeError, ValueError) as e:
            raise type(e)(f"cannot save tensor {name!r} to {target}: {e}") from e
    if isinstance(quantize, Mapping):
        unknown = [n for n in quantize if n not in tensors]
        if unknown:
            raise KeyError(f"quantize= names {unknown[0]!r}, which is not among the tensors")
    header = _header(items, {ARCHITECTURE_KEY: arch, **meta}, alignment)
    bar = progress_bar(
        sum(it.nbytes for it in items), f"saving {target.name}", progress, tensors=len(items)
    )
    try:
        with atomic_write(target) as f:
            f.write(header)
            for it in items:
                chunks = _chunks(it, chunk_bytes)
                write_counted(f, chunks, it.name, it.nbytes, bar, "its header says")
                f.write(bytes(-it.nbytes % alignment))
    finally:
        bar.close()


def check_architecture(
    metadata: Mapping[str, Any],
    target: str | os.PathLike[str],
    fix: str = f"pass metadata={{{ARCHITECTURE_KEY!r}: ..., ...}}",
) -> None:
    """Refuse metadata without ``general.architecture`` (a non-empty string), which the
    GGUF spec requires, with ``fix`` (a CLI names its own flag) ending the message.

    >>> check_architecture({"general.architecture": "llama"}, "m.gguf")
    >>> try:
    ...     check_architecture({}, "m.gguf", fix="pass --metadata general.architecture=X")
    ... except FormatError as e:
    ...     print(str(e).split("; ")[-1])
    pass --metadata general.architecture=X
    """
    arch = metadata.get(ARCHITECTURE_KEY)
    if not isinstance(arch, str) or not arch:
        raise FormatError(
            f"cannot save {Path(target)}: a GGUF file needs the metadata key "
            f"{ARCHITECTURE_KEY!r} (the model family llama.cpp loads it as, e.g. 'llama'); "
            f"{fix}"
        )


# the row's required_metadata check (tensorbridge.io._formats: ``Format.check_metadata``)
check_metadata = check_architecture


def metadata_value(value: Any, type_name: str) -> Any:
    """``value`` (a number, bool, string or list of them) as the GGUF value type
    ``type_name`` (``"uint64"``, ``"float64"``, ``"string"``, ...): a NumPy scalar or
    1-d array, which :func:`save` stores with that type.

    >>> v = metadata_value(4096, "uint64")
    >>> type(v).__name__, int(v), metadata_value([1, 2], "int64").dtype
    ('uint64', 4096, dtype('int64'))
    """
    kind = type_name.upper()
    if kind == "STRING":
        if isinstance(value, list):
            return [str(v) for v in value]
        return value if isinstance(value, str) else str(value)
    code = VALUE_CODE.get(kind)
    if kind == "BOOL":
        scalar_type: Any = np.bool_
    elif code in NUMPY_OF:
        scalar_type = NUMPY_OF[code]
    else:
        names = [n.lower() for n in VALUE_CODE if n != "ARRAY"]
        raise InvalidArgumentError(
            f"GGUF has no value type {type_name!r}; pass one of {', '.join(names)}"
        )
    items = value if isinstance(value, list) else [value]
    if kind == "BOOL" and not all(isinstance(v, bool) for v in items):
        raise InvalidArgumentError(f"{value!r} is not a bool; pass true or false")
    if kind != "BOOL" and not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in items
    ):
        raise InvalidArgumentError(f"{value!r} is not a number; a {kind} value is one")
    if np.issubdtype(scalar_type, np.integer):  # checked first: NumPy 1.x wraps around
        info = np.iinfo(scalar_type)
        if not all(
            (isinstance(v, int) or (math.isfinite(v) and v == int(v)))
            and info.min <= int(v) <= info.max
            for v in items
        ):
            raise InvalidArgumentError(f"{value!r} does not fit {kind}; pass another type")
    out = np.array(items, dtype=scalar_type)
    return out if isinstance(value, list) else out[0]


def _alignment(value: Any) -> int:
    if (
        not isinstance(value, (int, np.integer))
        or isinstance(value, bool)
        or value <= 0
        or value & (value - 1)
        or value >= 2**32
    ):
        raise ValueError(f"{ALIGNMENT_KEY} must be a power of two below 2**32, got {value!r}")
    return int(value)


def _wanted(quantize: Quantize, name: str, value: Any) -> str | None:
    if quantize is None:
        return None
    if isinstance(quantize, str):
        array = isinstance(value, np.ndarray) or is_tensor(value)
        ndim = value.ndim if array else 0
        floating = array and row_of(value).is_floating
        return quantize if ndim >= 2 and floating else None
    if isinstance(quantize, Mapping):
        return quantize.get(name)
    return quantize(name, tuple(value.shape))


def _item(name: Any, value: Any, float_dtype: Any, quantize: str | None) -> _Item:
    if not isinstance(name, str):
        raise TypeError(f"tensor names must be str, got {type(name).__qualname__}; pass str(name)")
    if is_tensor(value):
        check_dense(value)
    elif not isinstance(value, np.ndarray) or isinstance(value, np.ma.MaskedArray):
        raise UnsupportedTensorError(
            f"the value is a {type(value).__qualname__}; GGUF stores torch.Tensor or "
            "np.ndarray values (pass torch.as_tensor(x))"
        )
    src = row_of(value)
    shape = tuple(int(d) for d in value.shape)
    if len(shape) > MAX_DIMS:
        raise UnsupportedTensorError(
            f"shape {list(shape)} has {len(shape)} dimensions; GGUF holds at most {MAX_DIMS} "
            "(reshape it)"
        )
    if quantize is not None:
        qname = quantize.upper()
        if qname not in _WRITES_QUANTIZED:
            raise InvalidArgumentError(
                f"quantize={quantize!r}: tensorbridge writes {', '.join(_WRITES_QUANTIZED)}; "
                "pass quantize='q8_0', or make other types from an F16/BF16 file with "
                "llama.cpp's llama-quantize"
            )
        gtype = BY_NAME[qname]
        if not src.is_floating:
            raise UnsupportedDtypeError(f"{src.name} values cannot be quantized to {qname}")
        width = shape[-1] if shape else 1
        if width % gtype.block_size:
            raise UnsupportedTensorError(
                f"{qname} quantizes rows in blocks of {gtype.block_size} values; the last "
                f"dimension of shape {list(shape)} is not a multiple (leave it out of quantize=)"
            )
        nbytes = math.prod(shape) // gtype.block_size * gtype.type_size
        return _Item(name, value, src, gtype, None, shape, nbytes)
    row = cast_target(src, float_dtype)
    plain = BY_PLAIN.get(row.name)
    if plain is None:
        kinds = ", ".join(t.plain or "" for t in BY_PLAIN.values())
        fix = "pass float_dtype= for floats, or convert the values"
        if not row.kernels:  # a sub-byte integer or a type only NumPy has
            fix = keeping(row)
        raise UnsupportedDtypeError(
            f"GGUF has no tensor type for {row.name}; it holds {kinds} ({fix})"
        )
    return _Item(name, value, src, plain, row, shape, math.prod(shape) * row.itemsize)


def _header(items: list[_Item], meta: dict[str, Any], alignment: int) -> bytes:
    out = bytearray(MAGIC + struct.pack("<IQQ", VERSION, len(items), len(meta)))
    for key, value in meta.items():
        if not isinstance(key, str):
            raise TypeError(f"metadata keys must be str, got {key!r}")
        out += _string(key) + encode_value(key, value)
    offset = 0
    for it in items:
        out += _string(it.name) + struct.pack("<I", len(it.shape))
        out += b"".join(struct.pack("<Q", d) for d in reversed(it.shape))
        out += struct.pack("<IQ", it.type.code, offset)
        offset += it.nbytes + (-it.nbytes % alignment)
    out += bytes(-len(out) % alignment)
    return bytes(out)


def _string(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogateescape")
    return struct.pack("<Q", len(raw)) + raw


def _chunks(it: _Item, chunk_bytes: int) -> Iterator[Any]:
    """``it``'s bytes as stored, a chunk at a time: zero-copy where the memory allows."""
    if it.row is not None:
        yield from iter_bytes(it.value, it.row, chunk_bytes)
        return
    quants = gguf_quants()
    qtype = gguf_qtype(it.type)
    v = it.value
    if is_tensor(v):
        from ...convert import to_numpy

        a = to_numpy(v.detach().cpu())
    else:
        a = np.asarray(v)
    width = it.shape[-1] if it.shape else 1
    rows = a.reshape(-1, width)
    step = max(1, chunk_bytes // 4 // width)
    for i in range(0, rows.shape[0], step):
        # the float32 values gguf's quantizer starts from (it casts rows to float32 itself)
        f32 = np.asarray(rows[i : i + step]).astype(np.float32)
        yield np.ascontiguousarray(quants.quantize(f32, qtype)).reshape(-1).data
