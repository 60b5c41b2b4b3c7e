"""Reading a leaf's values in chunks, and the integer line ULP distances are measured on.

Shared by compare, stats and cast_report:

* :func:`source` checks that a leaf holds values this library can read (not a
  meta, nested or masked one) and finds its dtype row; :func:`chunks` yields the
  values as plain contiguous CPU tensors in C order, ``_CHUNK`` values at the most,
  so no caller ever holds several full-size float64 temporaries. ``_CHUNK`` is read
  at call time: tests shrink it here to exercise the merging of partial results.
* A row torch has no kernels for (``row.kernels`` is False: the sub-byte integers,
  the types only NumPy has) is read through ml_dtypes: :func:`host_chunks` yields
  each chunk as stored (an array of the row's NumPy dtype, for its bits and for
  ml_dtypes' casts) beside its values widened exactly by ml_dtypes' ``astype`` into
  :func:`wide_row` (int8 / uint8, float32, complex64), which torch computes with. The
  values are the ones ml_dtypes reads: the low N bits of an int4's byte, and for a
  float6 or float4 byte any bit above the sign read as the sign (``0x40`` is -0.0 as
  float6_e2m3fn, measured on ml_dtypes 0.7: its ``float8.h`` ``ConvertImpl`` takes
  the sign as ``bits >> (kFromBits - 1)`` and the magnitude through ``mxfloat.h``'s
  ``abs``, ``rep & 0b0'11'111``).
* :func:`format_of` gathers the facts of a floating-point format that the ULP and
  cast arithmetic needs, from ``ml_dtypes.finfo`` and ml_dtypes' own casts (width,
  bias, inf, NaN and its bits, sign); :func:`ordinals` places values on the format's
  ordered integer line (its bits, sign-magnitude turned into signed order, continued
  past the largest finite value), so a ULP distance is a difference of two ordinals.
  :func:`int_distance` is an exact ``|x - y|`` of integers that never overflows.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import torch

from .._ml_cast import astype
from ..convert import to_numpy, to_torch
from ..dtypes import BY_NAME, BY_NUMPY, DTypeRow, explain_numpy, resolve_dtype
from ..errors import NoDataError, UnsupportedDtypeError, UnsupportedTensorError

_CHUNK = 1 << 20  # values per chunk (cache-sized); tests shrink it to exercise the merging

Array = npt.NDArray[Any]


@dataclass(frozen=True)
class Source:
    data: Any  # a torch.Tensor (detached, strided, not meta) or an np.ndarray
    row: DTypeRow

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)


_NUMBERS = (np.ndarray, np.generic, bool, int, float, complex)
LEAVES = (*_NUMBERS, torch.Tensor)


def source(x: Any) -> Source:
    """Validate a leaf and find its row; refuse what holds no readable values."""
    if isinstance(x, torch.Tensor):
        t = x.detach()
        if t.device.type == "meta":
            raise NoDataError(
                f"a meta tensor ({t.dtype}, shape {tuple(t.shape)}) holds no data; "
                "materialise it first"
            )
        if t.is_nested:
            raise UnsupportedTensorError("nested tensors are not supported here; pass t.unbind()")
        if t.layout is not torch.strided:
            t = t.to_dense()
        return Source(t, resolve_dtype(t.dtype))
    if isinstance(x, np.ma.MaskedArray):
        raise UnsupportedTensorError(
            "a masked array's mask would be ignored; pass a.filled(fill_value) or a.data"
        )
    if isinstance(x, _NUMBERS):
        a = np.asarray(x)
        row = BY_NUMPY.get(a.dtype) or BY_NUMPY.get(a.dtype.newbyteorder("="))
        if row is None:
            raise UnsupportedDtypeError(explain_numpy(a.dtype))
        return Source(a, row)
    raise UnsupportedTensorError(
        f"expected a torch.Tensor, np.ndarray or number, got {type(x).__qualname__}; pass "
        "np.asarray(x)"
    )


def _blocks(x: Any, most: int) -> Iterator[Any]:
    """C-order flat pieces of ``x`` (tensor or array), each at most ``most`` values."""
    n = math.prod(x.shape)
    if n == 0:
        return
    if x.ndim == 0 or n <= most:
        yield x.reshape(-1)
        return
    inner = n // x.shape[0]
    if inner > most:
        for i in range(x.shape[0]):
            yield from _blocks(x[i], most)
        return
    step = most // inner
    for i in range(0, x.shape[0], step):
        yield x[i : i + step].reshape(-1)


def chunks(src: Source, most: int | None = None) -> Iterator[torch.Tensor]:
    """Plain contiguous CPU tensors of ``src.row.torch``, in C order, of at most ``most``
    values (and never more than ``_CHUNK``); for a row torch has no kernels for, its
    values widened exactly into :func:`wide_row` (see :func:`host_chunks`)."""
    if not src.row.kernels:
        for _, values in host_chunks(src, most):
            yield values
        return
    for block in _blocks(src.data, _CHUNK if most is None else min(most, _CHUNK)):
        if isinstance(block, torch.Tensor):
            yield block.resolve_conj().resolve_neg().cpu()
        else:  # read-only, byte-swapped or reversed blocks are copied, one chunk at a time
            yield to_torch(block)


# The row torch computes a kernel-less row's values in, by category: each holds every value
# exactly (tests/test_diagnostics_lowp.py checks it on every pattern of every such row)
_WIDE = {"int": "int8", "uint": "uint8", "float": "float32", "complex": "complex64"}


@cache
def wide_row(row: DTypeRow) -> DTypeRow:
    """``row`` where torch has kernels for it; else the row its values are widened into
    (int4 -> int8, uint2 -> uint8, float6_e2m3fn -> float32, bcomplex32 -> complex64)."""
    return row if row.kernels else BY_NAME[_WIDE[row.category]]


def host_chunks(src: Source, most: int | None = None) -> Iterator[tuple[Array, torch.Tensor]]:
    """Each chunk as stored, a 1-D array of ``src.row.numpy`` in C order (its bits, and
    what ml_dtypes' ``astype`` casts), beside its values as a CPU tensor of
    :func:`wide_row`: the same memory where torch has kernels for the row, else
    ml_dtypes' exact widening. Chunks as :func:`chunks` makes them.

    A tensor torch has no kernels for (int4) is cut on its ``uint8`` carrier, whose
    copies and moves torch can run, and viewed as the ml_dtypes type.
    """
    row = src.row
    if row.kernels:
        for chunk in chunks(src, most):
            yield to_numpy(chunk), chunk
        return
    size = _CHUNK if most is None else min(most, _CHUNK)
    data = src.data
    if isinstance(data, torch.Tensor):
        assert row.carrier is not None  # every kernel-less row is carried
        blocks: Iterator[Array] = (
            np.ascontiguousarray(b.cpu().numpy()).view(row.numpy)
            for b in _blocks(data.view(row.carrier), size)
        )
    else:
        blocks = (np.ascontiguousarray(b, dtype=row.numpy) for b in _blocks(data, size))
    wide = wide_row(row).numpy
    for raw in blocks:
        yield raw, torch.from_numpy(astype(raw, wide))


def widened(x: Any) -> Any:
    """``x`` itself where torch has kernels for its dtype; else all its values widened
    exactly (as :func:`host_chunks` does, a chunk at a time) into one CPU tensor of
    :func:`wide_row` and ``x``'s shape: float8_e4m3 -> float32, int4 -> int8."""
    src = source(x)
    if src.row.kernels:
        return x
    out = torch.empty(src.shape, dtype=wide_row(src.row).torch)
    flat, at = out.view(-1), 0
    for _, values in host_chunks(src):
        flat[at : at + values.numel()] = values
        at += values.numel()
    return out


class Scratch:
    """Chunk-sized buffers reused from chunk to chunk and leaf to leaf, by name and dtype:
    a chunk's temporaries then need no fresh pages (``out=`` of torch's kernels)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def get(self, name: str, dtype: torch.dtype, n: int) -> torch.Tensor:
        """A buffer of ``n`` values of ``dtype``, whose contents are undefined."""
        t = self._buffers.get((name, dtype))
        if t is None or t.numel() < n:
            t = self._buffers[name, dtype] = torch.empty(n, dtype=dtype)
        return t[:n]


def to_float32(
    t: torch.Tensor, scratch: Scratch, name: str, *, finite: bool = False
) -> torch.Tensor:
    """A flat float tensor of at most 32 bits as float32, in ``scratch``'s buffer ``name``.

    8-bit floats go through a table of torch's own cast of their 256 patterns: torch's
    CPU kernel converts float8 about ten times slower than a table lookup does. With
    ``finite`` (the caller knows no value is NaN or inf), float8_e4m3fn and float8_e5m2
    take their bits to float16's places instead, twice as fast again as the table.
    """
    n = t.numel()
    if t.dtype is torch.float32:
        return t
    out = scratch.get(name, torch.float32, n)
    if t.element_size() != 1:
        return out.copy_(t)
    if finite and t.dtype in _HALF_SHIFT:
        shift, scale = _HALF_SHIFT[t.dtype]
        half = scratch.get("half", torch.int16, n).copy_(t.view(torch.int8))  # sign-extended
        half.bitwise_left_shift_(shift)
        if shift == 7:  # e4m3: bit 14 holds a copy of the sign; float16's top exponent bit
            half.bitwise_and_(~(1 << 14))
        out.copy_(half.view(torch.float16))
        return out.mul_(scale) if scale != 1 else out
    index = scratch.get("index", torch.int32, n).copy_(t.view(torch.uint8))
    return torch.index_select(_float8_table(t.dtype), 0, index, out=out)


# float8 bits shifted into float16's places (sign, exponent, mantissa) read as float16
# times a power of two: e5m2 is float16's top byte; e4m3fn's exponent bias is 8 below
# float16's, subnormals included (its NaN pattern would read as 480: finite values only)
_HALF_SHIFT = {torch.float8_e5m2: (8, 1.0), torch.float8_e4m3fn: (7, 256.0)}


@cache
def _float8_table(dtype: torch.dtype) -> torch.Tensor:
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).to(torch.float32)


@cache
def component_row(row: DTypeRow) -> DTypeRow:
    """complex64 -> float32, bcomplex32 -> bfloat16 and so on; other rows are their own
    component."""
    if row.category != "complex":
        return row
    part: Any = ml_dtypes.finfo(row.numpy)  # type: ignore[no-untyped-call]
    return BY_NUMPY[np.dtype(part.dtype)]


def real_parts(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t).reshape(-1) if t.is_complex() else t


BITS_BY_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def part_bits(a: Array) -> Array:
    """The stored bits of each real part of an array of a table dtype (a complex element
    has two, in order), as int64."""
    part = component_row(BY_NUMPY[a.dtype]).itemsize
    return np.ascontiguousarray(a).view(f"u{part}").reshape(-1).astype(np.int64)


def bits_of(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of each value as a non-negative int64 (int64 itself: as is)."""
    width = t.element_size() * 8
    bits = t.view(BITS_BY_SIZE[t.element_size()]).to(torch.int64)
    return bits & ((1 << width) - 1) if width < 64 else bits


@dataclass(frozen=True)
class Format:
    """The facts about a floating-point format that the ULP and cast arithmetic needs.

    ``width`` is the bits a value has (6 for float6_e2m3fn, stored one a byte, its sign
    bit 5); ``bias`` the exponent field of 1.0 (11 for float8_e4m3b11fnuz). ``has_inf``
    / ``has_nan`` say whether ml_dtypes' cast of ±inf / NaN into the type gives one,
    and ``nan_bits`` the NaN it gives (``0x80`` for the fnuz types, ``None`` where the
    type has none: float6 and float4 make -0 of a NaN, ``mxfloat.h``'s ``quiet_NaN``).
    ``signed``: the type has negative values (float8_e5m3fnu and float8_e8m0fnu have
    none); ``signed_zero``: it has -0 (the fnuz types have none).
    """

    row: DTypeRow
    width: int
    signed: bool
    nmant: int
    max: float
    max_ord: int  # the bits of the largest finite value
    top_ulp: float  # the spacing just below it
    smallest_normal: float
    smallest_subnormal: float
    eps: float
    nexp: int
    bias: int
    has_inf: bool
    has_nan: bool
    nan_bits: int | None
    signed_zero: bool

    @property
    def subnormals(self) -> bool:
        """Whether the type has subnormal values (float8_e8m0fnu has none)."""
        return self.smallest_subnormal < self.smallest_normal


@cache
def format_of(row: DTypeRow) -> Format:
    fi: Any = ml_dtypes.finfo(row.numpy)  # type: ignore[no-untyped-call]
    ubits = np.dtype(f"u{row.itemsize}")
    max_bits = int(np.asarray(fi.max, row.numpy).view(ubits))
    below = float(np.asarray(max_bits - 1, ubits).view(row.numpy))
    nmant, nexp = int(fi.nmant), int(fi.nexp)
    # ml_dtypes' own casts of the special values say what the type holds
    probe = astype(np.array([1.0, math.inf, math.nan, -0.0]), row.numpy)
    bits = probe.view(ubits).astype(np.int64)
    back = astype(probe, np.dtype(np.float64))
    return Format(
        row=row,
        width=int(fi.bits),
        signed=float(fi.min) < 0,
        nmant=nmant,
        max=float(fi.max),
        max_ord=max_bits,
        top_ulp=float(fi.max) - below,
        smallest_normal=float(fi.smallest_normal),
        smallest_subnormal=float(fi.smallest_subnormal),
        eps=float(fi.eps),
        nexp=nexp,
        bias=int(bits[0] >> nmant) & ((1 << nexp) - 1),
        has_inf=bool(np.isinf(back[1])),
        has_nan=bool(np.isnan(back[2])),
        nan_bits=int(bits[2]) if np.isnan(back[2]) else None,
        signed_zero=bool(back[3] == 0 and np.signbit(back[3])),
    )


def ordinals(v: torch.Tensor, fmt: Format) -> torch.Tensor:
    """Positions of finite float64 values on ``fmt``'s ordered integer line.

    The magnitude is cast with torch's kernel and its bits are the position; the sign
    negates it. Past the largest finite value the line goes on with the top spacing
    (rounded half to even), so out-of-range values get a finite, growing distance.
    """
    mag = v.abs()
    pos = _magnitude_bits(mag, fmt)
    over = mag > fmt.max
    if bool(over.any()):
        r = (mag[over] - fmt.max) / fmt.top_ulp
        k = r.floor()
        frac = r - k
        odd = torch.remainder(k + fmt.max_ord, 2) == 1
        k = k + ((frac > 0.5) | ((frac == 0.5) & odd)).to(torch.float64)
        pos[over] = fmt.max_ord + k.clamp(max=2.0**53).to(torch.int64)
    return torch.where(v < 0, -pos, pos)


def _magnitude_bits(mag: torch.Tensor, fmt: Format) -> torch.Tensor:
    """The bits of non-negative float64 values cast to ``fmt`` (rounded to nearest even), as
    int64: torch's kernel, or ml_dtypes' ``astype`` for a type torch has no kernels for."""
    if fmt.row.kernels:
        return bits_of(mag.to(fmt.row.torch))
    cast = astype(mag.numpy(), fmt.row.numpy)
    return torch.from_numpy(cast.view(f"u{cast.itemsize}").astype(np.int64))


def int_distance(x: Array, y: Array) -> Array:
    """Exact ``|x - y|`` of integer arrays, as uint64 (object only for uint64 vs signed)."""
    if x.dtype == np.uint64 or y.dtype == np.uint64:
        if x.dtype.kind in "ub" and y.dtype.kind in "ub":
            xu, yu = x.astype(np.uint64), y.astype(np.uint64)
            return np.where(xu >= yu, xu - yu, yu - xu)
        exact: Array = np.abs(x.astype(object) - y.astype(object))
        return exact
    xs, ys = x.astype(np.int64), y.astype(np.int64)
    xu, yu = xs.view(np.uint64), ys.view(np.uint64)
    return np.where(xs >= ys, xu - yu, yu - xu)  # modular subtraction: exact, never overflows
