"""Diagnostics: what a tensor is, how two differ, what a cast would do. Data, never printing.

* :func:`describe` answers "why did that copy?": dtypes on both sides, strides, storage,
  autograd and conj/neg bits, and what :func:`~tensorbridge.to_numpy` /
  :func:`~tensorbridge.to_torch` would do. The verdict is not a second copy of the
  rules: it asks the converters themselves with ``copy=False`` (which builds a view
  or raises :class:`~tensorbridge.CopyRequiredError` before copying anything) and
  reports their reason.
* :func:`compare` measures two tensors, arrays or trees of them (matched by key
  path). ULP distances are counted in the coarser dtype: each value's magnitude is
  cast to it with torch's kernel and its bits read as a position on an ordered
  integer line (sign-magnitude to signed order, so -0 and +0 coincide); beyond the
  largest finite value the line continues with the top binade's spacing. This is
  exact for bfloat16 and float8, where NumPy's ``assert_array_max_ulp`` fails.
* :func:`cast_report` runs the cast a ``to_numpy(x, dtype=...)`` would run (torch's
  kernel) and counts what happened: overflow, saturation, flush to zero, NaN sign
  and payload changes, errors in units of the target's ULP.
* :func:`stats` summarises values in float64, so a bfloat16 sum does not stall.

Everything streams in chunks of about four million values, so a large tensor never
needs several full-size float64 temporaries. Results are small frozen dataclasses;
``to_dict()`` gives plain JSON-ready values (non-finite floats become "inf",
"-inf", "nan").
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any, Literal

import ml_dtypes
import numpy as np
import numpy.typing as npt
import torch

from .convert import to_numpy, to_torch
from .dtypes import BY_NUMPY, DTypeRow, explain_numpy, resolve_dtype
from .errors import (
    CopyRequiredError,
    NoDataError,
    TensorBridgeError,
    UnsupportedDtypeError,
    UnsupportedTensorError,
)

__all__ = [
    "CastReport",
    "Comparison",
    "ConversionPlan",
    "Description",
    "Stats",
    "cast_report",
    "compare",
    "default_tolerances",
    "describe",
    "stats",
]

_CHUNK = 1 << 22  # values per chunk; tests shrink it to exercise the merging

Array = npt.NDArray[Any]


class _Record:
    """Shared ``to_dict`` of the result dataclasses."""

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain JSON-ready values (non-finite floats as "inf"/"-inf"/"nan")."""
        return {k: _plain(v) for k, v in vars(self).items()}


def _plain(v: Any) -> Any:
    if isinstance(v, _Record):
        return v.to_dict()
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if v != v else ("inf" if v > 0 else "-inf")
    return v


# --- describe ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConversionPlan(_Record):
    """What one converter would do with a value: share its memory, copy it, or refuse."""

    verdict: Literal["share", "copy", "error"]
    reason: str

    @property
    def shares(self) -> bool:
        return self.verdict == "share"


@dataclass(frozen=True)
class Description(_Record):
    """Everything that decides how a tensor or array converts.

    Attributes:
        kind: the Python type ("torch.Tensor", "numpy.ndarray", ...).
        torch_dtype / numpy_dtype: the dtype on each side ("torch.bfloat16", "bfloat16"),
            ``None`` where there is none; ``dtype_note`` says why, or notes a byte swap.
        strides / strides_bytes: in elements and in bytes (``None`` for sparse/nested).
        storage_offset / storage_offset_bytes / storage_nbytes: where the view starts in
            its storage and how big that storage is (for arrays: the outermost ndarray
            of the ``.base`` chain).
        nbytes: ``numel * itemsize``, the bytes a dense copy takes.
        requires_grad / is_leaf / grad_fn: autograd state (``None`` for arrays).
        to_numpy / to_torch: what ``tb.to_numpy(x)`` / ``tb.to_torch(x)`` would do, and why.
        notes: aliasing and autograd caveats worth knowing before sharing memory.
    """

    kind: str
    torch_dtype: str | None
    numpy_dtype: str | None
    dtype_note: str | None
    category: str | None
    itemsize: int
    shape: tuple[int, ...] | None
    numel: int | None
    strides: tuple[int, ...] | None
    strides_bytes: tuple[int, ...] | None
    storage_offset: int | None
    storage_offset_bytes: int | None
    storage_nbytes: int | None
    nbytes: int | None
    device: str
    layout: str
    requires_grad: bool | None
    is_leaf: bool | None
    grad_fn: str | None
    is_conj: bool
    is_neg: bool
    c_contiguous: bool | None
    f_contiguous: bool | None
    readonly: bool
    byteswapped: bool
    to_numpy: ConversionPlan
    to_torch: ConversionPlan
    notes: tuple[str, ...] = ()


_COPY_REASON = re.compile(r"cannot share memory: the input (.*); pass copy=None", re.S)


def _plan(convert: Callable[[], Any], share_reason: str) -> ConversionPlan:
    """Ask the converter itself (``copy=False`` never copies: it views or raises)."""
    try:
        convert()
    except CopyRequiredError as e:
        m = _COPY_REASON.search(str(e))
        return ConversionPlan("copy", f"the input {m.group(1)}" if m else str(e))
    except TensorBridgeError as e:
        return ConversionPlan("error", str(e))
    return ConversionPlan("share", share_reason)


