"""The code tables and kernels the quantization schemes share: decoding codes to float32.

Every scheme's kernel is built of these: the value tables (fp8's largest magnitudes,
e2m1, e8m0), fp4 / fp8 / packed-integer codes as float32, group indices and scales
(``g_idx``), e8m0 scales, an fp4 encoder for writing, and the part of a torchao
subclass a scheme can read as it is. They import torch inside the functions (its
tables are made on first use), so detecting a scheme needs none. The value tables are
written from the OCP MX spec, not computed by ml_dtypes (``tests/test_quant.py`` holds
them to its bits), so importing this module, as every GGUF read does, needs no
ml_dtypes either; only the fp4 encoder imports it. :mod:`tensorbridge.quant.base`
holds the interface and re-exports these names, which scheme modules import from there.

>>> FP4_VALUES[:4].tolist(), FP8_MAX["float8_e4m3fn"]
([0.0, 0.5, 1.0, 1.5], 448.0)
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from ..errors import FormatError, QuantizationError
from ..packing import TORCH_X2

if TYPE_CHECKING:
    import torch


# the largest magnitude of each fp8 code type
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
# e2m1: code bits s e e m; the OCP MX spec's table (v1.0, 5.3.3; also ml_dtypes.float4_e2m1fn's)
FP4_VALUES = np.array(
    [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32
)
# one byte -> its two values, element 2j in the low nibble (TORCH_X2: safetensors F4,
# torchao, gpt-oss); one 8-byte item a byte: NumPy gathers those faster than 2-D rows
_FP4_PAIRS_U64 = (
    FP4_VALUES[TORCH_X2.unpack(np.arange(256, dtype=np.uint8)[:, None], 2)]
    .view(np.uint64)
    .reshape(256)
)
# e8m0 byte -> 2**(byte - 127) in float32 (byte 0: 2**-127, a subnormal; 255: NaN, the
# quiet NaN 0x7fc00000 as ml_dtypes.float8_e8m0fnu widens it)
_E8M0_BYTES = np.arange(256)
_E8M0_VALUES = np.where(_E8M0_BYTES == 255, np.nan, np.ldexp(1.0, _E8M0_BYTES - 127)).astype(
    np.float32
)

# (their tensors are made on first use: detecting a scheme, for which this module is
# imported, needs no torch)


@functools.cache
def _fp4_one() -> torch.Tensor:
    import torch

    return torch.from_numpy(FP4_VALUES.copy())


@functools.cache
def _e8m0() -> torch.Tensor:
    import torch

    return torch.from_numpy(_E8M0_VALUES.copy())


def torchao_parts(
    x: torch.Tensor, inner: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A torchao subclass's ``qdata`` and ``scale`` when a scheme can read them as they
    are (both there, ``qdata`` contiguous, at least one axis), else ``None``."""
    qdata, scale = inner.get("qdata"), inner.get("scale")
    if qdata is None or scale is None or not qdata.is_contiguous() or x.ndim < 1:
        return None
    return qdata, scale


def fp4_codes_to_f32(codes: torch.Tensor, packed: bool) -> torch.Tensor:
    """fp4 e2m1 codes as float32: packed bytes (2j low nibble) or one code a byte."""
    import torch

    u8 = codes.view(torch.uint8) if codes.dtype != torch.uint8 else codes
    if packed:
        pairs = _FP4_PAIRS_U64[u8.contiguous().numpy()].view(np.float32)
        return torch.from_numpy(pairs).reshape(*u8.shape[:-1], u8.shape[-1] * 2)
    return _fp4_one()[u8.long() & 0xF]


def fp8_to_f32(codes: torch.Tensor) -> torch.Tensor:
    """fp8 codes as float32 (exact); other dtypes by torch's cast."""
    values, factor = fp8_to_f32_shifted(codes)
    return values.mul_(factor) if factor != 1 else values  # a power of two: exact


