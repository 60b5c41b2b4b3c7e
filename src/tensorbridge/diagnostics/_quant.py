"""quant_report(): what a quantization scheme does to weights, block by block.

Three questions, one report (:class:`QuantReport`, one :class:`QuantWeight` a weight):

* a quantized checkpoint alone: its codes and scales (dtypes, shapes, e8m0 scales
  at the format's limits), the dequantized values' statistics, NaN / inf that
  dequantizing produces, and blocks whose codes reach the format's largest
  magnitude (``inspect --stats``, ``cast-report`` of a quantized file);
* a quantized checkpoint against the unquantized reference: the same, plus each
  block's error (``compare``);
* a plain checkpoint and ``scheme=``: what quantizing it would do, by quantizing
  each weight (:func:`tensorbridge.quantize`) and dequantizing it again
  (``cast-report --scheme``).

A *block* is one element of the scale tensor and the weight values it scales (32
values in MX, 16 in NVFP4, a 128 x 128 tile in fp8-block, a row per channel).
A block's relative error is its largest absolute error divided by its largest
reference magnitude (the scale's own reference point), so a block of near-zero
values does not report huge per-element ratios. Weights are dequantized a piece
(a block row) at a time with the scheme's own kernel, so memory holds a piece and
one float per block, not the weight in float32. The integer schemes (GPTQ, AWQ,
pack-quantized) get statistics and errors per weight, not per block.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..errors import QuantizationError
from ..quant.base import Group, Scheme, as_torch
from ..quant.detect import config_of as quant_config
from ..quant.detect import plan, read_config
from ..quant.registry import SCHEMES, scheme_named
from ._record import Record
from ._stats import Stats, StatsAccumulator
from ._values import source, widened

_E8M0 = ("float8_e8m0fnu",)


@dataclass(frozen=True)
class BlockError(Record):
    """One block's error: ``block`` indexes the weight's scale tensor."""

    tensor: str
    block: tuple[int, ...]
    max_abs_err: float
    max_rel_err: float


@dataclass(frozen=True)
class QuantWeight(Record):
    """One quantized weight: its stored parts, dequantized values and (with a reference)
    errors.

    ``e8m0_min`` / ``e8m0_max`` / ``e8m0_nan`` count scales stored as e8m0 bytes
    0x00 (2**-127), 0xFE (2**127) and 0xFF (NaN); ``None`` for other scale types.
    ``saturated_blocks`` counts blocks with a code at the format's largest magnitude
    (fp8-block and NVFP4 map each block's largest value to it by design; in MX, whose
    power-of-two scales round down, such a block may have been clipped).
    ``nan_produced`` / ``inf_produced`` count NaN / inf in the dequantized values
    where the reference (if any) is finite. Errors are ``None`` without a reference.
    """

    name: str
    scheme: str
    codes: str
    codes_dtype: str
    codes_shape: tuple[int, ...]
    scale: str
    scale_dtype: str
    scale_shape: tuple[int, ...]
    blocks: int | None
    saturated_blocks: int | None
    e8m0_min: int | None
    e8m0_max: int | None
    e8m0_nan: int | None
    nan_produced: int
    inf_produced: int
    stats: Stats
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    worst_blocks: tuple[BlockError, ...] = ()
    problem: str | None = None

    @property
    def ok(self) -> bool:
        """No NaN / inf produced, no NaN scale, and (with a reference) the shapes agree."""
        return not (self.nan_produced or self.inf_produced or self.e8m0_nan or self.problem)


@dataclass(frozen=True)
class QuantReport(Record):
    """A scheme's effect on every quantized weight (see the module docstring).

    ``summary`` is the scheme line (``"mxfp4: 3 quantized weights"``); ``unmatched``
    lists quantized weights the reference lacks; ``worst_blocks`` are the blocks with
    the largest relative error over all weights, worst first; ``ok`` is every
    weight's ``ok`` and no unmatched weight.
    """

    summary: str
    schemes: tuple[str, ...]
    weights: Mapping[str, QuantWeight]
    ok: bool
    unmatched: tuple[str, ...] = ()
    worst_blocks: tuple[BlockError, ...] = ()
    skipped: Mapping[str, str] = field(default_factory=dict)


def quant_report(
    x: Any,
    reference: Any = None,
    *,
    scheme: str | None = None,
    config: Any = None,
    block_size: tuple[int, int] | None = None,
    ignore: Sequence[str] = (),
    worst: int = 5,
    progress: Callable[[str], object] | None = None,
) -> QuantReport:
    """What ``scheme`` does to weights: errors per block, saturated blocks, e8m0 limits.

    ``x`` quantized (a state dict, or a checkpoint path or open file, its scheme from
    ``scheme=``, the config or the names): its weights, compared block by block with
    ``reference`` (the unquantized weights under the same names) when given. ``x``
    plain with ``scheme=``: what quantizing each of its weights would do (the rule
    of ``convert --quantize``: 2-D+ float weights, not embeddings, ``lm_head`` or
    norms, nor names matching ``ignore``).

    >>> import torch, tensorbridge as tb
    >>> w = torch.randn(64, 64)
    >>> r = tb.quant_report({"l.weight": w}, scheme="mxfp4")
    >>> q = r.weights["l.weight"]
    >>> q.blocks, q.nan_produced, q.max_rel_err < 0.5
    (128, 0, True)
    >>> packed = tb.quantize(w, "mxfp4", name="l.weight")
    >>> r2 = tb.quant_report(packed, {"l.weight": w})
    >>> r2.weights["l.weight"].max_abs_err == q.max_abs_err
    True

    Args:
        x: a state dict (flat names to tensors or arrays), a checkpoint path, or an
            open file (``tb.open``).
        reference: the unquantized weights (same kinds as ``x``), or None.
        scheme: the scheme (``mxfp4``, ``nvfp4-modelopt``, ``fp8-block``, ...).
        config: a quantization config, when none is beside ``x``.
        block_size: fp8-block's block (read and quantized with).
        ignore: glob patterns of weights not to quantize (plain ``x`` only).
        worst: how many worst blocks to keep a weight (and overall).
        progress: a callable taking each finished weight's name (progress bars).

    Raises:
        QuantizationError: ``x`` is not quantized and no ``scheme=`` says how to
            quantize it; or its scheme cannot be decided.
    """
    files: list[Any] = []
    try:
        qx, cfg = _as_file(x, files)
        ref = _as_file(reference, files)[0] if reference is not None else None
        cfg = quant_config(config) if config is not None else cfg
        opts = {"block_size": tuple(block_size)} if block_size is not None else {}
        index = {n: _info(qx, n) for n in _names(qx)}
        p = plan(index, cfg, scheme, opts)
        weights: dict[str, QuantWeight] = {}
        unmatched: list[str] = []
        skipped: dict[str, str] = {}
        if p.quantized:
            for g in p.groups:
                s = SCHEMES[g.scheme]
                parts = {role: _value(qx, stored) for role, stored in g.parts.items()}
                r = None
                if ref is not None:
                    if g.name not in _names(ref):
                        unmatched.append(g.name)
                    else:
                        r = _value(ref, g.name)
                weights[g.name] = weight_report(s, g, parts, r, worst=worst)
                if progress is not None:
                    progress(g.name)
            summary, schemes = p.summary(), p.schemes
        elif scheme is None:
            raise QuantizationError(
                "no quantized weights found (no config beside the checkpoint and no "
                "codes + scales names); pass scheme= to see what quantizing would do"
            )
        else:
            weights, skipped = _what_if(qx, index, scheme, block_size, ignore, worst, progress)
            s = scheme_named(scheme)
            summary = f"{s.name}: {len(weights)} weights quantized and dequantized again"
            schemes = (s.name,)
        ranked = sorted(
            (b for w in weights.values() for b in w.worst_blocks), key=lambda b: -b.max_rel_err
        )
        return QuantReport(
            summary=summary,
            schemes=tuple(schemes),
            weights=weights,
            ok=not unmatched and all(w.ok for w in weights.values()),
            unmatched=tuple(unmatched),
            worst_blocks=tuple(ranked[:worst]),
            skipped=skipped,
        )
    finally:
        for f in files:
            f.close()


def _as_file(x: Any, opened: list[Any]) -> tuple[Any, Any]:
    """A readable mapping of ``x`` and the quantization config beside it (if any)."""
    if isinstance(x, (str, os.PathLike)):
        from .. import io as tbio

        f = tbio.open(x)
        opened.append(f)
        return f, read_config(x)
    if isinstance(x, torch.nn.Module):
        return x.state_dict(), None
    if isinstance(x, Mapping) or hasattr(x, "info"):
        return x, read_config(getattr(x, "path", None)) if hasattr(x, "path") else None
    raise TypeError(
        f"quant_report takes a state dict, a path or an open file, got {type(x).__qualname__}"
    )


def _names(f: Any) -> list[str]:
    skip = f.unsupported() if hasattr(f, "unsupported") else {}
    return [n for n in f if n not in skip]


def _value(f: Any, name: str) -> Any:
    """A stored value; an open file's as a mapped (copy-on-write) tensor, not a copy (an
    array where torch has no kernels for its dtype: float8_e4m3, int4, ...)."""
    if not hasattr(f, "info"):
        return f[name]
    return f.get(name, framework="torch" if f.info(name)[0].kernels else "numpy")


def _info(f: Any, name: str) -> Any:
    if hasattr(f, "info"):
        return f.info(name)
    src = source(f[name])
    return src.row, tuple(src.shape)


def _what_if(
    f: Any,
    index: Mapping[str, Any],
    scheme: str,
    block_size: tuple[int, int] | None,
    ignore: Sequence[str],
    worst: int,
    progress: Callable[[str], object] | None,
) -> tuple[dict[str, QuantWeight], dict[str, str]]:
    """Quantize each weight ``convert --quantize`` would, dequantize it, report."""
    from ..quant.api import quantize
    from ..quant.write import skip_reason, writable

    name = writable(scheme)
    s = SCHEMES[name]
    weights, skipped = {}, {}
    for n, (row, shape) in index.items():
        why = skip_reason(n, row, tuple(shape), name, ignore)
        if why is not None:
            skipped[n] = why
            continue
        value = widened(_value(f, n))  # float8_e4m3 -> float32, exactly
        q = quantize(value, name, name=n, block_size=block_size, layout=s.published_layout)
        qindex = {k: _info(q, k) for k in q}
        opts: dict[str, Any] = {"block_size": tuple(block_size or (128, 128))}
        g = next(
            g
            for g in plan(qindex, None, name, opts if s.takes_block_size else {}).groups
            if g.name == n
        )
        parts = {role: q[stored] for role, stored in g.parts.items()}
        weights[n] = weight_report(s, g, parts, value, worst=worst)
        if progress is not None:
            progress(n)
    return weights, skipped


def weight_report(
    scheme: Scheme,
    group: Group,
    parts: Mapping[str, Any],
    reference: Any = None,
    *,
    worst: int = 5,
) -> QuantWeight:
    """One weight's :class:`QuantWeight`, dequantized piece by piece (see the module)."""
    codes_src, scale_src = source(parts["codes"]), source(parts["scale"])
    nblocks = int(np.prod(scale_src.shape, dtype=np.int64))
    blocked = scheme.block_index(group, torch.zeros(1, dtype=torch.int64)) is not None
    limit = scheme.code_max(codes_src.row)
    ref_flat = None
    problem = None
    if reference is not None:
        rs = source(reference)
        if tuple(rs.shape) != tuple(group.shape):
            problem = f"the reference is {list(rs.shape)}, the weight {list(group.shape)}"
        else:
            ref_flat = as_torch(widened(reference)).reshape(-1)
    acc = StatsAccumulator()
    errors = _Errors.of(nblocks if blocked else None)
    nan = inf = 0
    saturated = torch.zeros(nblocks if blocked and limit else 0, dtype=torch.bool)
    at = 0
    for piece in scheme.pieces(group, parts):
        tp = {k: as_torch(v) for k, v in piece.items()}
        values = scheme.kernel(tp, group).reshape(-1)
        n = values.numel()
        acc.add(values)
        ids = scheme.block_index(group, torch.arange(at, at + n)) if blocked else None
        bad_nan, bad_inf = values.isnan(), values.isinf()
        if ref_flat is not None:  # only where the reference is finite
            finite = errors.add(values, ref_flat[at : at + n].to(torch.float64), ids)
            bad_nan, bad_inf = bad_nan & finite, bad_inf & finite
        nan += int(torch.count_nonzero(bad_nan))
        inf += int(torch.count_nonzero(bad_inf))
        if ids is not None and limit is not None:
            unit = {k: _unit(k, v, group.scheme) for k, v in tp.items()}
            codes = scheme.kernel(unit, group).reshape(-1)
            saturated[ids[codes.abs() >= limit]] = True
        at += n
    e8m0 = _e8m0_counts(parts["scale"], scale_src.row.name, scheme.e8m0_scales)
    rel, blocks = (None, ()) if ref_flat is None else errors.worst(group, scale_src.shape, worst)
    return QuantWeight(
        name=group.name,
        scheme=group.scheme,
        codes=group.parts["codes"],
        codes_dtype=codes_src.row.name,
        codes_shape=tuple(codes_src.shape),
        scale=group.parts["scale"],
        scale_dtype=scale_src.row.name,
        scale_shape=tuple(scale_src.shape),
        blocks=nblocks if blocked else None,
        saturated_blocks=int(saturated.sum()) if blocked and limit else None,
        e8m0_min=e8m0[0] if e8m0 else None,
        e8m0_max=e8m0[1] if e8m0 else None,
        e8m0_nan=e8m0[2] if e8m0 else None,
        nan_produced=nan,
        inf_produced=inf,
        stats=acc.result("float32"),
        max_abs_err=errors.max_abs if ref_flat is not None else None,
        max_rel_err=rel,
        worst_blocks=blocks,
        problem=problem,
    )