def describe(x: Any) -> Description:
    """Describe a tensor or array: dtypes, layout, autograd state, and how it would convert.

    >>> import torch, tensorbridge as tb
    >>> d = tb.describe(torch.zeros(2, 3).T)
    >>> d.strides, d.c_contiguous, d.to_numpy.verdict
    ((1, 3), False, 'share')
    >>> tb.describe(torch.zeros(2, dtype=torch.complex64).conj()).to_numpy.reason
    'the input has its conjugate or negative bit set (resolving it writes new values)'

    Args:
        x: a ``torch.Tensor`` (any subclass, device or layout) or an ``np.ndarray``.

    Returns:
        A :class:`Description`.

    Raises:
        UnsupportedTensorError: ``x`` is neither.
    """
    if isinstance(x, torch.Tensor):
        return _describe_tensor(x)
    if isinstance(x, np.generic):
        x = np.asarray(x)
    if isinstance(x, np.ndarray):
        return _describe_array(x)
    raise UnsupportedTensorError(
        f"describe expects a torch.Tensor or np.ndarray, got {type(x).__qualname__}; pass "
        "np.asarray(x)"
    )


def _kind(x: Any) -> str:
    cls = type(x)
    return "torch.Tensor" if cls is torch.Tensor else f"{cls.__module__}.{cls.__qualname__}"


def _contiguous(shape: tuple[int, ...], strides: tuple[int, ...], fortran: bool) -> bool:
    expected = 1
    order = range(len(shape)) if fortran else range(len(shape) - 1, -1, -1)
    for d in order:
        if shape[d] == 0:
            return True
        if shape[d] != 1 and strides[d] != expected:
            return False
        expected *= shape[d]
    return True


def _aliasing_notes(
    shape: tuple[int, ...] | None, strides: tuple[int, ...] | None, c: bool | None, f: bool | None
) -> list[str]:
    notes = []
    if shape is not None and strides is not None:
        zero = [d for d, (n, s) in enumerate(zip(shape, strides, strict=True)) if s == 0 and n > 1]
        if zero:
            notes.append(
                f"dimension(s) {tuple(zero)} have stride 0 (expanded/broadcast): one stored "
                "element stands for many, so a write through a shared view changes them all"
            )
        if c is False and f is False:
            notes.append(
                "not contiguous: a shared view keeps these strides; np.ascontiguousarray(a) "
                "or t.contiguous() makes a dense copy"
            )
    return notes


def _describe_tensor(t: torch.Tensor) -> Description:
    try:
        row: DTypeRow | None = resolve_dtype(t.dtype)
        note = None
    except UnsupportedDtypeError as e:
        row, note = None, str(e)
    itemsize = t.element_size()
    strided = t.layout is torch.strided and not t.is_nested
    try:
        shape: tuple[int, ...] | None = tuple(t.shape)
    except RuntimeError:  # nested tensors with ragged dimensions have no single shape
        shape = None
    strides = tuple(t.stride()) if strided else None
    c = f = None
    if strided and shape is not None and strides is not None:
        c, f = _contiguous(shape, strides, False), _contiguous(shape, strides, True)
    offset = int(t.storage_offset()) if strided else None
    numel = t.numel() if shape is not None else None
    notes = _aliasing_notes(shape, strides, c, f)
    share = "to_numpy returns a NumPy view of the tensor's memory"
    if t.requires_grad:
        share += " (through t.detach())"
        notes.append(
            "requires grad: a shared NumPy view is detached, so writes through it are "
            "invisible to autograd"
        )
    return Description(
        kind=_kind(t),
        torch_dtype=str(t.dtype),
        numpy_dtype=str(row.numpy) if row is not None else None,
        dtype_note=note,
        category=row.category if row is not None else None,
        itemsize=itemsize,
        shape=shape,
        numel=numel,
        strides=strides,
        strides_bytes=tuple(s * itemsize for s in strides) if strides is not None else None,
        storage_offset=offset,
        storage_offset_bytes=offset * itemsize if offset is not None else None,
        storage_nbytes=t.untyped_storage().nbytes() if strided else None,
        nbytes=numel * itemsize if numel is not None else None,
        device=str(t.device),
        layout=str(t.layout).removeprefix("torch."),
        requires_grad=t.requires_grad,
        is_leaf=t.is_leaf,
        grad_fn=type(t.grad_fn).__name__ if t.grad_fn is not None else None,
        is_conj=bool(t.is_conj()),
        is_neg=bool(t.is_neg()),
        c_contiguous=c,
        f_contiguous=f,
        readonly=False,
        byteswapped=False,
        to_numpy=_plan(lambda: to_numpy(t, copy=False), share),
        to_torch=_plan(
            lambda: to_torch(t, copy=False), "already a tensor: to_torch returns it as is"
        ),
        notes=tuple(notes),
    )


def _address(a: Array) -> int:
    return int(a.__array_interface__["data"][0])


