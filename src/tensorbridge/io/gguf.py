"""GGUF, llama.cpp's file format: read memory-mapped and checked, written atomically.

The layout is in :mod:`tensorbridge.io._gguf_header` (checked field by field before
anything is mapped or allocated). What this module promises:

* **Shapes in PyTorch order.** GGUF stores dimensions innermost first (ggml's
  ``ne[0]`` is the row length), so a ``[4096, 11008]`` weight is ``[11008, 4096]`` in
  the file; reading reverses them back and writing reverses them again, so
  ``tb.load(tb.save(x))`` has ``x``'s shape. The bytes are the same row-major bytes.
* **Plain types zero-copy.** F32, F16, BF16, F64, I8, I16, I32 and I64 tensors are
  read-only views of the memory-mapped file (torch: copy-on-write). BF16 comes as
  ``ml_dtypes.bfloat16`` / ``torch.bfloat16``, never as raw ``uint8`` bytes.
* **Quantized types kept or dequantized, never guessed.** A block-quantized tensor
  (Q4_0 ... Q8_0, the K-quants, IQ types, MXFP4, NVFP4) read as a plain array raises
  :class:`~tensorbridge.errors.UnsupportedDtypeError` naming ``dequantize=``; opened
  with ``dequantize="bf16"`` (or ``"f32"``, ``"f16"``) it reads as values: computed
  in float32 exactly as the ``gguf`` package (the reference) computes them, and
  rounded once to that dtype. ``f.raw(name)`` gives the untouched
  blocks, ``f.ggml_type(name)`` the type; each type's block layout (nibble order
  included: GGUF's MXFP4 puts element ``j`` and ``j + 16`` in one byte, safetensors'
  F4 ``2j`` and ``2j + 1``) is in ``_gguf_header.TYPES``.
* **Metadata.** ``f.metadata`` shows every key-value pair as text (lists as JSON);
  ``f.plain_values()`` gives them typed (NumPy scalars keep UINT32 apart from INT32),
  ``f.metadata_types`` names each type (``"ARRAY[STRING]"``).
* **Writing** F32 / F16 / BF16 / F64 / I8-I64 tensors, and Q8_0 (``quantize="q8_0"``:
  bit-identical to the ``gguf`` package's quantizer), with the caller's metadata,
  which must name ``general.architecture`` (the spec requires it). Tensor names are
  written as given: mapping Hugging Face names to llama.cpp's (``blk.0.attn_q.weight``)
  is a model converter's job (llama.cpp's ``convert_hf_to_gguf.py``), as is choosing
  the architecture's other keys; llama.cpp itself also limits names to 63 bytes.

The ``gguf`` package (``pip install tensorbridge[gguf]``) is needed only to dequantize
and to write Q8_0; plain tensors and metadata are read and written without it.

>>> import os, tempfile, numpy as np
>>> p = os.path.join(tempfile.mkdtemp(), "m.gguf")
>>> meta = {"general.architecture": "llama"}
>>> save({"w": np.ones((2, 3), np.float16)}, p, metadata=meta)
>>> with open(p) as f:
...     f["w"].shape, f.metadata["general.architecture"]
((2, 3), 'llama')
"""

from __future__ import annotations

import math
import mmap as _mmap
import os
import re
import struct
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._atomic import atomic_write
from .._chunks import DEFAULT_CHUNK, iter_bytes
from .._filemap import array_at, check_unchanged
from .._files import Links, open_regular
from .._keys import NameRules, at_most_bytes, no_nul, valid_unicode
from .._progress import progress_bar
from .._tensorfile import TensorFile, cast_target, row_of
from .._torch_checks import is_tensor
from ..dtypes import DTypeLike, DTypeRow, resolve_dtype
from ..errors import (
    FormatError,
    InvalidArgumentError,
    MissingExtraError,
    NoDataError,
    UnsupportedDtypeError,
    UnsupportedTensorError,
)
from ._common import loader
from ._gguf_header import (
    ALIGNMENT_KEY,
    ARCHITECTURE_KEY,
    BY_NAME,
    BY_PLAIN,
    DEFAULT_ALIGNMENT,
    MAGIC,
    MAX_DIMS,
    NUMPY_OF,
    SPLIT_COUNT,
    SPLIT_KEYS,
    SPLIT_NO,
    SPLIT_TENSORS,
    VALUE_CODE,
    VERSION,
    GgmlType,
    TensorEntry,
    encode_value,
    parse,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "GGUFFile",
    "check_architecture",
    "dequantize_blocks",
    "load",
    "metadata_value",
    "open",
    "save",
]