def fp8_to_f32_shifted(codes: torch.Tensor) -> tuple[torch.Tensor, float]:
    """fp8 codes as float32 short by a power of two: ``(values, factor)``, ``values *
    factor`` exactly the codes' values.

    Each code's bits are moved into a float16's (integer passes, then the hardware's
    half-to-float conversion): 2-3x faster than a table gather, 4x faster than torch's
    fp8 cast on CPU. e5m2 is float16's top byte (``factor`` 1). e4m3fn's 4-bit exponent
    and 3-bit mantissa land in float16's fields as they are, subnormals included, which
    reads each value 2**8 too small (``factor`` 256); its NaN codes (``0x7F``/``0xFF``)
    get float16's all-ones exponent. Callers fold ``factor`` into their scale
    (:func:`fold_factor`), so the product is rounded once as ``code x scale`` would be.

    >>> import torch
    >>> v, k = fp8_to_f32_shifted(torch.tensor([1.5, -448.0]).to(torch.float8_e4m3fn))
    >>> (v * k).tolist(), k
    ([1.5, -448.0], 256.0)
    """
    import torch

    if codes.dtype == torch.float8_e5m2:
        y = codes.view(torch.uint8).to(torch.int16).bitwise_left_shift_(8)
        return y.view(torch.float16).to(torch.float32), 1.0
    if codes.dtype != torch.float8_e4m3fn:
        return codes.to(torch.float32), 1.0
    y = codes.view(torch.int8).to(torch.int16)  # sign-extended: bit 15 is the sign
    # s eeee mmm -> float16 s 0eeee mmm0000000 (0xBF80: the sign, four exponent bits,
    # three mantissa bits; the shifted-in copies of the sign are cleared)
    y.bitwise_left_shift_(7).bitwise_and_(-0x4080)
    # exponent and mantissa all ones (NaN) is the one pattern that carries into bit 14
    y.bitwise_or_(torch.add(y, 0x80).bitwise_and_(0x4000))
    return y.view(torch.float16).to(torch.float32), 256.0


def fold_factor(values: torch.Tensor, factor: float, scale: torch.Tensor) -> torch.Tensor:
    """``scale * factor`` (exact: a power of two), so that ``values * result`` is ``code x
    scale`` rounded once; where that would overflow, ``values`` takes the factor instead."""
    import torch

    if factor == 1:
        return scale
    folded = scale * factor
    if not bool(torch.isfinite(folded).all()) and bool(
        (torch.isinf(folded) & torch.isfinite(scale)).any()
    ):
        values.mul_(factor)
        return scale
    return folded


def unpack_int32(
    packed: torch.Tensor, bits: int, order: tuple[int, ...] | None = None
) -> torch.Tensor:
    """int32 words -> ``32 // bits`` unsigned codes each (uint8) along the last axis, low bits
    first.

    ``order[j]`` is the position, within its word's run of codes, of the code stored in
    bits ``[j * bits, (j + 1) * bits)`` (AWQ interleaves; GPTQ and compressed-tensors
    do not). 4- and 8-bit codes are split from the words' little-endian bytes.
    """
    import torch

    if 32 % bits:
        return _unpack_straddling(packed, bits)
    per = 32 // bits
    words = packed.contiguous().to(torch.int32)
    if bits == 8 and sys.byteorder == "little":
        codes = words.view(torch.uint8).reshape(*words.shape, per)
    elif bits == 4 and sys.byteorder == "little":
        b = words.view(torch.uint8).reshape(*words.shape, 4)
        codes = torch.stack((b & 0xF, b >> 4), dim=-1).reshape(*words.shape, per)
    else:
        shifts = torch.arange(0, 32, bits, dtype=torch.int32)
        codes = (torch.bitwise_right_shift(words[..., None], shifts) & ((1 << bits) - 1)).to(
            torch.uint8
        )
    if order is not None:
        codes = codes[..., list(np.argsort(order))]
    return codes.reshape(*packed.shape[:-1], packed.shape[-1] * per)