def _describe_array(a: Array) -> Description:
    row = BY_NUMPY.get(a.dtype)
    note = None
    swapped = not a.dtype.isnative
    if row is None:
        native = BY_NUMPY.get(a.dtype.newbyteorder("=")) if swapped else None
        if native is not None:
            row = native
            note = f"byte-swapped ({a.dtype.str}); torch holds native byte order only"
        else:
            note = explain_numpy(a.dtype)
    size = a.dtype.itemsize
    bstrides = tuple(int(s) for s in a.strides)
    strides = (
        tuple(s // size for s in bstrides)
        if size and all(s % size == 0 for s in bstrides)
        else None
    )
    root = a
    while isinstance(root.base, np.ndarray):
        root = root.base
    offset_b = _address(a) - _address(root)
    c, f = bool(a.flags.c_contiguous), bool(a.flags.f_contiguous)
    return Description(
        kind=_kind(a),
        torch_dtype=str(row.torch) if row is not None else None,
        numpy_dtype=str(a.dtype),
        dtype_note=note,
        category=row.category if row is not None else None,
        itemsize=size,
        shape=tuple(a.shape),
        numel=int(a.size),
        strides=strides,
        strides_bytes=bstrides,
        storage_offset=offset_b // size if size and offset_b % size == 0 else None,
        storage_offset_bytes=offset_b,
        storage_nbytes=int(root.nbytes),
        nbytes=int(a.nbytes),
        device="cpu",
        layout="strided",
        requires_grad=None,
        is_leaf=None,
        grad_fn=None,
        is_conj=False,
        is_neg=False,
        c_contiguous=c,
        f_contiguous=f,
        readonly=not a.flags.writeable,
        byteswapped=swapped,
        to_numpy=_plan(
            lambda: to_numpy(a, copy=False), "already an array: to_numpy returns it as is"
        ),
        to_torch=_plan(
            lambda: to_torch(a, copy=False), "to_torch returns a tensor over the array's memory"
        ),
        notes=tuple(_aliasing_notes(tuple(a.shape), strides, c, f)),
    )


# --- reading values in chunks -----------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    data: Any  # a torch.Tensor (detached, strided, not meta) or an np.ndarray
    row: DTypeRow

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)


_NUMBERS = (np.ndarray, np.generic, bool, int, float, complex)
_LEAVES = (*_NUMBERS, torch.Tensor)


def _source(x: Any) -> _Source:
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


def _blocks(x: Any) -> Iterator[Any]:
    """C-order flat pieces of ``x`` (tensor or array), each at most ``_CHUNK`` values."""
    n = math.prod(x.shape)
    if n == 0:
        return
    if x.ndim == 0 or n <= _CHUNK:
        yield x.reshape(-1)
        return
    inner = n // x.shape[0]
    if inner > _CHUNK:
        for i in range(x.shape[0]):
            yield from _blocks(x[i])
        return
    step = _CHUNK // inner
    for i in range(0, x.shape[0], step):
        yield x[i : i + step].reshape(-1)


def _chunks(src: _Source) -> Iterator[torch.Tensor]:
    """Plain contiguous CPU tensors of ``src.row.torch``, in C order."""
    for block in _blocks(src.data):
        if isinstance(block, torch.Tensor):
            yield block.resolve_conj().resolve_neg().cpu()
        else:  # read-only, byte-swapped or reversed blocks are copied, one chunk at a time
            yield to_torch(block)


def _component_row(row: DTypeRow) -> DTypeRow:
    """complex64 -> float32 and so on; other rows are their own component."""
    return resolve_dtype(torch.finfo(row.torch).dtype) if row.category == "complex" else row


def _real_parts(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t).reshape(-1) if t.is_complex() else t