_EXTRA = "pip install tensorbridge[gguf]"
_DEQUANTIZE_TO = ("float32", "bfloat16", "float16", "float64")
_WRITES_QUANTIZED = ("Q8_0",)


def _gguf_quants() -> Any:
    try:
        from gguf import quants
    except ImportError:
        raise MissingExtraError(
            f"dequantizing and writing quantized GGUF tensors uses the gguf package; {_EXTRA}"
        ) from None
    return quants


def _qtype(gtype: GgmlType) -> Any:
    from gguf.constants import GGMLQuantizationType

    try:
        return GGMLQuantizationType(gtype.code)
    except ValueError:
        raise UnsupportedDtypeError(
            f"the installed gguf package does not know {gtype.name}; upgrade it ({_EXTRA} -U)"
        ) from None


# --- dequantizing -----------------------------------------------------------------------------


# Dequantizing works 256 KiB of float32 values at a time, in cache, whatever the size.
_DEQUANTIZE_CHUNK = 1 << 18

# e2m1 code -> value, doubled as ggml's kvalues_mxfp4 (the e8m0 scale is halved to match)
_KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)


def _f16(two_bytes: np.ndarray) -> np.ndarray:
    """Each row's two bytes as an f16 scale, widened (exactly) to float32."""
    scale: np.ndarray = two_bytes.copy().view(np.float16).astype(np.float32)
    return scale


def _q8_0(blocks: np.ndarray, out: np.ndarray) -> None:
    np.multiply(blocks[:, 2:].view(np.int8), _f16(blocks[:, :2]), out=out)


def _nibbles(
    qs: np.ndarray, order: str
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[slice, slice]]:
    """The low and high nibbles of ``qs`` and where each goes in a block's values."""
    n = 2 * qs.shape[1]
    if order == "halves":
        return (qs & 0x0F, qs >> 4), (slice(0, n // 2), slice(n // 2, n))
    if order == "pairs":
        return (qs & 0x0F, qs >> 4), (slice(0, n, 2), slice(1, n, 2))
    raise ValueError(f"unknown nibble order {order!r}")


def _q4_0(blocks: np.ndarray, out: np.ndarray) -> None:
    d = _f16(blocks[:, :2])
    codes, where = _nibbles(blocks[:, 2:], BY_NAME["Q4_0"].nibbles)
    for half, at in zip(codes, where, strict=True):
        np.multiply(half.view(np.int8) - np.int8(8), d, out=out[:, at])


def _mxfp4(blocks: np.ndarray, out: np.ndarray) -> None:
    e = blocks[:, :1].astype(np.uint32)
    # ggml_e8m0_to_fp32_half: 2**(e - 128) as float32 bits, subnormal for e < 2
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << np.uint32(23))
    d = bits.view(np.float32)
    codes, where = _nibbles(blocks[:, 1:], BY_NAME["MXFP4"].nibbles)
    for half, at in zip(codes, where, strict=True):
        np.multiply(_KVALUES[half], d, out=out[:, at])


def _q4_k(blocks: np.ndarray, out: np.ndarray) -> None:
    n = len(blocks)
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    s = blocks[:, 4:16].reshape(n, 3, 4)  # eight 6-bit scales and mins, packed
    lo, mid, top = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([lo & 0x3F, (top & 0x0F) | ((lo >> 2) & 0x30)], axis=1)
    mn = np.concatenate([mid & 0x3F, (top >> 4) | ((mid >> 2) & 0x30)], axis=1)
    ds = (d * sc.astype(np.float32))[:, :, None]  # exact: 11 bits times 6
    dm = (dmin * mn.astype(np.float32))[:, :, None]
    qs = blocks[:, 16:].reshape(n, 4, 1, 32)
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32)
    values = out.reshape(n, 8, 32)
    np.multiply(codes, ds, out=values)  # rounded once, then the minimum: as gguf does
    np.subtract(values, dm, out=values)