@dataclass
class _Errors:
    """A weight's errors against its reference, piece by piece: the largest absolute
    error and reference magnitude, and per block (``block_err`` / ``block_ref``: empty
    where the scheme's scales are no grid over the weight)."""

    block_err: torch.Tensor
    block_ref: torch.Tensor
    blocked: bool
    max_abs: float = 0.0
    ref_max: float = 0.0

    @classmethod
    def of(cls, blocks: int | None) -> _Errors:
        """No errors yet, of ``blocks`` blocks (``None``: the scales are no grid)."""
        err = torch.zeros(blocks or 0, dtype=torch.float64)
        return cls(err, torch.zeros_like(err), blocks is not None)

    def add(self, values: torch.Tensor, r: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
        """One piece's ``values`` against its reference ``r`` (float64); ``ids``: each
        value's block. Returns where the reference is finite."""
        rfin = r.isfinite()
        err = (values.to(torch.float64) - r).abs_()
        err = torch.where(err.isfinite(), err, torch.zeros_like(err))
        if values.numel():
            self.max_abs = max(self.max_abs, float(err.max()))
            self.ref_max = max(self.ref_max, float(torch.where(rfin, r.abs(), 0.0).max()))
        if ids is not None:
            mag = torch.where(rfin, r.abs(), torch.zeros_like(r))
            self.block_err.scatter_reduce_(0, ids, err, "amax")
            self.block_ref.scatter_reduce_(0, ids, mag, "amax")
        return rfin

    def worst(
        self, group: Group, grid: tuple[int, ...], worst: int
    ) -> tuple[float, tuple[BlockError, ...]]:
        """The largest relative error (per block where there are blocks: the block's
        largest error over its largest reference magnitude) and the ``worst`` blocks."""
        if not self.blocked:  # no grid: the weight as a whole
            rel = self.max_abs / self.ref_max if self.ref_max else (1.0 if self.max_abs else 0.0)
            return rel, ()
        nblocks = self.block_err.numel()
        if not nblocks:  # an empty weight
            return 0.0, ()
        err, ref = self.block_err, self.block_ref
        ratio = torch.where(ref > 0, err / ref, torch.where(err > 0, 1.0, 0.0))
        top = torch.topk(ratio, min(worst, nblocks)).indices.tolist()
        blocks = tuple(
            BlockError(
                group.name,
                tuple(int(i) for i in np.unravel_index(b, grid)),
                float(err[b]),
                float(ratio[b]),
            )
            for b in top
        )
        return float(ratio.max()), blocks


def _unit(role: str, t: torch.Tensor, scheme: str) -> torch.Tensor:
    """A part with every scale 1 (e8m0 byte 127), so the kernel gives the codes' values."""
    if role not in ("scale", "global_scale"):
        return t
    if t.dtype == torch.uint8 or t.dtype in (getattr(torch, n, None) for n in _E8M0):
        return torch.full(t.shape, 127, dtype=torch.uint8).view(t.dtype)
    return torch.ones(t.shape, dtype=t.dtype)


def _e8m0_counts(scale: Any, dtype: str, e8m0_bytes: bool) -> tuple[int, int, int] | None:
    """Scales at 0x00, 0xFE and 0xFF, when they are e8m0 (F8_E8M0, or U8 bytes of a
    scheme whose U8 scales are e8m0 exponents: MX)."""
    if dtype not in _E8M0 and not (dtype == "uint8" and e8m0_bytes):
        return None
    if isinstance(scale, torch.Tensor):
        b = scale.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    else:
        b = np.ascontiguousarray(scale).reshape(-1).view(np.uint8)
    counts = np.bincount(b, minlength=256)
    return int(counts[0]), int(counts[0xFE]), int(counts[0xFF])