_BITS_BY_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of each value as a non-negative int64 (int64 itself: as is)."""
    width = t.element_size() * 8
    bits = t.view(_BITS_BY_SIZE[t.element_size()]).to(torch.int64)
    return bits & ((1 << width) - 1) if width < 64 else bits


@dataclass(frozen=True)
class _Format:
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
def _format(row: DTypeRow) -> _Format:
    fi: Any = ml_dtypes.finfo(row.numpy)  # type: ignore[no-untyped-call]
    ubits = np.dtype(f"u{row.itemsize}")
    max_bits = int(np.asarray(fi.max, row.numpy).view(ubits))
    below = float(np.asarray(max_bits - 1, ubits).view(row.numpy))
    return _Format(
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


def _ordinals(v: torch.Tensor, fmt: _Format) -> torch.Tensor:
    """Positions of finite float64 values on ``fmt``'s ordered integer line.

    The magnitude is cast with torch's kernel and its bits are the position; the sign
    negates it. Past the largest finite value the line goes on with the top spacing
    (rounded half to even), so out-of-range values get a finite, growing distance.
    """
    mag = v.abs()
    pos = _bits(mag.to(fmt.row.torch))
    over = mag > fmt.max
    if bool(over.any()):
        r = (mag[over] - fmt.max) / fmt.top_ulp
        k = r.floor()
        frac = r - k
        odd = torch.remainder(k + fmt.max_ord, 2) == 1
        k = k + ((frac > 0.5) | ((frac == 0.5) & odd)).to(torch.float64)
        pos[over] = fmt.max_ord + k.clamp(max=2.0**53).to(torch.int64)
    return torch.where(v < 0, -pos, pos)


def _int_distance(x: Array, y: Array) -> Array:
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


# --- stats ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stats(_Record):
    """Summary of a tensor's or array's values, accumulated in float64.

    min/max/absmax/mean/std/sum are over the finite values (``None`` when there are
    none); std is the population one (ddof=0). Complex values contribute their real
    and imaginary parts as separate values.
    """

    dtype: str
    numel: int
    finite: int
    nan_count: int
    posinf_count: int
    neginf_count: int
    zeros: int
    min: float | None
    max: float | None
    absmax: float | None
    mean: float | None
    std: float | None
    sum: float | None

    @property
    def inf_count(self) -> int:
        return self.posinf_count + self.neginf_count


def stats(x: Any) -> Stats:
    """Min, max, mean, std, sum and NaN/inf counts of ``x``, accumulated in float64.

    >>> import torch, tensorbridge as tb
    >>> s = tb.stats(torch.ones(10_000, dtype=torch.bfloat16))
    >>> s.sum, s.mean, s.std
    (10000.0, 1.0, 0.0)

    Raises:
        UnsupportedDtypeError / UnsupportedTensorError / NoDataError: ``x`` holds no
            values this library can read.
    """
    src = _source(x)
    numel = finite = nan = posinf = neginf = zeros = 0
    lo, hi, total, mean, m2 = math.inf, -math.inf, 0.0, 0.0, 0.0
    for chunk in _chunks(src):
        numel += chunk.numel()
        v = _real_parts(chunk).to(torch.float64)
        finite_mask = v.isfinite()
        fin = v
        if not bool(finite_mask.all()):  # the common all-finite chunk skips these passes
            nan += int(v.isnan().sum())
            posinf += int((v == math.inf).sum())
            neginf += int((v == -math.inf).sum())
            fin = v[finite_mask]
        zeros += int((fin == 0).sum())
        n = fin.numel()
        if not n:
            continue
        lo, hi = min(lo, float(fin.min())), max(hi, float(fin.max()))
        s = float(fin.sum())
        m = s / n
        chunk_m2 = float(((fin - m) ** 2).sum())
        total += s
        delta = m - mean  # Chan et al.'s pairwise update of the mean and the squared deviations
        mean += delta * n / (finite + n)
        m2 += chunk_m2 + delta * delta * finite * n / (finite + n)
        finite += n
    some = finite > 0
    return Stats(
        dtype=src.row.name,
        numel=numel,
        finite=finite,
        nan_count=nan,
        posinf_count=posinf,
        neginf_count=neginf,
        zeros=zeros,
        min=lo if some else None,
        max=hi if some else None,
        absmax=max(abs(lo), abs(hi)) if some else None,
        mean=mean if some else None,
        std=math.sqrt(m2 / finite) if some else None,
        sum=total if some else None,
    )


# --- compare ----------------------------------------------------------------------------------

# torch.testing.assert_close's defaults; other floats get rtol = eps (one ULP at the bottom
# of a binade) and atol = the smallest subnormal (one ULP at zero).
_TORCH_TOLERANCES = {
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float32": (1.3e-6, 1e-5),
    "float64": (1e-7, 1e-7),
}


def default_tolerances(dtype: Any) -> tuple[float, float]:
    """``(rtol, atol)`` that :func:`compare` uses for ``dtype`` when none are given.

    float16/bfloat16/float32/float64 (and complex of them) use torch.testing.assert_close's
    values; the float8 family uses rtol = eps (e4m3: 0.125, e5m2: 0.25) and atol = the
    smallest subnormal; integers and bool compare exactly.

    >>> default_tolerances("float8_e4m3fn")
    (0.125, 0.001953125)
    """
    row = resolve_dtype(dtype)
    if row.category not in ("float", "complex"):
        return 0.0, 0.0
    comp = _component_row(row)
    if comp.name in _TORCH_TOLERANCES:
        return _TORCH_TOLERANCES[comp.name]
    fmt = _format(comp)
    return fmt.eps, fmt.smallest_subnormal


@dataclass(frozen=True)
class Comparison(_Record):
    """How two tensors, arrays or trees differ, and whether that is within tolerance.

    ``a`` is the reference: relative errors and the tolerance test are
    ``|b - a| <= atol + rtol * |a|`` over positions where both are finite. NaN in both
    is a match (a changed payload is counted, not failed); the same infinity is a match.
    ``bitwise_equal`` is True only for the same dtype, shape and bytes (``None`` when a
    leaf could not be read); ``nan_payload_changes`` is ``None`` across dtypes.
    ULP distances are in ``compared_in``, the coarser dtype (see the module docstring);
    for integers they are the exact integer differences. Complex values are compared
    part by part. Dtype differences are reported but do not fail ``ok``: the tolerance
    of the coarser dtype decides. A tree comparison has ``leaves`` by key path, lists
    paths found only in ``a`` (``missing``) or only in ``b`` (``extra``), and sums or
    maximises the leaves' numbers.
    """

    ok: bool
    max_ulp: int | None
    path: str = ""
    numel: int = 0
    mismatches: int = 0
    nan_mismatches: int = 0
    inf_mismatches: int = 0
    nan_payload_changes: int | None = None
    bitwise_equal: bool | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    worst_index: tuple[int, ...] | None = None
    shape_a: tuple[int, ...] | None = None
    shape_b: tuple[int, ...] | None = None
    dtype_a: str | None = None
    dtype_b: str | None = None
    shape_mismatch: bool = False
    dtype_mismatch: bool = False
    compared_in: str | None = None
    rtol: float | None = None
    atol: float | None = None
    problem: str | None = None
    missing: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()
    leaves: Mapping[str, Comparison] = field(default_factory=dict)


def compare(a: Any, b: Any, *, rtol: float | None = None, atol: float | None = None) -> Comparison:
    """Compare ``b`` against the reference ``a``: errors, ULP distance, NaN/inf, a verdict.

    >>> import torch, tensorbridge as tb
    >>> x = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    >>> y = torch.tensor([1.0, 2.015625], dtype=torch.bfloat16)  # 1 ULP above 2
    >>> c = tb.compare(x, y)
    >>> c.ok, c.max_ulp, c.worst_index
    (True, 1, (1,))
    >>> tb.compare({"w": x}, {"v": x}).missing
    ("['w']",)

    Args:
        a, b: tensors, arrays, numbers, or nested dicts/lists/tuples of them.
        rtol, atol: tolerances for every leaf; each one not given takes the default of
            the leaf's coarser dtype (:func:`default_tolerances`).

    Returns:
        A :class:`Comparison`; problems (shape differences, missing keys, unreadable
        leaves) are reported in it, not raised.
    """
    if _is_tree(a) or _is_tree(b):
        fa, fb = _flatten(a), _flatten(b)
        leaves = {p: _compare_leaf(fa[p], fb[p], p, rtol, atol) for p in fa if p in fb}
        missing = tuple(p for p in fa if p not in fb)
        extra = tuple(p for p in fb if p not in fa)
        return _summarise(leaves, missing, extra)
    return _compare_leaf(a, b, "", rtol, atol)


def _is_tree(x: Any) -> bool:
    return isinstance(x, (Mapping, list, tuple))


def _flatten(x: Any, prefix: str = "", out: dict[str, Any] | None = None) -> dict[str, Any]:
    out = {} if out is None else out
    if isinstance(x, Mapping):
        for k, v in x.items():
            _flatten(v, f"{prefix}[{k!r}]", out)
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            _flatten(v, f"{prefix}[{i}]", out)
    else:
        out[prefix] = x
    return out


def _summarise(
    leaves: dict[str, Comparison], missing: tuple[str, ...], extra: tuple[str, ...]
) -> Comparison:
    cs = list(leaves.values())

    def top(xs: list[Any]) -> Any:
        xs = [x for x in xs if x is not None]
        return max(xs) if xs else None

    payloads = [c.nan_payload_changes for c in cs if c.nan_payload_changes is not None]
    bitwise = [c.bitwise_equal for c in cs]
    return Comparison(
        ok=not missing and not extra and all(c.ok for c in cs),
        max_ulp=top([c.max_ulp for c in cs]),
        numel=sum(c.numel for c in cs),
        mismatches=sum(c.mismatches for c in cs),
        nan_mismatches=sum(c.nan_mismatches for c in cs),
        inf_mismatches=sum(c.inf_mismatches for c in cs),
        nan_payload_changes=sum(payloads) if payloads else None,
        bitwise_equal=_all_bits(bitwise, missing or extra),
        max_abs_err=top([c.max_abs_err for c in cs]),
        max_rel_err=top([c.max_rel_err for c in cs]),
        shape_mismatch=any(c.shape_mismatch for c in cs),
        dtype_mismatch=any(c.dtype_mismatch for c in cs),
        problem=_tree_problem(cs, missing, extra),
        missing=missing,
        extra=extra,
        leaves=leaves,
    )


def _all_bits(bitwise: list[bool | None], unmatched: tuple[str, ...]) -> bool | None:
    if unmatched or False in bitwise:
        return False
    return None if None in bitwise else True


def _tree_problem(
    cs: list[Comparison], missing: tuple[str, ...], extra: tuple[str, ...]
) -> str | None:
    parts = []
    if missing:
        parts.append(f"{len(missing)} key path(s) only in a")
    if extra:
        parts.append(f"{len(extra)} key path(s) only in b")
    bad = sum(1 for c in cs if not c.ok)
    if bad:
        parts.append(f"{bad} of {len(cs)} leaves differ")
    return "; ".join(parts) or None


def _coarser(ra: DTypeRow, rb: DTypeRow) -> DTypeRow | None:
    """The component dtype to measure ULPs in; ``None`` when both are integers (exact)."""
    fa = ra.category in ("float", "complex")
    fb = rb.category in ("float", "complex")
    if not (fa or fb):
        return None
    if fa != fb:
        return _component_row(ra if fa else rb)
    ca, cb = _component_row(ra), _component_row(rb)
    key_a, key_b = (_format(ca).nmant, _format(ca).max), (_format(cb).nmant, _format(cb).max)
    return cb if key_b < key_a else ca


def _paired(ta: torch.Tensor, tb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Real parts side by side; a real tensor facing a complex one gets zero imaginary parts."""
    if ta.is_complex() != tb.is_complex():
        if ta.is_complex():
            tb = torch.stack([tb, torch.zeros_like(tb)], dim=-1)
        else:
            ta = torch.stack([ta, torch.zeros_like(ta)], dim=-1)
    return _real_parts(ta).reshape(-1), _real_parts(tb).reshape(-1)