def _q6_k(blocks: np.ndarray, out: np.ndarray) -> None:
    n = len(blocks)
    ql = blocks[:, :128].reshape(n, 2, 1, 64)
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32)
    ds = _f16(blocks[:, 208:210]) * blocks[:, 192:208].view(np.int8).astype(np.float32)
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2).reshape(n, 2, 128)
    high = np.concatenate([qh & 3, (qh >> 2) & 3, (qh >> 4) & 3, qh >> 6], axis=2)
    codes = (low | (high.reshape(n, 2, 128) << 4)).view(np.int8) - np.int8(32)
    np.multiply(codes.reshape(n, 16, 16), ds[:, :, None], out=out.reshape(n, 16, 16))


# Own kernels for the commonest types, in place and without temporaries of float32:
# the same float32 operations as the gguf package's, in the same order (scale times
# code is exact for Q8_0, Q4_0 and MXFP4; the K-quants round where gguf rounds).
# tests/test_io_gguf.py checks them bit for bit against gguf.quants.dequantize.
_KERNELS: dict[str, Callable[[np.ndarray, np.ndarray], None]] = {
    "Q8_0": _q8_0,
    "Q4_0": _q4_0,
    "MXFP4": _mxfp4,
    "Q4_K": _q4_k,
    "Q6_K": _q6_k,
}


