"""Reading a leaf's values in chunks, and the integer line ULP distances are measured on.

Shared by compare, stats and cast_report:

* :func:`source` checks that a leaf holds values this library can read (not a
  meta, nested or masked one) and finds its dtype row; :func:`chunks` yields the
  values as plain contiguous CPU tensors in C order, ``_CHUNK`` values at the most,
  so no caller ever holds several full-size float64 temporaries. ``_CHUNK`` is read
  at call time: tests shrink it here to exercise the merging of partial results.
* :func:`format_of` gathers the facts of a floating-point format that the ULP and
  cast arithmetic needs; :func:`ordinals` places values on the format's ordered
  integer line (its bits, sign-magnitude turned into signed order, continued past
  the largest finite value), so a ULP distance is a difference of two ordinals.
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

from ..convert import to_torch
from ..dtypes import BY_NUMPY, DTypeRow, explain_numpy, resolve_dtype
from ..errors import NoDataError, UnsupportedDtypeError, UnsupportedTensorError

_CHUNK = 1 << 20  # values per chunk (cache-sized); tests shrink it to exercise the merging

Array = npt.NDArray[Any]


@dataclass(frozen=True)
class _Source:
    data: Any  # a torch.Tensor (detached, strided, not meta) or an np.ndarray
    row: DTypeRow

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)


_NUMBERS = (np.ndarray, np.generic, bool, int, float, complex)
LEAVES = (*_NUMBERS, torch.Tensor)


def source(x: Any) -> _Source:
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
        return _Source(t, resolve_dtype(t.dtype))
    if isinstance(x, np.ma.MaskedArray):
        raise UnsupportedTensorError(
            "a masked array's mask would be ignored; pass a.filled(fill_value) or a.data"
        )
    if isinstance(x, _NUMBERS):
        a = np.asarray(x)
        row = BY_NUMPY.get(a.dtype) or BY_NUMPY.get(a.dtype.newbyteorder("="))
        if row is None:
            raise UnsupportedDtypeError(explain_numpy(a.dtype))
        return _Source(a, row)
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


def chunks(src: _Source, most: int | None = None) -> Iterator[torch.Tensor]:
    """Plain contiguous CPU tensors of ``src.row.torch``, in C order, of at most ``most``
    values (and never more than ``_CHUNK``)."""
    for block in _blocks(src.data, _CHUNK if most is None else min(most, _CHUNK)):
        if isinstance(block, torch.Tensor):
            yield block.resolve_conj().resolve_neg().cpu()
        else:  # read-only, byte-swapped or reversed blocks are copied, one chunk at a time
            yield to_torch(block)


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


def component_row(row: DTypeRow) -> DTypeRow:
    """complex64 -> float32 and so on; other rows are their own component."""
    return resolve_dtype(torch.finfo(row.torch).dtype) if row.category == "complex" else row


def real_parts(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t).reshape(-1) if t.is_complex() else t


BITS_BY_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits_of(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of each value as a non-negative int64 (int64 itself: as is)."""
    width = t.element_size() * 8
    bits = t.view(BITS_BY_SIZE[t.element_size()]).to(torch.int64)
    return bits & ((1 << width) - 1) if width < 64 else bits


@dataclass(frozen=True)
class Format:
    """The facts about a floating-point format that the ULP and cast arithmetic needs."""

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


@cache
def format_of(row: DTypeRow) -> Format:
    fi: Any = ml_dtypes.finfo(row.numpy)  # type: ignore[no-untyped-call]
    ubits = np.dtype(f"u{row.itemsize}")
    max_bits = int(np.asarray(fi.max, row.numpy).view(ubits))
    below = float(np.asarray(max_bits - 1, ubits).view(row.numpy))
    return Format(
        row=row,
        width=row.itemsize * 8,
        signed=float(fi.min) < 0,
        nmant=int(fi.nmant),
        max=float(fi.max),
        max_ord=max_bits,
        top_ulp=float(fi.max) - below,
        smallest_normal=float(fi.smallest_normal),
        smallest_subnormal=float(fi.smallest_subnormal),
        eps=float(fi.eps),
    )


def ordinals(v: torch.Tensor, fmt: Format) -> torch.Tensor:
    """Positions of finite float64 values on ``fmt``'s ordered integer line.

    The magnitude is cast with torch's kernel and its bits are the position; the sign
    negates it. Past the largest finite value the line goes on with the top spacing
    (rounded half to even), so out-of-range values get a finite, growing distance.
    """
    mag = v.abs()
    pos = bits_of(mag.to(fmt.row.torch))
    over = mag > fmt.max
    if bool(over.any()):
        r = (mag[over] - fmt.max) / fmt.top_ulp
        k = r.floor()
        frac = r - k
        odd = torch.remainder(k + fmt.max_ord, 2) == 1
        k = k + ((frac > 0.5) | ((frac == 0.5) & odd)).to(torch.float64)
        pos[over] = fmt.max_ord + k.clamp(max=2.0**53).to(torch.int64)
    return torch.where(v < 0, -pos, pos)


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