def _compare_leaf(a: Any, b: Any, path: str, rtol: float | None, atol: float | None) -> Comparison:
    if not isinstance(a, _LEAVES) and not isinstance(b, _LEAVES):
        # plain values in a tree (strings, None): equal or not
        same = type(a) is type(b) and bool(a == b)
        return Comparison(
            ok=same,
            max_ulp=None,
            path=path,
            bitwise_equal=same,
            problem=None if same else f"values differ: {a!r:.60} vs {b!r:.60}",
        )
    try:
        sa, sb = _source(a), _source(b)
    except TensorBridgeError as e:
        return Comparison(ok=False, max_ulp=None, path=path, problem=str(e))
    base = Comparison(
        ok=False,
        max_ulp=None,
        path=path,
        shape_a=sa.shape,
        shape_b=sb.shape,
        dtype_a=sa.row.name,
        dtype_b=sb.row.name,
        dtype_mismatch=sa.row is not sb.row,
    )
    if sa.shape != sb.shape:
        return replace(
            base,
            shape_mismatch=True,
            bitwise_equal=False,
            problem=f"shapes differ: {sa.shape} vs {sb.shape}",
        )
    coarse = _coarser(sa.row, sb.row)
    default = default_tolerances(coarse or sa.row)
    rt = default[0] if rtol is None else float(rtol)
    at = default[1] if atol is None else float(atol)
    same = sa.row is sb.row
    acc = _LeafAccumulator(coarse, rt, at, same)
    for ta, tb in zip(_chunks(sa), _chunks(sb), strict=True):
        acc.add(ta, tb)
    worst = None
    if acc.worst >= 0:
        worst = tuple(int(i) for i in np.unravel_index(acc.worst, sa.shape))
    return replace(
        base,
        ok=acc.bad == 0,
        max_ulp=acc.max_ulp,
        numel=acc.numel,
        mismatches=acc.bad,
        nan_mismatches=acc.nan_bad,
        inf_mismatches=acc.inf_bad,
        nan_payload_changes=acc.payload if same else None,
        bitwise_equal=acc.bitwise and same,
        max_abs_err=acc.max_abs if acc.numel else None,
        max_rel_err=acc.max_rel if acc.numel else None,
        worst_index=worst,
        compared_in=coarse.name if coarse is not None else "integers (exact)",
        rtol=rt,
        atol=at,
    )


