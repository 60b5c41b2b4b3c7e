"""GGML's block-quantized tensor types: their table, and the kernels that dequantize them.

llama.cpp's GGUF files (:mod:`tensorbridge.io.gguf`) store tensors as ggml types: plain
ones (F32, BF16, I8, ...) and block-quantized ones (Q4_0 ... Q8_0, the K-quants, IQ types,
MXFP4, NVFP4), ``block_size`` values in ``type_size`` bytes. This module holds what is
ggml's rather than the file's: the table of types (:data:`TYPES`, each with its block
layout, its packing included) and :func:`dequantize_blocks`, which decodes blocks to
float32 as the ``gguf`` package (the reference) does, with kernels of its own for the
commonest types. It sits beside the other quantization kernels of :mod:`tensorbridge.quant`
and imports nothing of :mod:`tensorbridge.io` or :mod:`tensorbridge.quant.api`: the GGUF
reader calls it, not the other way round. The fp4 e2m1 values are
:data:`tensorbridge.quant.base.FP4_VALUES` (one table for every scheme); how a block's
codes share its bytes is a :class:`tensorbridge.packing.Layout` (ggml's split runs,
:data:`~tensorbridge.packing.GGUF_HALVES`, at each type's block size).

>>> BY_NAME["Q8_0"].block_size, BY_NAME["Q8_0"].type_size, BY_NAME["BF16"].plain
(32, 34, 'bfloat16')
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..dtypes import DTypeLike, DTypeRow, resolve_dtype
from ..errors import MissingExtraError, UnsupportedDtypeError
from ..packing import GGUF_HALVES, Layout
from .base import FP4_VALUES

__all__ = [
    "BY_CODE",
    "BY_NAME",
    "BY_PLAIN",
    "TYPES",
    "GgmlType",
    "dequantize_blocks",
    "float_row",
    "gguf_qtype",
    "gguf_quants",
]


@dataclass(frozen=True)
class GgmlType:
    """One ggml tensor type: ``block_size`` values take ``type_size`` bytes.

    ``plain`` names the dtype-table row of a type stored one value per element
    (F32, BF16, I8, ...), ``None`` for a block-quantized one. ``layout`` says, for
    the quantized types this module documents, where the values sit in a block;
    ``packing``, for the 4-bit types, how the codes share a block's bytes.
    """

    name: str
    code: int
    block_size: int
    type_size: int
    plain: str | None = None
    layout: str = ""
    # how a 4-bit type's block packs its codes: GGUF_HALVES (element j in the low nibble
    # of byte j, element j + n/2 in the high one; n = 32, or NVFP4's groups of 16), where
    # safetensors' F4, torchao and gpt-oss put 2j low and 2j + 1 high (TORCH_X2)
    packing: Layout | None = None

    @property
    def quantized(self) -> bool:
        return self.plain is None


_MXFP4_LAYOUT = (
    "blocks of 32: one e8m0 scale byte, then 16 bytes holding element j in the low "
    "nibble and element j + 16 in the high nibble of byte j (safetensors F4, torchao "
    "and gpt-oss put element 2j low and 2j + 1 high)"
)
_NVFP4_LAYOUT = (
    "blocks of 64: four ue4m3 scale bytes (one per 16 values), then four groups of 8 "
    "bytes, byte j of group g holding element 16g + j in the low nibble and 16g + j + 8 "
    "in the high one; no per-tensor global scale in the block"
)
_Q4_LAYOUT = (
    "blocks of 32: an f16 scale{extra}, then 16 bytes holding element j in the low "
    "nibble and element j + 16 in the high nibble of byte j"
)

# ggml's split runs at the other block sizes its types use (the same rule: run q of a
# block's values in field q of its bytes; gguf.quants' dequantize_blocks of each type)
_HALVES_16 = replace(GGUF_HALVES, name="gguf_halves_16", split=16, holds=("ggml NVFP4",))
_HALVES_64 = replace(GGUF_HALVES, name="gguf_halves_64", split=64, holds=("ggml Q4_K",))
_HALVES_128 = replace(
    GGUF_HALVES, name="gguf_halves_128", split=128, holds=("ggml Q6_K low nibbles",)
)
_QUARTERS_128 = replace(
    GGUF_HALVES, name="gguf_quarters_128", bits=2, split=128, holds=("ggml Q6_K high bits",)
)

# The codes and sizes of ggml's types (ggml.h's enum ggml_type and ggml.c's type_traits;
# the gguf package's GGML_QUANT_SIZES agrees, tests/test_io_gguf.py checks). Codes 4, 5 and
# 31-33, 36-38 were removed from ggml and are unknown here.
TYPES: tuple[GgmlType, ...] = (
    GgmlType("F32", 0, 1, 4, "float32"),
    GgmlType("F16", 1, 1, 2, "float16"),
    GgmlType("Q4_0", 2, 32, 18, layout=_Q4_LAYOUT.format(extra=""), packing=GGUF_HALVES),
    GgmlType(
        "Q4_1",
        3,
        32,
        20,
        layout=_Q4_LAYOUT.format(extra=" and an f16 minimum"),
        packing=GGUF_HALVES,
    ),
    GgmlType("Q5_0", 6, 32, 22),
    GgmlType("Q5_1", 7, 32, 24),
    GgmlType("Q8_0", 8, 32, 34, layout="blocks of 32: an f16 scale, then 32 int8 codes"),
    GgmlType("Q8_1", 9, 32, 40),
    GgmlType("Q2_K", 10, 256, 84),
    GgmlType("Q3_K", 11, 256, 110),
    GgmlType("Q4_K", 12, 256, 144),
    GgmlType("Q5_K", 13, 256, 176),
    GgmlType("Q6_K", 14, 256, 210),
    GgmlType("Q8_K", 15, 256, 292),
    GgmlType("IQ2_XXS", 16, 256, 66),
    GgmlType("IQ2_XS", 17, 256, 74),
    GgmlType("IQ3_XXS", 18, 256, 98),
    GgmlType("IQ1_S", 19, 256, 50),
    GgmlType("IQ4_NL", 20, 32, 18, packing=GGUF_HALVES),
    GgmlType("IQ3_S", 21, 256, 110),
    GgmlType("IQ2_S", 22, 256, 82),
    GgmlType("IQ4_XS", 23, 256, 136),
    GgmlType("I8", 24, 1, 1, "int8"),
    GgmlType("I16", 25, 1, 2, "int16"),
    GgmlType("I32", 26, 1, 4, "int32"),
    GgmlType("I64", 27, 1, 8, "int64"),
    GgmlType("F64", 28, 1, 8, "float64"),
    GgmlType("IQ1_M", 29, 256, 56),
    GgmlType("BF16", 30, 1, 2, "bfloat16"),
    GgmlType("TQ1_0", 34, 256, 54),
    GgmlType("TQ2_0", 35, 256, 66),
    GgmlType("MXFP4", 39, 32, 17, layout=_MXFP4_LAYOUT, packing=GGUF_HALVES),
    GgmlType("NVFP4", 40, 64, 36, layout=_NVFP4_LAYOUT, packing=_HALVES_16),
    GgmlType("Q1_0", 41, 128, 18),
)
BY_CODE = {t.code: t for t in TYPES}
BY_NAME = {t.name: t for t in TYPES}
BY_PLAIN = {t.plain: t for t in TYPES if t.plain}

_EXTRA = "pip install tensorbridge[gguf]"
_DEQUANTIZE_TO = ("float32", "bfloat16", "float16", "float64")


def gguf_quants() -> Any:
    try:
        from gguf import quants
    except ImportError:
        raise MissingExtraError(
            f"dequantizing and writing quantized GGUF tensors uses the gguf package; {_EXTRA}"
        ) from None
    return quants


def gguf_qtype(gtype: GgmlType) -> Any:
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

# e2m1 code -> value (quant.base's table), doubled as ggml's kvalues_mxfp4 (the e8m0 scale
# is halved to match); ggml's table is int8, so code 8 is +0 where e2m1's is -0
_KVALUES = np.where(FP4_VALUES == 0, np.float32(0), 2 * FP4_VALUES)


def _f16(two_bytes: np.ndarray) -> np.ndarray:
    """Each row's two bytes as an f16 scale, widened (exactly) to float32."""
    scale: np.ndarray = two_bytes.copy().view(np.float16).astype(np.float32)
    return scale