def dequantize_blocks(
    blocks: np.ndarray, ggml_type: str, shape: tuple[int, ...], dtype: DTypeLike = "float32"
) -> np.ndarray:
    """Values of a GGUF block-quantized tensor from its raw blocks, in new memory.

    Each block is decoded to float32 as the ``gguf`` package (llama.cpp's reference
    in Python) decodes it: by its own code, or for Q8_0, Q4_0, MXFP4, Q4_K and Q6_K
    by kernels here that do the same float32 operations in the same order (tested
    bit for bit against it), 256 KiB of values at a time; then rounded once to
    ``dtype`` with torch's kernel.

    >>> import numpy as np
    >>> blocks = np.zeros((1, 34), np.uint8)  # Q8_0: an f16 scale, 32 int8 codes
    >>> blocks[0, :2] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)
    >>> blocks[0, 2:] = np.arange(32, dtype=np.int8).view(np.uint8)
    >>> dequantize_blocks(blocks, "Q8_0", (32,))[:4].tolist()
    [0.0, 0.5, 1.0, 1.5]

    Args:
        blocks: the tensor's bytes (``uint8``), as :meth:`GGUFFile.raw` gives them.
        ggml_type: the type's name (``"Q4_K"``).
        shape: the tensor's PyTorch-order shape (the last dimension a whole number of
            blocks).
        dtype: float32, bfloat16, float16 or float64.

    Raises:
        UnsupportedDtypeError: a type the installed ``gguf`` cannot dequantize, or a
            ``dtype`` that is not floating.
    """
    gtype = BY_NAME[ggml_type.upper()]
    row = _float_row(dtype)
    count = math.prod(shape)
    width = shape[-1] if shape else 1
    nbytes = count // gtype.block_size * gtype.type_size
    if width % gtype.block_size or blocks.nbytes != nbytes:
        raise ValueError(
            f"{gtype.name} blocks of shape {list(shape)} take {nbytes} bytes in rows of whole "
            f"{gtype.block_size}-value blocks; got {blocks.nbytes} bytes for rows of {width}"
        )
    import torch  # dequantizing: rounded by torch's kernel

    from ..convert import to_numpy

    out = torch.empty(count, dtype=row.torch)
    result: np.ndarray = to_numpy(out.reshape(shape))  # a view: filled below
    if count == 0:
        return result
    raw = np.ascontiguousarray(blocks).view(np.uint8).reshape(-1, gtype.type_size)
    kernel = _KERNELS.get(gtype.name)
    if kernel is None:
        quants, qtype = _gguf_quants(), _qtype(gtype)
    step = max(1, _DEQUANTIZE_CHUNK // 4 // gtype.block_size)  # blocks a step
    f32 = out.numpy() if row.name == "float32" else np.empty((step, gtype.block_size), np.float32)
    f32 = f32.reshape(-1, gtype.block_size)
    with np.errstate(all="ignore"):  # inf and NaN scales give inf and NaN, as in ggml
        for i in range(0, raw.shape[0], step):
            piece = raw[i : i + step]
            dst = f32[i : i + step] if row.name == "float32" else f32[: len(piece)]
            if kernel is not None:
                kernel(piece, dst)
            else:
                try:
                    # one row of many blocks: gguf vectorises over a row's blocks
                    dst[...] = quants.dequantize(piece.reshape(1, -1), qtype).reshape(dst.shape)
                except NotImplementedError:
                    raise UnsupportedDtypeError(
                        f"the installed gguf package cannot dequantize {gtype.name}; upgrade "
                        f"it ({_EXTRA} -U) or read the blocks with raw()"
                    ) from None
            if row.name != "float32":
                n = dst.size
                out[i * gtype.block_size : i * gtype.block_size + n].copy_(
                    torch.from_numpy(dst.reshape(-1))
                )
    return result


def _float_row(dtype: DTypeLike) -> DTypeRow:
    row = resolve_dtype(dtype)
    if row.name not in _DEQUANTIZE_TO:
        raise UnsupportedDtypeError(
            f"dequantize={dtype!r} is not a dtype to dequantize to; pass 'bf16', 'f32', "
            "'f16' or 'f64'"
        )
    return row


# --- reading ----------------------------------------------------------------------------------


class GGUFFile(TensorFile):
    """A checked GGUF file; tensors are mapped when asked for, in PyTorch order.

    ``[name]`` is a read-only NumPy view of the mapped file for plain types;
    ``.get(name, framework="torch")`` a copy-on-write tensor over it. Quantized
    tensors raise unless the file was opened with ``dequantize=`` (then they read as
    values of that dtype, in new memory); :meth:`raw` gives their blocks.

    Attributes:
        metadata: every key-value pair as text (lists as JSON).
        metadata_types: each key's GGUF value type (``"UINT32"``, ``"ARRAY[STRING]"``).
        version: the GGUF version (2 or 3); alignment: the data alignment.
        dequantize: the dtype quantized tensors are read as, or ``None``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        dequantize: DTypeLike | None = None,
        split: bool = True,
        follow_links: bool = False,
    ):
        super().__init__()
        self.path = Path(path)
        self.follow_links = follow_links  # the other files of a split set may be links out
        self.dequantize = None if dequantize is None else _float_row(dequantize)
        with open_regular(self.path) as fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                raise FormatError(f"{str(self.path)!r} is empty; it is no GGUF file")
            self._map = _mmap.mmap(fh.fileno(), 0, access=_mmap.ACCESS_READ)
            self._cow: _mmap.mmap | None = None
            self._fd = os.dup(fh.fileno())  # for the copy-on-write map, if torch asks
        self._close = weakref.finalize(self, os.close, self._fd)  # quiet if never closed
        try:
            header = parse(self._map, self.path)
        except BaseException:
            self._close()
            raise
        self.version, self.alignment = header.version, header.alignment
        self._values = header.values
        self._entries: dict[str, TensorEntry] = header.tensors
        self._metadata: dict[str, str] | None = None  # made from _values when first read
        self.metadata_types = {k: v.type_name for k, v in self._values.items()}
        self.paths = [self.path]  # every file of a split set, in order
        self._owner: dict[str, GGUFFile] = {}  # tensors held by another file of the set
        self._shards: list[GGUFFile] = []
        if split and SPLIT_COUNT in self._values and self._split_int(SPLIT_COUNT) > 1:
            try:
                self._open_set()
            except BaseException:
                self.close()
                raise
        quantized: dict[str, int] = {}
        for e in self._entries.values():
            if e.type.quantized:
                quantized[e.type.name] = quantized.get(e.type.name, 0) + 1
        if quantized:
            kinds = ", ".join(f"{n} {t}" for t, n in sorted(quantized.items()))
            how = (
                f"read as {self.dequantize.name} (dequantized)"
                if self.dequantize
                else "read with dequantize='bf16' (or 'f32', 'f16'), or as blocks with raw()"
            )
            self.notes.append(f"{self.path.name} holds quantized tensors ({kinds}); {how}")

    def _split_int(self, key: str) -> int:
        v = self._values.get(key)
        if v is None or not isinstance(v.value, int) or isinstance(v.value, bool):
            raise FormatError(
                f"{str(self.path)!r} is part of a split GGUF set but its {key} is "
                f"{'missing' if v is None else v.type_name}; the file is corrupt or not "
                "written by llama.cpp's gguf-split (re-split the model)"
            )
        return int(v.value)

    def _open_set(self) -> None:
        """Open every file of the split set this one belongs to (llama.cpp's gguf-split:
        ``NAME-00001-of-00003.gguf``, the keys ``split.no`` (from 0), ``split.count`` and
        ``split.tensors.count`` in each; the first holds the model's metadata) and merge
        their tensors in shard order. A missing or inconsistent shard is refused."""
        count, no = self._split_int(SPLIT_COUNT), self._split_int(SPLIT_NO)
        total = self._split_int(SPLIT_TENSORS)
        m = re.fullmatch(r"(.*)-(\d{5})-of-(\d{5})\.gguf", self.path.name, re.IGNORECASE)
        if m is None or int(m.group(2)) != no + 1 or int(m.group(3)) != count:
            raise FormatError(
                f"{str(self.path)!r} is shard {no + 1} of {count} (split.no, split.count) but "
                f"is not named NAME-{no + 1:05d}-of-{count:05d}.gguf as llama.cpp's gguf-split "
                "names a set; rename the shards so the others can be found"
            )
        files: list[GGUFFile] = []
        for i in range(count):
            if i == no:
                files.append(self)
                continue
            p = self.path.with_name(f"{m.group(1)}-{i + 1:05d}-of-{count:05d}.gguf")
            if not p.exists():
                raise FormatError(
                    f"{str(p)!r}, shard {i + 1} of {count} of the split GGUF set "
                    f"{self.path.name} belongs to, is missing; put every shard in one directory"
                )
            Links.of(self.path, follow=self.follow_links).check(p)
            other = GGUFFile(p, dequantize=self.dequantize, split=False)
            self._shards.append(other)
            said = {k: other._split_int(k) for k in (SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS)}
            if said != {SPLIT_COUNT: count, SPLIT_NO: i, SPLIT_TENSORS: total}:
                raise FormatError(
                    f"{str(p)!r} says it is shard {said[SPLIT_NO] + 1} of {said[SPLIT_COUNT]} "
                    f"with {said[SPLIT_TENSORS]} tensors in all, but {self.path.name} makes it "
                    f"shard {i + 1} of {count} with {total}; the set is mixed from two splits"
                )
            files.append(other)
        entries: dict[str, TensorEntry] = {}
        for f in files:
            for name, e in f._entries.items():
                if name in entries:
                    raise FormatError(
                        f"tensor {name!r} is in two shards of {self.path.name}'s split set "
                        f"({f.path.name} and another); the set is corrupt, split it again"
                    )
                entries[name] = e
                if f is not self:
                    self._owner[name] = f
        if len(entries) != total:
            raise FormatError(
                f"the split GGUF set of {self.path.name} holds {len(entries)} tensors but "
                f"split.tensors.count says {total}; a shard is truncated or from another split"
            )
        self._entries = entries
        self.paths = [f.path for f in files]
        # the model's metadata is the first shard's; the split.* keys describe the files
        self._values = {k: v for k, v in files[0]._values.items() if k not in SPLIT_KEYS}
        self.metadata_types = {k: v.type_name for k, v in self._values.items()}
        self.notes.append(f"{self.path.name} is one of a split set: {count} files read as one")

    @property
    def metadata(self) -> dict[str, str]:
        """Every key-value pair as text (lists as JSON), made when first asked for."""
        if self._metadata is None:
            self._metadata = {k: v.as_text() for k, v in self._values.items()}
        return self._metadata

    @metadata.setter
    def metadata(self, value: dict[str, str]) -> None:
        self._metadata = value

    def keys(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def entry(self, name: str) -> TensorEntry:
        """``name``'s checked header entry: ggml type, PyTorch-order shape, offset, bytes."""
        try:
            return self._entries[name]
        except KeyError:
            keys = self.keys()[:10]
            raise KeyError(f"{name!r} is not in {self.path}; its keys are {keys}") from None

    def ggml_type(self, name: str) -> str:
        """The ggml type ``name`` is stored as: ``"BF16"``, ``"Q4_K"``, ``"MXFP4"``."""
        return self.entry(name).type.name

    def info(self, name: str) -> tuple[DTypeRow, tuple[int, ...]]:
        """The dtype row and PyTorch-order shape of ``name`` (as dequantized, if asked)."""
        e = self.entry(name)
        if e.type.plain is not None:
            return resolve_dtype(e.type.plain), e.shape
        if self.dequantize is None:
            raise UnsupportedDtypeError(
                f"{str(self.path)!r}: tensor {name!r} is {e.type.name}, ggml's block-quantized "
                f"type ({e.type.block_size} values in {e.type.type_size} bytes), not a plain "
                "array; open it with dequantize='bf16' (or 'f32', 'f16'; command line: "
                f"--dequantize bf16) for its values, or read its blocks with raw({name!r})"
            )
        return self.dequantize, e.shape

    def nbytes(self, name: str) -> int:
        """The bytes ``name`` takes as read: stored, or dequantized when asked."""
        e = self.entry(name)
        if e.type.quantized and self.dequantize is not None:
            return math.prod(e.shape) * self.dequantize.itemsize
        return e.nbytes

    def raw(self, name: str) -> np.ndarray:
        """``name``'s stored bytes, untouched, as a read-only ``uint8`` view of the map.

        Shaped ``(*shape[:-1], blocks a row, block bytes)`` for quantized types; a
        plain type's bytes are ``(*shape[:-1], shape[-1] * itemsize)``.
        """
        e = self.entry(name)
        if name in self._owner:
            return self._owner[name].raw(name)
        flat = np.frombuffer(self._map, np.uint8, e.nbytes, e.begin) if e.nbytes else None
        width = e.shape[-1] if e.shape else 1
        lead = e.shape[:-1]
        if e.type.quantized:
            shape: tuple[int, ...] = (*lead, width // e.type.block_size, e.type.type_size)
        else:
            shape = (*lead, width * e.type.type_size)
        return np.empty(shape, np.uint8) if flat is None else flat.reshape(shape)

    def _array(self, name: str, *, copy_on_write: bool) -> np.ndarray:
        e = self.entry(name)
        if name in self._owner:
            return self._owner[name]._array(name, copy_on_write=copy_on_write)
        if e.type.plain is None:
            row, shape = self.info(name)  # raises unless dequantize= was given
            values = dequantize_blocks(self.raw(name), e.type.name, shape, row)
            # new, writable memory; numpy refuses to set WRITEABLE again on a torch-owned
            # view even when it already is, so only ever clear it
            if not copy_on_write:
                values.flags.writeable = False
            return values
        if self._close.alive:
            check_unchanged(self._fd, len(self._map), self.path)
        buf = self._cow_map() if copy_on_write and e.nbytes else self._map
        return array_at(buf, e.begin, e.shape, resolve_dtype(e.type.plain), name=name)

    def _owned(self, name: str) -> np.ndarray:
        e = self.entry(name)
        if e.type.plain is None:
            return self._array(name, copy_on_write=True)  # already new memory
        return super()._owned(name)

    def _cow_map(self) -> _mmap.mmap:
        if self._cow is None:
            if not self._close.alive:
                raise ValueError(f"{self.path} is closed; open it again")
            self._cow = _mmap.mmap(self._fd, 0, access=_mmap.ACCESS_COPY)
            if len(self._cow) != len(self._map):
                raise FormatError(f"{self.path} changed size since it was opened; open it again")
        return self._cow

    def plain_values(self) -> dict[str, Any]:
        """The key-value pairs typed: str, bool, NumPy scalars of the stored type, lists."""
        return {k: v.typed() for k, v in self._values.items()}

    def close(self) -> None:
        """Release the file(s); arrays already handed out keep their own mapping alive."""
        for f in self._shards:
            f.close()
        self._close()

    def __enter__(self) -> GGUFFile:
        return self

    def __repr__(self) -> str:
        files = f" in {len(self.paths)} files" if len(self.paths) > 1 else ""
        return f"<GGUFFile {str(self.path)!r}: {len(self._entries)} tensors{files}>"


def open(
    path: str | os.PathLike[str],
    *,
    dequantize: DTypeLike | None = None,
    follow_links: bool = False,
) -> GGUFFile:
    """Open a GGUF file: its header is read and checked, tensors mapped when asked for.

    The other files of a split set are looked for beside it; one that is a link out of
    its directory is refused unless ``follow_links=True``.

    >>> import os, tempfile, numpy as np
    >>> p = os.path.join(tempfile.mkdtemp(), "m.gguf")
    >>> save({"w": np.zeros((4, 32))}, p, metadata={"general.architecture": "x"},
    ...      quantize="q8_0")
    >>> with open(p) as f:
    ...     f.ggml_type("w"), f.raw("w").shape
    ('Q8_0', (4, 1, 34))
    """
    return GGUFFile(path, dequantize=dequantize, follow_links=follow_links)


load = loader(
    open,
    """Every tensor (or ``keys``) of a GGUF file; quantized ones need ``dequantize=``.""",
)


# --- writing ----------------------------------------------------------------------------------


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
    if not isinstance(tensors, Mapping):
        raise TypeError(
            f"save expects a mapping of names to tensors, got {type(tensors).__qualname__}; "
            "pass a dict such as model.state_dict()"
        )
    NAMES.check(tensors, repr(str(target)))
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
                written = 0
                for chunk in _chunks(it, chunk_bytes):
                    f.write(chunk)
                    written += len(chunk)
                    bar.update(len(chunk))
                if written != it.nbytes:
                    raise RuntimeError(
                        f"tensor {it.name!r} yielded {written} bytes where its header says "
                        f"{it.nbytes}; do not resize tensors while they are being saved"
                    )
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
        import torch

        if value.layout is not torch.strided:
            raise UnsupportedTensorError(
                f"a {value.layout} tensor has no dense bytes to store; pass x.to_dense()"
            )
        if value.device.type == "meta":
            raise NoDataError("a meta tensor holds no data; materialise it first")
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
        raise UnsupportedDtypeError(
            f"GGUF has no tensor type for {row.name}; it holds {kinds} (pass float_dtype= "
            "for floats, or convert the values)"
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
    quants = _gguf_quants()
    qtype = _qtype(it.type)
    v = it.value
    if is_tensor(v):
        from ..convert import to_numpy

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