class _LeafAccumulator:
    """Running totals of one leaf's comparison, fed chunk by chunk."""

    def __init__(self, coarse: DTypeRow | None, rtol: float, atol: float, same: bool) -> None:
        self.fmt = _format(coarse) if coarse is not None else None
        self.rtol, self.atol, self.same = rtol, atol, same
        self.numel = self.bad = self.nan_bad = self.inf_bad = self.payload = 0
        self.max_ulp, self.worst = 0, -1  # worst: flat index of the largest ULP distance
        self.max_abs = self.max_rel = 0.0
        self.bitwise = True

    def add(self, ta: torch.Tensor, tb: torch.Tensor) -> None:
        elements = ta.numel()
        ca, cb = _paired(ta, tb)
        parts = ca.numel() // max(elements, 1)
        if self.same:
            self.bitwise &= bool(torch.equal(_bits(ca), _bits(cb)))
        va, vb = ca.to(torch.float64), cb.to(torch.float64)
        nan_a, nan_b = va.isnan(), vb.isnan()
        fin = va.isfinite() & vb.isfinite()
        nan_bad = int((nan_a ^ nan_b).sum())
        inf_bad = int(((va.isinf() | vb.isinf()) & ~(nan_a | nan_b) & (va != vb)).sum())
        if self.same and self.fmt is not None:
            self.payload += int((nan_a & nan_b & (_bits(ca) != _bits(cb))).sum())
        if self.fmt is None:  # integers: exact distances
            dist = _int_distance(_int_numpy(ca), _int_numpy(cb))
            diff = torch.from_numpy(dist.astype(np.float64))
        else:
            diff = torch.where(fin, (va - vb).abs(), torch.zeros_like(va))
            oa = _ordinals(torch.where(fin, va, torch.zeros_like(va)), self.fmt)
            ob = _ordinals(torch.where(fin, vb, torch.zeros_like(vb)), self.fmt)
            dist = _int_distance(oa.numpy(), ob.numpy())
        ref = va.abs()
        rel = torch.where(ref > 0, diff / ref, torch.where(diff > 0, math.inf, 0.0))
        tol_bad = int((fin & (diff > self.atol + self.rtol * ref)).sum())
        if fin.any():
            self.max_abs = max(self.max_abs, float(diff[fin].max()))
            self.max_rel = max(self.max_rel, float(rel[fin].max()))
        if dist.size:
            i = int(np.argmax(dist))
            if int(dist[i]) > self.max_ulp:
                self.max_ulp = int(dist[i])
                self.worst = self.numel + i // max(parts, 1)
        self.bad += tol_bad + nan_bad + inf_bad
        self.nan_bad += nan_bad
        self.inf_bad += inf_bad
        self.numel += elements


def _int_numpy(t: torch.Tensor) -> Array:
    return (t.to(torch.uint8) if t.dtype is torch.bool else t).numpy()


# --- cast_report ------------------------------------------------------------------------------

ULP_BINS = ("0", "<=0.5", "<=1", "<=2", ">2")


@dataclass(frozen=True)
class CastReport(_Record):
    """What casting to ``target_dtype`` with torch's kernel does to each value.

    Counts are over real values (a complex element counts twice):

    Attributes:
        kernel / semantics: whose cast this is ("torch", what ``to_numpy(x, dtype=)`` runs)
            and how it treats ties, overflow, inf and NaN, as probed on this installation.
        exact / inexact: finite values kept exactly / changed.
        overflow_inf: finite values that became ±inf.
        saturated: values beyond the target's range (or ±inf) clamped to ±max finite.
        nan_created: non-NaN values that became NaN.
        flushed_to_zero: nonzero finite values that became ±0.
        subnormal: results that are subnormal in the target.
        nan_changed: NaNs whose sign or payload (the top mantissa bits that fit) changed.
        max_abs_err / max_rel_err / mean_rel_err: over finite values with a finite
            result (relative: nonzero values only); ``None`` when there are none.
        ulp_histogram: |result - value| in units of the target's ULP at the value
            (correct rounding gives at most 0.5; saturation lands in ">2").
        ml_dtypes_nan: non-NaN values that NumPy's ``astype`` (ml_dtypes' kernel for its
            types) would turn into NaN instead — e.g. float8_e4m3fn overflow.
        astype_differs: values whose bits ``astype`` would make differently.
        imag_discarded: nonzero imaginary parts dropped by a complex-to-real cast.
        safe: nothing overflowed, saturated, flushed, or became or changed a NaN.
    """

    source_dtype: str
    target_dtype: str
    kernel: str
    semantics: str
    numel: int
    exact: int
    inexact: int
    overflow_inf: int
    saturated: int
    nan_created: int
    flushed_to_zero: int
    subnormal: int
    nan_changed: int
    max_abs_err: float | None
    max_rel_err: float | None
    mean_rel_err: float | None
    ulp_histogram: Mapping[str, int]
    ml_dtypes_nan: int | None
    astype_differs: int | None
    imag_discarded: int
    safe: bool