def _q8_0(blocks: np.ndarray, out: np.ndarray) -> None:
    np.multiply(blocks[:, 2:].view(np.int8), _f16(blocks[:, :2]), out=out)


def _codes(gtype: GgmlType, qs: np.ndarray) -> np.ndarray:
    """The codes of blocks' packed bytes ``qs``, one a byte, in the order ``gtype``'s
    packing puts them."""
    assert gtype.packing is not None  # the kernels are called for 4-bit types only
    return gtype.packing.unpack(qs, qs.shape[1] * 8 // gtype.packing.bits)


def _q4_0(blocks: np.ndarray, out: np.ndarray) -> None:
    d = _f16(blocks[:, :2])
    codes = _codes(BY_NAME["Q4_0"], blocks[:, 2:])
    np.multiply(codes.view(np.int8) - np.int8(8), d, out=out)


def _mxfp4(blocks: np.ndarray, out: np.ndarray) -> None:
    e = blocks[:, :1].astype(np.uint32)
    # ggml_e8m0_to_fp32_half: 2**(e - 128) as float32 bits, subnormal for e < 2
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << np.uint32(23))
    d = bits.view(np.float32)
    np.multiply(_KVALUES[_codes(BY_NAME["MXFP4"], blocks[:, 1:])], d, out=out)