def _unpack_straddling(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes of a width that does not divide 32 (AutoGPTQ's 3 bits): each run of
    ``bits`` words is one little-endian bit stream of 32 codes, code ``k`` at bits
    ``[k * bits, (k + 1) * bits)``, straddling a word boundary where it falls on one."""
    import torch

    words = packed.contiguous().to(torch.int64) & 0xFFFFFFFF
    n = words.shape[-1]
    if n % bits:
        raise QuantizationError(
            f"{n} int32 words do not hold whole runs of 32 {bits}-bit codes ({bits} words "
            "each); the packed tensor is truncated or not this bit width"
        )
    runs = words.reshape(*words.shape[:-1], n // bits, bits)
    following = torch.cat([runs[..., 1:], torch.zeros_like(runs[..., :1])], dim=-1)
    pairs = runs | (following << 32)  # word i and the bits that spill into word i + 1
    at = torch.arange(32) * bits
    codes = (pairs[..., at // 32] >> (at % 32)) & ((1 << bits) - 1)
    return codes.to(torch.uint8).reshape(*packed.shape[:-1], n // bits * 32)


def packed_words(count: int, bits: int) -> int:
    """int32 words that ``count`` codes of ``bits`` take (runs of 32 when bits straddle)."""
    if 32 % bits:
        return math.ceil(count / 32) * bits
    return math.ceil(count / (32 // bits))


def int_codes_f32(
    packed: torch.Tensor, bits: int, offset: int = 0, order: tuple[int, ...] | None = None
) -> torch.Tensor:
    """:func:`unpack_int32`'s codes minus ``offset``, as float32.

    4- and 8-bit codes on little-endian hosts take vectorized integer passes, no
    gather: each byte ``b`` widened to int16 becomes ``(b | b << 4) & 0x0F0F``, whose
    two bytes are its low and high nibble in order; the offset is subtracted in int8
    and one widening copy gives float32 (exact: the codes are small integers).
    """
    import torch

    if bits not in (4, 8) or sys.byteorder != "little" or not -128 <= offset <= 255:
        return unpack_int32(packed, bits, order).to(torch.float32).sub_(offset)
    words = packed.contiguous().to(torch.int32)
    raw = words.view(torch.uint8)
    per = 32 // bits
    if bits == 4:
        x = raw.to(torch.int16)
        x.bitwise_or_(x << 4).bitwise_and_(0x0F0F)
        codes = x.view(torch.uint8)
        if 0 < offset <= 15:  # 0..15 minus offset fits int8
            codes = codes.view(torch.int8).sub_(offset)
            offset = 0
    elif offset == 128:  # u8 - 128 is the byte with its top bit flipped, as int8
        codes = torch.bitwise_xor(raw, 0x80).view(torch.int8)
        offset = 0
    else:
        codes = raw
    values = codes.to(torch.float32)
    if offset:
        values.sub_(offset)
    if order is not None:
        values = values.reshape(*words.shape, per)[..., list(np.argsort(order))]
    return values.reshape(*packed.shape[:-1], packed.shape[-1] * per)


def group_index(g_idx: torch.Tensor, groups: int, name: str) -> torch.Tensor:
    """A stored act-order ``g_idx`` (tensor ``name``) as int64, every entry checked in
    ``[0, groups)``: an index from a file never wraps (``-1``, the last group) or reads
    out of range.

    >>> group_index(torch.tensor([0, 1, 1], dtype=torch.int32), 2, "q.g_idx").tolist()
    [0, 1, 1]

    Raises:
        FormatError: an entry out of range, or a ``g_idx`` that is not integers.
    """
    import torch

    if g_idx.is_floating_point() or g_idx.is_complex() or g_idx.dtype == torch.bool:
        raise FormatError(f"{name} is {g_idx.dtype}; a g_idx holds integer group indices")
    idx = g_idx.long()
    bad = ((idx < 0) | (idx >= groups)).nonzero()
    if bad.numel():
        row = int(bad[0, 0]) if bad.dim() > 1 else int(bad[0])
        raise FormatError(
            f"{name}[{row}] is {int(idx.reshape(-1)[row])}, but there are {groups} groups "
            f"(indices 0 to {groups - 1}); the checkpoint is corrupt"
        )
    return idx


def group_scale_(
    w: torch.Tensor, g: torch.Tensor | int, scale: torch.Tensor, zero: torch.Tensor | None
) -> torch.Tensor:
    """``(w - zero[:, group]) * scale[:, group]`` in place, float32, along the last axis.

    ``g`` is the group size (contiguous groups: a broadcast, no gather) or each column's
    group (act-order ``g_idx``: a gather).
    """
    import torch

    w = w.contiguous()
    cols = w.shape[1]
    if isinstance(g, int) and cols % g == 0 and scale.shape[1] == cols // g:
        v = w.view(-1, g)  # one row per (row, group): the scale is a scalar along it
        if zero is not None:
            v.sub_(zero.reshape(-1, 1))
        v.mul_(scale.reshape(-1, 1))
        return w
    idx = g if isinstance(g, torch.Tensor) else torch.arange(cols) // g
    if zero is not None:
        w.sub_(zero[:, idx])
    return w.mul_(scale[:, idx])


def e8m0_to_f32(scale: torch.Tensor) -> torch.Tensor:
    """e8m0 scales (``float8_e8m0fnu`` or its ``uint8`` exponent bytes) as float32 powers of 2."""
    import torch

    u8 = scale.view(torch.uint8) if scale.dtype != torch.uint8 else scale
    return _e8m0()[u8.long()]


def fp4_encode(x: torch.Tensor, *, packed: bool = False) -> torch.Tensor:
    """float32 -> e2m1 codes one a byte (round to nearest even, saturating at +-6), or
    with ``packed`` two a byte along the last axis, element ``2j`` in the low nibble
    (:data:`~tensorbridge.packing.TORCH_X2`, as every fp4 scheme stores them)."""
    import ml_dtypes
    import torch

    a = x.detach().to(torch.float32).cpu().numpy()
    codes = a.astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
    return torch.from_numpy(TORCH_X2.pack(codes) if packed else codes)