def cast_report(x: Any, dtype: Any) -> CastReport:
    """What casting ``x`` to ``dtype`` would do, with torch's kernel (``to_numpy(x, dtype=)``).

    >>> import torch, tensorbridge as tb
    >>> r = tb.cast_report(torch.tensor([1.0, 1e6, float("inf")]), "float8_e4m3fn")
    >>> r.saturated, r.ml_dtypes_nan, r.safe
    (2, 2, False)

    Raises:
        UnsupportedDtypeError: ``dtype`` is unknown or not a floating/complex dtype.
    """
    src = _source(x)
    dst = resolve_dtype(dtype)
    if dst.category not in ("float", "complex"):
        raise UnsupportedDtypeError(
            f"cast_report reports on casts to floating-point or complex dtypes, not {dst.name} "
            "(a cast to integers truncates); pass e.g. dtype='float32'"
        )
    fmt = _format(_component_row(dst))
    sfmt = _format(_component_row(src.row)) if src.row.category in ("float", "complex") else None
    c = dict.fromkeys(
        (
            "numel",
            "exact",
            "inexact",
            "overflow_inf",
            "saturated",
            "nan_created",
            "flushed",
            "subnormal",
            "nan_changed",
            "ml_nan",
            "differs",
            "imag",
            "rel_n",
        ),
        0,
    )
    hist = dict.fromkeys(ULP_BINS, 0)
    max_abs = max_rel = rel_sum = 0.0
    seen_finite = seen_rel = False
    astype_ok = True
    for chunk in _chunks(src):
        c["numel"] += chunk.numel()
        if chunk.is_complex() and not dst.torch.is_complex:
            c["imag"] += int((chunk.imag != 0).sum())
            chunk_in = chunk.real
        else:
            chunk_in = chunk
        res = chunk_in.to(dst.torch)
        s, r = _cast_parts(chunk_in, res)
        sv, rv = s.to(torch.float64), r.to(torch.float64)
        s_nan, s_fin, r_fin, r_nan = sv.isnan(), sv.isfinite(), rv.isfinite(), rv.isnan()
        same_value = s_fin & (rv == sv)
        c["exact"] += int(same_value.sum())
        c["inexact"] += int((s_fin & ~same_value).sum())
        c["overflow_inf"] += int((s_fin & rv.isinf()).sum())
        beyond = sv.isinf() | (s_fin & _overflows(sv.abs(), fmt))
        c["saturated"] += int((beyond & r_fin & (rv.abs() == fmt.max)).sum())
        c["nan_created"] += int((~s_nan & r_nan).sum())
        c["flushed"] += int((s_fin & (sv != 0) & (rv == 0)).sum())
        c["subnormal"] += int((r_fin & (rv != 0) & (rv.abs() < fmt.smallest_normal)).sum())
        if sfmt is not None and bool(s_nan.any()):
            c["nan_changed"] += _nan_changes(s[s_nan], r[s_nan], r_nan[s_nan], sfmt, fmt)
        both = s_fin & r_fin
        if bool(both.any()):
            seen_finite = True
            err = (rv[both] - sv[both]).abs()
            ref = sv[both].abs()
            max_abs = max(max_abs, float(err.max()))
            nz = ref > 0
            if bool(nz.any()):
                seen_rel = True
                rel = err[nz] / ref[nz]
                max_rel = max(max_rel, float(rel.max()))
                rel_sum += float(rel.sum())
                c["rel_n"] += int(nz.sum())
            u = err / _target_ulp(ref, fmt)
            for name, n in zip(ULP_BINS, _histogram(u), strict=True):
                hist[name] += n
        if astype_ok:
            astype_ok = _astype_check(chunk_in, res, s_nan, dst, c)
    safe = not any(
        c[k] for k in ("overflow_inf", "saturated", "nan_created", "flushed", "nan_changed", "imag")
    )
    return CastReport(
        source_dtype=src.row.name,
        target_dtype=dst.name,
        kernel="torch",
        semantics=_semantics(src.row, dst),
        numel=c["numel"],
        exact=c["exact"],
        inexact=c["inexact"],
        overflow_inf=c["overflow_inf"],
        saturated=c["saturated"],
        nan_created=c["nan_created"],
        flushed_to_zero=c["flushed"],
        subnormal=c["subnormal"],
        nan_changed=c["nan_changed"],
        max_abs_err=max_abs if seen_finite else None,
        max_rel_err=max_rel if seen_rel else None,
        mean_rel_err=rel_sum / c["rel_n"] if seen_rel else None,
        ulp_histogram=hist,
        ml_dtypes_nan=c["ml_nan"] if astype_ok else None,
        astype_differs=c["differs"] if astype_ok else None,
        imag_discarded=c["imag"],
        safe=safe,
    )