def _q4_k(blocks: np.ndarray, out: np.ndarray) -> None:
    n = len(blocks)
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    s = blocks[:, 4:16].reshape(n, 3, 4)  # eight 6-bit scales and mins, packed
    lo, mid, top = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([lo & 0x3F, (top & 0x0F) | ((lo >> 2) & 0x30)], axis=1)
    mn = np.concatenate([mid & 0x3F, (top >> 4) | ((mid >> 2) & 0x30)], axis=1)
    ds = (d * sc.astype(np.float32))[:, :, None]  # exact: 11 bits times 6
    dm = (dmin * mn.astype(np.float32))[:, :, None]
    codes = _HALVES_64.unpack(blocks[:, 16:], 256).reshape(n, 8, 32)
    values = out.reshape(n, 8, 32)
    np.multiply(codes, ds, out=values)  # rounded once, then the minimum: as gguf does
    np.subtract(values, dm, out=values)


def _q6_k(blocks: np.ndarray, out: np.ndarray) -> None:
    n = len(blocks)
    ds = _f16(blocks[:, 208:210]) * blocks[:, 192:208].view(np.int8).astype(np.float32)
    low = _HALVES_128.unpack(blocks[:, :128], 256)
    high = _QUARTERS_128.unpack(blocks[:, 128:192], 256)
    codes = (low | (high << 4)).view(np.int8) - np.int8(32)
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
    row = float_row(dtype)
    count = math.prod(shape)
    width = shape[-1] if shape else 1
    nbytes = count // gtype.block_size * gtype.type_size
    if width % gtype.block_size or blocks.nbytes != nbytes:
        raise ValueError(
            f"{gtype.name} blocks of shape {list(shape)} take {nbytes} bytes in rows of whole "
            f"{gtype.block_size}-value blocks; got {blocks.nbytes} bytes for rows of {width}"
        )
    import torch  # dequantizing: rounded by torch's kernel

    from .._memory import as_numpy

    out = torch.empty(count, dtype=row.torch)
    result = as_numpy(out.reshape(shape), row)  # a view: filled below
    if count == 0:
        return result
    raw = np.ascontiguousarray(blocks).view(np.uint8).reshape(-1, gtype.type_size)
    kernel = _KERNELS.get(gtype.name)
    if kernel is None:
        quants, qtype = gguf_quants(), gguf_qtype(gtype)
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


def float_row(dtype: DTypeLike) -> DTypeRow:
    row = resolve_dtype(dtype)
    if row.name not in _DEQUANTIZE_TO:
        raise UnsupportedDtypeError(
            f"dequantize={dtype!r} is not a dtype to dequantize to; pass 'bf16', 'f32', "
            "'f16' or 'f64'"
        )
    return row
