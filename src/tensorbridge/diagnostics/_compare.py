"""compare(): how two tensors, arrays or trees of them differ, and whether within tolerance.

Trees (dicts, lists, tuples) are matched leaf by leaf by key path; a path on one
side only is listed, and a leaf that cannot be read is a problem in the result,
not an exception. Each leaf is read in chunks into a running accumulator, with
``a`` as the reference. ULP distances are differences of positions on the coarser
dtype's integer line (``_values.ordinals``), exact for bfloat16 and float8, where
NumPy's ``assert_array_max_ulp`` fails; integers are compared by their exact
differences. Tolerances not given default to torch.testing.assert_close's where it
has them and to one ULP of the format elsewhere.

Floats of at most 32 bits, of one dtype or two (float32 against its bfloat16, float16 or
float8 copy), take a fast path: differences in float32, ULPs from the coarser type's own
bits (the finer side cast to it with torch's kernel, as ``ordinals`` does), in
chunk-sized buffers reused from chunk to chunk and leaf to leaf. A chunk holding NaN or
inf, or finer values beyond the coarser range, takes the general float64 path. What a
pair of dtypes needs (coarser type, default tolerances, fast or general) is planned once
per pair, not per leaf.

A row torch has no kernels for (int4, float6_e2m3fn, bcomplex32, ...) is read through
ml_dtypes (``_values.host_chunks``): its values widened exactly, a chunk at a time, into
int8 / uint8, float32 or complex64 take the general path, with ULPs counted in the
coarser type's own format by ml_dtypes' cast (``_values.ordinals``) and its stored bytes
beside them for ``bitwise_equal`` and NaN payloads. The sub-byte integers compare as the
integers ml_dtypes reads (the low N bits of each byte): ``0x18`` and ``0x08`` as int4
are both -8, equal values of different bytes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np
import torch

from .._progress import progress_bar
from ..dtypes import DTypeRow, resolve_dtype
from ..errors import InvalidArgumentError, TensorBridgeError
from ..tree import flatten_with_paths
from ._record import Record
from ._values import (
    LEAVES,
    Array,
    Scratch,
    bits_of,
    chunks,
    component_row,
    format_of,
    host_chunks,
    int_distance,
    ordinals,
    part_bits,
    real_parts,
    source,
    to_float32,
)

# Two chunks as stored, beside their values widened by ml_dtypes (``_values.host_chunks``)
_Stored = tuple[Array, Array]

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
    comp = component_row(row)
    if comp.name in _TORCH_TOLERANCES:
        return _TORCH_TOLERANCES[comp.name]
    fmt = format_of(comp)
    return fmt.eps, fmt.smallest_subnormal


@dataclass(frozen=True)
class Comparison(Record):
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


def compare(
    a: Any,
    b: Any,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    progress: bool | None = False,
) -> Comparison:
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
        progress: a progress bar over the leaves' bytes on stderr (``None``: when it is
            a terminal and the work, counted in leaves and values, is expected to take
            over about a second).

    Returns:
        A :class:`Comparison`; problems (shape differences, missing keys, unreadable
        leaves) are reported in it, not raised.

    Raises:
        InvalidArgumentError: a negative or NaN ``rtol`` / ``atol``.
    """
    for label, tol in (("rtol", rtol), ("atol", atol)):
        if tol is not None and not tol >= 0:
            raise InvalidArgumentError(
                f"{label}={tol!r} is not a tolerance; pass a number >= 0, or None for the "
                "dtype's default"
            )
    if _is_tree(a) or _is_tree(b):
        fa, fb = flatten_with_paths(a), flatten_with_paths(b)
        paths = [p for p in fa if p in fb]
        nbytes = sum(_nbytes(fa[p]) for p in paths)
        bar = progress_bar(nbytes, "comparing", progress, tensors=len(paths), work="check")
        leaves = {}
        scratch = Scratch()
        try:
            for p in paths:
                leaves[p] = _compare_leaf(fa[p], fb[p], p, rtol, atol, scratch)
                bar.update(_nbytes(fa[p]))
        finally:
            bar.close()
        missing = tuple(p for p in fa if p not in fb)
        extra = tuple(p for p in fb if p not in fa)
        return _summarise(leaves, missing, extra)
    return _compare_leaf(a, b, "", rtol, atol, Scratch())


def _nbytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    return int(getattr(x, "nbytes", 0))