def _cast_parts(src: torch.Tensor, res: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Source and result values side by side (a real source facing a complex result: reals)."""
    if res.is_complex() and not src.is_complex():
        return src.reshape(-1), torch.view_as_real(res)[..., 0].reshape(-1)
    return _real_parts(src).reshape(-1), _real_parts(res).reshape(-1)


def _overflows(mag: torch.Tensor, fmt: _Format) -> torch.Tensor:
    """Magnitudes that round (half to even, unbounded exponent) above the largest finite."""
    half = fmt.max + fmt.top_ulp / 2
    return (mag > half) | ((mag == half) & bool(fmt.max_ord & 1))


def _target_ulp(mag: torch.Tensor, fmt: _Format) -> torch.Tensor:
    """The target's spacing at each magnitude (continued past the largest finite value)."""
    emin = math.frexp(fmt.smallest_normal)[1] - 1
    exponent = torch.frexp(mag).exponent.to(torch.int64) - 1
    exponent = torch.where(mag == 0, emin, exponent.clamp(min=emin))
    return torch.exp2((exponent - fmt.nmant).to(torch.float64))


def _histogram(u: torch.Tensor) -> list[int]:
    edges = [(u == 0), (u > 0) & (u <= 0.5), (u > 0.5) & (u <= 1), (u > 1) & (u <= 2), u > 2]
    return [int(e.sum()) for e in edges]


def _nan_changes(
    s: torch.Tensor, r: torch.Tensor, r_nan: torch.Tensor, sf: _Format, rf: _Format
) -> int:
    """NaNs whose result is not a NaN of the same sign and the same (aligned) payload."""
    sb, rb = _bits(s), _bits(r)
    s_sign = (sb >> (sf.width - 1)) & 1 if sf.signed else torch.zeros_like(sb)
    r_sign = (rb >> (rf.width - 1)) & 1 if rf.signed else torch.zeros_like(rb)
    sp, rp = sb & ((1 << sf.nmant) - 1), rb & ((1 << rf.nmant) - 1)
    shift = sf.nmant - rf.nmant
    aligned = sp >> shift if shift >= 0 else sp << -shift
    return int((~r_nan | (s_sign != r_sign) | (aligned != rp)).sum())


def _astype_check(
    src: torch.Tensor, res: torch.Tensor, s_nan: torch.Tensor, dst: DTypeRow, c: dict[str, int]
) -> bool:
    """Count what NumPy's astype (ml_dtypes' kernels) would do differently; False if it can't."""
    try:
        with np.errstate(all="ignore"):  # overflow in the cast is what is being measured
            ref = to_numpy(src).astype(dst.numpy)
    except (TypeError, ValueError):
        return False
    ref_t = to_torch(ref)
    _, rv = _cast_parts(src, ref_t)
    c["ml_nan"] += int((~s_nan & rv.to(torch.float64).isnan()).sum())
    w = dst.itemsize
    ours = res.contiguous().reshape(-1).view(torch.uint8).reshape(-1, w)
    theirs = ref_t.reshape(-1).view(torch.uint8).reshape(-1, w)
    c["differs"] += int((ours != theirs).any(dim=1).sum())
    return True


@cache
def _semantics(src: DTypeRow, dst: DTypeRow) -> str:
    """How torch's kernel casts src -> dst (ties, overflow, inf, NaN), probed on this install."""
    dcomp = _component_row(dst)
    df = _format(dcomp)
    parts = [f"torch's CPU cast {src.name} -> {dst.name}, as tb.to_numpy(x, dtype=...) runs it"]
    if src.category not in ("float", "complex"):
        top = 1 if src.category == "bool" else int(np.iinfo(src.numpy).max)
        big = min(top, int(df.max) * 4)
        parts.append("integers round to the nearest representable value")
        if big > df.max:
            got = torch.tensor([big], dtype=src.torch).to(dcomp.torch)
            parts.append(f"overflow {_outcome(got, df)}")
        return "; ".join(parts)
    probe = _component_row(src)
    pf = _format(probe)
    if src.category == "complex" and dst.category != "complex":
        parts.append("the imaginary part is dropped")

    def cast(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float64).to(probe.torch).to(dcomp.torch)

    if pf.nmant > df.nmant:
        parts.append(_tie_rule(cast, dcomp))
    elif pf.max <= df.max and pf.smallest_subnormal >= df.smallest_subnormal:
        parts.append("widening: every value is kept exactly")
    if pf.max > df.max:
        parts.append(f"overflow {_outcome(cast([min(pf.max, df.max * 4)]), df)}")
        if _has_inf(probe):
            parts.append(f"±inf {_outcome(cast([math.inf]), df)}")
    parts.append(f"NaN -> {int(_bits(cast([math.nan]))[0]):#0{df.width // 4 + 2}x}")
    return "; ".join(parts)


def _tie_rule(cast: Callable[[list[float]], torch.Tensor], row: DTypeRow) -> str:
    """Cast the two midpoints above 1.0 and see which neighbour each one went to."""
    one = int(_bits(torch.ones(1, dtype=row.torch))[0])
    ladder = torch.tensor([one, one + 1, one + 2]).to(_BITS_BY_SIZE[row.itemsize])
    v = ladder.view(row.torch).to(torch.float64).tolist()
    got = _bits(cast([(v[0] + v[1]) / 2, (v[1] + v[2]) / 2])).tolist()
    if got == [lo + lo % 2 for lo in (one, one + 1)]:
        return "rounds to nearest, ties to even"
    if got == [one + 1, one + 2]:
        return "rounds to nearest, ties away from zero"
    return "rounds to nearest"


def _has_inf(row: DTypeRow) -> bool:
    inf = torch.tensor([math.inf], dtype=torch.float64).to(row.torch).to(torch.float64)
    return bool(inf.isinf().all())


def _outcome(t: torch.Tensor, fmt: _Format) -> str:
    v = float(t.to(torch.float64)[0])
    if math.isinf(v):
        return "-> ±inf"
    if math.isnan(v):
        return "-> NaN"
    if abs(v) == fmt.max:
        return f"-> ±{fmt.max:g} (saturates)"
    return f"-> {v:g}"