def _is_tree(x: Any) -> bool:
    if isinstance(x, (Mapping, list, tuple)):
        return True
    return dataclasses.is_dataclass(x) and not isinstance(x, type)


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
        return component_row(ra if fa else rb)
    ca, cb = component_row(ra), component_row(rb)
    key_a, key_b = (
        (format_of(ca).nmant, format_of(ca).max),
        (format_of(cb).nmant, format_of(cb).max),
    )
    return cb if key_b < key_a else ca


def _narrow(row: DTypeRow) -> bool:
    """A float (or complex of floats) of at most 32 bits a part: compared in float32."""
    return row.category in ("float", "complex") and component_row(row).itemsize <= 4


def _paired(ta: torch.Tensor, tb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Real parts side by side; a real tensor facing a complex one gets zero imaginary parts."""
    if ta.is_complex() != tb.is_complex():
        if ta.is_complex():
            tb = torch.stack([tb, torch.zeros_like(tb)], dim=-1)
        else:
            ta = torch.stack([ta, torch.zeros_like(ta)], dim=-1)
    return real_parts(ta).reshape(-1), real_parts(tb).reshape(-1)


def _compare_leaf(
    a: Any, b: Any, path: str, rtol: float | None, atol: float | None, scratch: Scratch
) -> Comparison:
    if not isinstance(a, LEAVES) and not isinstance(b, LEAVES):
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
        sa, sb = source(a), source(b)
    except TensorBridgeError as e:
        return Comparison(ok=False, max_ulp=None, path=path, problem=str(e))
    if sa.shape != sb.shape:
        return Comparison(
            ok=False,
            max_ulp=None,
            path=path,
            shape_a=sa.shape,
            shape_b=sb.shape,
            dtype_a=sa.row.name,
            dtype_b=sb.row.name,
            dtype_mismatch=sa.row is not sb.row,
            shape_mismatch=True,
            bitwise_equal=False,
            problem=f"shapes differ: {sa.shape} vs {sb.shape}",
        )
    plan = _leaf_plan(sa.row, sb.row)
    rt = plan.rtol if rtol is None else float(rtol)
    at = plan.atol if atol is None else float(atol)
    acc = _LeafAccumulator(plan.coarse, rt, at, plan.same, plan.narrow, scratch)
    if plan.through_ml_dtypes:  # values widened by ml_dtypes, beside the stored bytes
        for (ra, ta), (rb, tb) in zip(host_chunks(sa), host_chunks(sb), strict=True):
            acc.add(ta, tb, (ra, rb))
    else:
        for ta, tb in zip(chunks(sa), chunks(sb), strict=True):
            acc.add(ta, tb)
    return Comparison(
        ok=acc.bad == 0,
        max_ulp=acc.max_ulp,
        path=path,
        numel=acc.numel,
        mismatches=acc.bad,
        nan_mismatches=acc.nan_bad,
        inf_mismatches=acc.inf_bad,
        nan_payload_changes=acc.payload if plan.same else None,
        bitwise_equal=acc.bitwise and plan.same,
        max_abs_err=acc.max_abs if acc.numel else None,
        max_rel_err=acc.max_rel if acc.numel else None,
        worst_index=_unravel(acc.worst, sa.shape) if acc.worst >= 0 else None,
        shape_a=sa.shape,
        shape_b=sb.shape,
        dtype_a=sa.row.name,
        dtype_b=sb.row.name,
        dtype_mismatch=not plan.same,
        compared_in=plan.compared_in,
        rtol=rt,
        atol=at,
    )


@dataclass(frozen=True)
class _LeafPlan:
    """How leaves of one pair of dtypes are compared, decided once per pair."""

    coarse: DTypeRow | None  # the dtype ULPs are counted in; None: integers, exactly
    compared_in: str
    rtol: float  # the defaults of the coarser dtype
    atol: float
    same: bool
    narrow: bool  # both floats of at most 32 bits a part: the float32 fast path
    through_ml_dtypes: bool  # a side torch has no kernels for: read through ml_dtypes


@cache
def _leaf_plan(ra: DTypeRow, rb: DTypeRow) -> _LeafPlan:
    coarse = _coarser(ra, rb)
    rtol, atol = default_tolerances(coarse or ra)
    kernels = ra.kernels and rb.kernels
    return _LeafPlan(
        coarse=coarse,
        compared_in=coarse.name if coarse is not None else "integers (exact)",
        rtol=rtol,
        atol=atol,
        same=ra is rb,
        narrow=kernels and _narrow(ra) and _narrow(rb),
        through_ml_dtypes=not kernels,
    )


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The index in ``shape`` of C-order position ``flat`` (np.unravel_index, for one)."""
    index = []
    for size in reversed(shape):
        flat, i = divmod(flat, size)
        index.append(i)
    return tuple(reversed(index))


class _LeafAccumulator:
    """Running totals of one leaf's comparison, fed chunk by chunk."""

    def __init__(
        self,
        coarse: DTypeRow | None,
        rtol: float,
        atol: float,
        same: bool,
        narrow: bool,
        scratch: Scratch,
    ) -> None:
        self.scratch = scratch
        self.fmt = format_of(coarse) if coarse is not None else None
        self.rtol, self.atol, self.same = rtol, atol, same
        self.numel = self.bad = self.nan_bad = self.inf_bad = self.payload = 0
        self.max_ulp, self.worst = 0, -1  # worst: flat index of the largest ULP distance
        self.max_abs = self.max_rel = 0.0
        self.bitwise = True
        # both sides floats of at most 32 bits, ULPs in a signed format: the fast path
        self.narrow = narrow and self.fmt is not None and self.fmt.signed

    def add(self, ta: torch.Tensor, tb: torch.Tensor, stored: _Stored | None = None) -> None:
        """One chunk of each side; ``stored``: the chunks as stored, where ``ta`` / ``tb``
        are their values widened by ml_dtypes (their bits decide bitwise equality)."""
        elements = ta.numel()
        ca, cb = _paired(ta, tb)
        parts = ca.numel() // max(elements, 1)
        if self.same:
            equal = (
                torch.equal(_raw(ca), _raw(cb))
                if stored is None
                else np.array_equal(part_bits(stored[0]), part_bits(stored[1]))
            )
            if equal:  # the common case: nothing in this chunk differs
                self.numel += elements
                return
            self.bitwise = False
        if self.narrow:
            self._add_narrow(ca, cb, elements, parts)
            return
        self._add_general(ca, cb, elements, parts, stored)

    def _accumulate(
        self,
        ca: torch.Tensor,
        cb: torch.Tensor,
        va: torch.Tensor,
        vb: torch.Tensor,
        elements: int,
        parts: int,
        stored: _Stored | None = None,
    ) -> None:
        """Every count, for any pair of dtypes: NaN and inf masks, casts to the coarser line."""
        nan_a, nan_b = va.isnan(), vb.isnan()
        fin = va.isfinite() & vb.isfinite()
        nan_bad = int(torch.count_nonzero(nan_a ^ nan_b))
        inf_bad = int(
            torch.count_nonzero((va.isinf() | vb.isinf()) & ~(nan_a | nan_b) & (va != vb))
        )
        if self.same and self.fmt is not None:
            if stored is None:
                ba, bb = bits_of(ca), bits_of(cb)
            else:  # the stored bits, not those of the widened values
                ba, bb = (torch.from_numpy(part_bits(a)) for a in stored)
            self.payload += int(torch.count_nonzero(nan_a & nan_b & (ba != bb)))
        if self.fmt is None:  # integers: exact distances
            dist = int_distance(_int_numpy(ca), _int_numpy(cb))
            diff = torch.from_numpy(dist.astype(np.float64))
        else:
            diff = torch.where(fin, (va - vb).abs(), torch.zeros_like(va))
            oa = ordinals(torch.where(fin, va, torch.zeros_like(va)), self.fmt)
            ob = ordinals(torch.where(fin, vb, torch.zeros_like(vb)), self.fmt)
            dist = int_distance(oa.numpy(), ob.numpy())
        ref = va.abs()
        rel = torch.where(ref > 0, diff / ref, torch.where(diff > 0, math.inf, 0.0))
        tol_bad = int(torch.count_nonzero(fin & (diff > self.atol + self.rtol * ref)))
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

    def _add_narrow(self, ca: torch.Tensor, cb: torch.Tensor, elements: int, parts: int) -> None:
        """Two chunks of float types of at most 32 bits: few passes, no float64 copies.

        Differences are taken in float32 (exact for every narrower type, and for float32
        within its own rounding). ULP distances come from the bits in the coarser type:
        the finer side is cast to it with torch's kernel (what :func:`ordinals` does), and
        the sign-magnitude integers are turned into signed order, so no float64 line is
        built. Chunks holding NaN or inf, or finer values beyond the coarser type's range
        (where the line continues past its largest value), take the general path.
        """
        n, buf = ca.numel(), self.scratch.get
        va, vb = to_float32(ca, self.scratch, "a"), to_float32(cb, self.scratch, "b")
        diff = torch.sub(va, vb, out=buf("diff", torch.float32, n)).abs_()
        max_abs = float(diff.max())
        if not math.isfinite(max_abs):  # NaN/inf (or overflow) present: the full path
            self._add_general(ca, cb, elements, parts)
            return
        ref = torch.abs(va, out=buf("ref", torch.float32, n))
        assert self.fmt is not None
        coarse, top = self.fmt.row.torch, self.fmt.max
        if ca.dtype is not coarse and float(ref.max()) > top:
            self._add_general(ca, cb, elements, parts)
            return
        if cb.dtype is not coarse and max(-float(vb.min()), float(vb.max())) > top:
            self._add_general(ca, cb, elements, parts)
            return
        rel = torch.div(diff, ref, out=buf("rel", torch.float32, n))
        max_rel = float(rel.nan_to_num_(nan=0.0, posinf=math.inf).max())
        self.max_abs, self.max_rel = max(self.max_abs, max_abs), max(self.max_rel, max_rel)
        # the exact count only when some element may be out of tolerance
        if max_abs > self.atol and max_rel * (1 + 2**-20) > self.rtol:
            self.bad += int(torch.count_nonzero(diff > ref.mul_(self.rtol).add_(self.atol)))
        qa = ca if ca.dtype is coarse else buf("q", coarse, n).copy_(ca)
        qb = cb if cb.dtype is coarse else buf("q", coarse, n).copy_(cb)
        dist, i = _max_ulp(qa, qb, self.max_ulp, buf("ulp", _INT_OF_WIDTH[qa.element_size()], n))
        if dist > self.max_ulp:
            self.max_ulp = dist
            self.worst = self.numel + i // max(parts, 1)
        self.numel += elements

    def _add_general(
        self,
        ca: torch.Tensor,
        cb: torch.Tensor,
        elements: int,
        parts: int,
        stored: _Stored | None = None,
    ) -> None:
        va, vb = ca.to(torch.float64), cb.to(torch.float64)
        self._accumulate(ca, cb, va, vb, elements, parts, stored)


_INT_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _raw(t: torch.Tensor) -> torch.Tensor:
    """The values' bits as same-width integers (``torch.equal`` on floats would compare values)."""
    return t.view(_INT_OF_WIDTH[t.element_size()]) if t.dtype is not torch.bool else t


def _max_ulp(ca: torch.Tensor, cb: torch.Tensor, floor: int, out: torch.Tensor) -> tuple[int, int]:
    """The largest ULP distance between finite floats of one type of at most 32 bits, and
    its flat index (``-1`` unless the distance exceeds ``floor``), from the bits alone.

    Two values of one sign are as many ULPs apart as their sign-magnitude bits, so a
    subtraction in the bits' own width is exact for them (the magnitudes' difference
    fits). Pairs across zero, found by the sign bit of ``a ^ b``, are as far apart as
    their magnitudes' sum (-0 and +0 are one point) and are measured apart in int64.
    """
    ia, ib = _raw(ca), _raw(cb)
    signs = torch.bitwise_xor(ia, ib, out=out)  # negative where the signs differ
    where = (signs < 0).nonzero().squeeze(1) if int(signs.min()) < 0 else None
    dist = torch.sub(ia, ib, out=out).abs_()  # pairs across zero wrap around: replaced below
    if where is None:
        best = int(dist.max())
        return best, int(dist.argmax()) if best > floor else -1
    dist.index_fill_(0, where, 0)
    best = int(dist.max())
    mask = (1 << (ca.element_size() * 8 - 1)) - 1
    both = (ia[where].to(torch.int64) & mask) + (ib[where].to(torch.int64) & mask)
    j = int(both.argmax())
    top = max(best, int(both[j]))
    if top <= floor:
        return top, -1
    # ties: the first index, as argmax
    candidates = [int(where[j])] if int(both[j]) == top else []
    candidates += [int(dist.argmax())] if best == top else []
    return top, min(candidates)


def _int_numpy(t: torch.Tensor) -> Array:
    return (t.to(torch.uint8) if t.dtype is torch.bool else t).numpy()
