"""``tb.dequantize`` / ``tb.quantize`` and the dequantizing view of a checkpoint file.

* :func:`dequantize` takes codes and scales (tensors or arrays) with ``scheme=``, or a
  whole state dict / tree, whose scheme comes from ``config=`` or the tensors.
* :func:`quantize` writes one weight in the MX formats, NVFP4 or fp8 block-wise, under
  the stored names of the scheme's layout.
* :class:`DequantizedFile` is what ``tb.open(path, dequantize=...)`` returns: the
  unquantized model's names and shapes, each weight computed when read; for a
  streamed save, :meth:`DequantizedFile.stream_value` gives a
  :class:`~tensorbridge._tensorfile.Deferred` whose tasks (a few block rows each)
  worker threads compute while the writer writes the chunk before.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from .. import _quantized as quantized
from .._keys import flatten
from .._pipeline import Slot, Task
from .._tensorfile import Deferred, TensorFile, row_of
from ..convert import to_numpy, to_torch
from ..dtypes import DTypeLike, DTypeRow, resolve_dtype
from ..errors import QuantizationError, UnsupportedTensorError
from . import base
from .base import Group, Index, Scheme, as_torch
from .detect import Plan, config_of, plan, read_config
from .gptq import checkpoint_format as gptq_format
from .registry import SCHEMES, scheme_named

__all__ = ["DequantizedFile", "DequantizedTensor", "dequantize", "quantize"]


def _float_row(dtype: DTypeLike) -> DTypeRow:
    row = resolve_dtype(dtype)
    if not row.is_floating or row.itemsize < 2:
        raise QuantizationError(
            f"dequantize to {row.name}? pass a 16- or 32-bit float: 'bfloat16', 'float16' "
            "or 'float32'"
        )
    return row


def _options(block_size: Any, layout: str | None, element: str | None) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if block_size is not None:
        opts["block_size"] = tuple(int(b) for b in block_size)
    if layout is not None:
        opts["layout"] = layout
    if element is not None:
        opts["element"] = element
    return opts


def dequantize(
    x: Any,
    scale: Any = None,
    *,
    global_scale: Any = None,
    zeros: Any = None,
    g_idx: Any = None,
    scheme: str | None = None,
    dtype: DTypeLike = "bfloat16",
    config: Any = None,
    block_size: tuple[int, int] | None = None,
    layout: str | None = None,
    bits: int | None = None,
    group_size: int | None = None,
) -> Any:
    """Dequantize codes and scales, or every quantized weight of a state dict.

    One weight: ``dequantize(codes, scale, scheme=..., [global_scale=...])``; the
    result is a tensor if ``codes`` is one, else a NumPy (ml_dtypes) array. A
    quantized tensor subclass (torchao's ``MXTensor``, ``NVFP4Tensor``, ...) alone:
    ``dequantize(x, dtype=...)``, as ``tb.to_torch(x, dtype=...)``. A state
    dict, module or nested mapping: ``dequantize(sd, config=...)`` returns a flat
    ``{name: value}`` under the unquantized model's names, weights dequantized,
    everything else passed through as it was, activation scales left out.

    The value is code x scale computed in float32 and rounded once to ``dtype``.

    >>> import torch, tensorbridge as tb
    >>> w = torch.randn(256, 256)
    >>> q = tb.quantize(w, "fp8-block")
    >>> sorted(q)
    ['weight', 'weight_scale_inv']
    >>> back = tb.dequantize(q["weight"], q["weight_scale_inv"], scheme="fp8-block",
    ...                      block_size=(128, 128), dtype="float32")
    >>> bool((back - w).abs().max() < 0.07 * w.abs().max())
    True

    Args:
        x: codes (tensor or array), or a state dict / tree of them.
        scale: the scales, for one weight.
        global_scale: NVFP4's global scale, for one weight.
        zeros: the packed zero points of ``gptq`` / ``awq`` / ``pack-quantized``.
        g_idx: each input row's group (GPTQ act-order), for one weight.
        scheme: one of ``fp8-block``, ``fp8``, ``mxfp8``, ``mxfp4``,
            ``nvfp4-modelopt``, ``nvfp4-compressed-tensors``, ``gptq``, ``awq``,
            ``pack-quantized``; for a tree it overrides the config.
        dtype: the result's dtype (bfloat16, float16, float32).
        config: a tree's quantization config (the ``quantization_config`` dict, a
            whole ``config.json`` dict, or a path).
        block_size: fp8-block's ``[rows, cols]`` block, when no config gives it.
        layout: ``"gpt-oss"`` for MXFP4 ``_blocks`` / ``_scales`` (the result is
            transposed to the model's ``[E, in, out]``).
        bits, group_size: the integer schemes' code width and group, when no config
            gives them.

    Raises:
        QuantizationError: an unknown, ambiguous or inconsistent scheme or layout.
    """
    row = _float_row(dtype)
    opts = _options(block_size, layout, None)
    opts.update({k: v for k, v in (("bits", bits), ("group_size", group_size)) if v is not None})
    if scale is None and _is_subclass(x):  # torchao's MXTensor, ...: it knows its scheme
        return to_torch(x, dtype=row.torch)
    if isinstance(x, (torch.Tensor, np.ndarray)):
        parts = {"codes": x, "scale": scale, "global_scale": global_scale}
        parts.update(zeros=zeros, g_idx=g_idx)
        given = {k: v for k, v in parts.items() if v is not None}
        return _dequantize_weight(given, scheme, config, opts, row)
    return _dequantize_tree(x, scheme, config, opts, row)


def _dequantize_weight(
    values: dict[str, Any], scheme: str | None, config: Any, opts: dict[str, Any], row: DTypeRow
) -> Any:
    """One weight's parts by role, given as tensors or arrays, dequantized: a tensor if
    the codes are one, else an array."""
    if scheme is None:
        raise QuantizationError(
            "dequantize(codes, scale) needs scheme= (one of "
            f"{', '.join(SCHEMES)}); a state dict can be detected from its names"
        )
    s = scheme_named(scheme)
    cfg = config_of(config)
    if cfg is not None:  # what a config says about one weight, under option names
        said = {
            "bits": cfg.data.get("bits"),
            "group_size": cfg.data.get("group_size"),
            "format": gptq_format(cfg.data)
            if s.name == "gptq"
            else cfg.data.get("checkpoint_format"),
            "block_size": cfg.data.get("weight_block_size"),
        }
        opts = {**{k: v for k, v in said.items() if v is not None}, **opts}
    index: dict[str, tuple[DTypeRow, tuple[int, ...]]] = {
        role: (_stored_row(v), tuple(v.shape)) for role, v in values.items()
    }
    if "scale" not in values:
        raise QuantizationError(f"{s.name} needs the scales: pass dequantize(codes, scale, ...)")
    group = s.make_group("weight", {r: r for r in values}, index, opts)
    out = s.dequantize({r: _host(v) for r, v in values.items()}, group, row.torch)
    return out if isinstance(values["codes"], torch.Tensor) else to_numpy(out)


def _dequantize_tree(
    x: Any, scheme: str | None, config: Any, opts: dict[str, Any], row: DTypeRow
) -> dict[str, Any]:
    """A state dict, module or nested mapping dequantized: flat, under the unquantized
    model's names (the scheme from ``scheme``, the config or the names)."""
    if isinstance(x, torch.nn.Module):
        x = x.state_dict()
    if not isinstance(x, (Mapping, list, tuple)):
        raise UnsupportedTensorError(
            f"dequantize expects codes (a tensor or array) or a state dict of them, got "
            f"{type(x).__qualname__}; pass torch.as_tensor(codes) with scale= and scheme="
        )
    flat = (
        flatten(x, where="dequantize")
        if not isinstance(x, Mapping)
        or any(not isinstance(v, (torch.Tensor, np.ndarray)) for v in x.values())
        else dict(x)
    )
    for name, v in flat.items():
        if not isinstance(v, (torch.Tensor, np.ndarray)):
            raise UnsupportedTensorError(
                f"at {name!r}: dequantize expects tensors or arrays, got "
                f"{type(v).__qualname__}; pass torch.as_tensor(x) for each leaf"
            )
    tree_index = {n: (_stored_row(v), tuple(v.shape)) for n, v in flat.items()}
    p = plan(tree_index, config_of(config), scheme, opts)
    result: dict[str, Any] = {}
    for name in p.names:
        g = p.group(name)
        if g is None:
            v = flat[name]
            result[name] = to_torch(v, dtype=row.torch) if _is_subclass(v) else v
            continue
        parts = {role: _host(flat[stored]) for role, stored in g.parts.items()}
        out = SCHEMES[g.scheme].dequantize(parts, g, row.torch)
        result[name] = out if isinstance(flat[g.parts["codes"]], torch.Tensor) else to_numpy(out)
    return result


def _is_subclass(x: Any) -> bool:
    """A quantized tensor subclass (torchao's ``MXTensor``, ...): dequantized by its kind."""
    return type(x) is not torch.Tensor and quantized.kind_of(x) is not None


def _stored_row(v: Any) -> DTypeRow:
    if isinstance(v, torch.Tensor) and v.dtype == getattr(torch, "float4_e2m1fn_x2", None):
        return resolve_dtype("uint8")  # packed two a byte, as a U8 checkpoint stores them
    if isinstance(v, np.ndarray) and v.dtype.name == "float4_e2m1fn":
        from .._packed import PSEUDO_ROWS
        from ..dtypes import PACKED

        return PSEUDO_ROWS[PACKED[0]]
    return row_of(v)


def _host(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        if v.dtype == getattr(torch, "float4_e2m1fn_x2", None):
            v = v.view(torch.uint8)
        return v.detach().cpu()
    return v


def quantize(
    x: Any,
    scheme: str,
    *,
    name: str = "weight",
    block_size: tuple[int, int] | None = None,
    element: str | None = None,
    layout: str | None = None,
) -> dict[str, Any]:
    """Quantize one weight; returns its stored tensors by name, in the scheme's layout.

    ``fp8-block`` (transformers' ``Fp8Quantize``: ``name`` + ``name_scale_inv``),
    ``mxfp8`` / ``mxfp4`` (torchao's ``to_mx``, FLOOR scales: ``name`` +
    ``name_scale`` as ``float8_e8m0fnu``; ``layout="gpt-oss"``: ``name_blocks`` +
    ``name_scales`` from an ``[E, in, out]`` weight; ``layout="compressed-tensors"``:
    llm-compressor's ``name`` (mxfp8) or ``name_packed`` (mxfp4) + ``name_scale`` as
    ``uint8`` exponents), ``nvfp4-modelopt`` /
    ``nvfp4-compressed-tensors`` (torchao's ``nvfp4_quantize``). Arrays in, arrays out.

    >>> import torch, tensorbridge as tb
    >>> q = tb.quantize(torch.randn(4, 64), "mxfp4", name="w")
    >>> {k: (tuple(v.shape), str(v.dtype)) for k, v in q.items()}
    {'w': ((4, 32), 'torch.uint8'), 'w_scale': ((4, 2), 'torch.float8_e8m0fnu')}
    """
    s = scheme_named(scheme)
    if not s.writes:
        s.quantize(torch.empty(0))  # raises the scheme's own refusal
    suffixes = s.role_suffixes(layout)
    parts = s.quantize(as_torch(x), **_options(block_size, layout, element))
    out: dict[str, Any] = {name + suffixes[role]: v for role, v in parts.items()}
    if isinstance(x, np.ndarray):
        return {k: to_numpy(v) for k, v in out.items()}
    return out


class DequantizedTensor(Deferred):
    """One dequantized weight, computed a few pieces (block rows) at a time as it is written."""

    def __init__(
        self, scheme: Scheme, group: Group, parts: Mapping[str, Any], row: DTypeRow
    ) -> None:
        self.scheme, self.group, self.parts, self.row = scheme, group, parts, row
        self.shape = group.shape

    def tasks(self, chunk_bytes: int) -> Iterator[Task]:
        """Runs of consecutive pieces, about ``chunk_bytes`` of output each; a task rounds
        each piece's float32 values straight into its slot (the one rounding, no other
        copy), so the writer writes the slot as it is."""
        parts = {k: as_torch(v) for k, v in self.parts.items()}
        per_task = max(1, chunk_bytes // (base.PIECE_ELEMENTS * self.row.itemsize))
        pieces = self.scheme.pieces(self.group, parts)
        while run := list(itertools.islice(pieces, per_task)):
            yield functools.partial(self.fill, run)

    def fill(self, run: list[dict[str, torch.Tensor]], slot: Slot) -> memoryview:
        """Dequantize ``run``'s pieces one after another into ``slot``; their bytes."""
        at = 0
        buf = slot.reserve(len(run) * base.PIECE_ELEMENTS * self.row.itemsize)
        for piece in run:
            values = self.scheme.kernel(piece, self.group).reshape(-1)
            end = at + values.numel() * self.row.itemsize
            buf = slot.reserve(end, keep=at)
            torch.from_numpy(buf[at:end]).view(self.row.torch).copy_(values)
            at = end
        return buf[:at].data

    def materialize(self) -> torch.Tensor:
        return self.scheme.dequantize(self.parts, self.group, self.row.torch)


class DequantizedFile(TensorFile):
    """A checkpoint read as its unquantized model: weights dequantized when read.

    ``keys()`` are the unquantized model's names (gpt-oss ``...gate_up_proj``, not
    ``..._blocks``), ``info`` its dtypes and shapes, ``plan`` what was decided.
    Tensors that are not quantized are the source's own arrays (bit-exact, mapped).
    """

    def __init__(
        self,
        src: TensorFile,
        dtype: DTypeLike,
        *,
        scheme: str | None = None,
        config: Any = None,
        block_size: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        self.src = src
        self.row = _float_row(dtype)
        self.path = getattr(src, "path", None)
        self.follow_links = src.follow_links
        cfg = (
            config_of(config)
            if config is not None
            else read_config(self.path, follow_links=src.follow_links)
        )
        skip = src.unsupported()
        index: Index = {n: src.info(n) for n in src if n not in skip}
        self.plan: Plan = plan(index, cfg, scheme, _options(block_size, None, None))
        self.metadata = dict(src.metadata)
        self.notes = list(src.notes)
        if self.plan.quantized:
            self.notes.append(f"dequantized to {self.row.name}: {self.plan.summary()}")

    def keys(self) -> list[str]:
        return list(self.plan.names)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (
            self.plan.group(name) is not None or name in self.plan.passthrough
        )

    def info(self, name: str) -> tuple[DTypeRow, tuple[int, ...]]:
        g = self.plan.group(name)
        return (self.row, g.shape) if g is not None else self.src.info(name)

    def stream_value(self, name: str) -> Any:
        """``name`` as a writer streams it: a :class:`DequantizedTensor`, or the mapped array."""
        g = self.plan.group(name)
        if g is None:
            return self.src.stored_array(name, copy_on_write=False)
        # copy-on-write maps: torch shares them without a copy, and nothing writes them
        parts = {
            role: self.src.stored_array(stored, copy_on_write=True)
            for role, stored in g.parts.items()
        }
        SCHEMES[g.scheme].check_values(g, parts, str(self.path))
        return DequantizedTensor(SCHEMES[g.scheme], g, parts, self.row)

    def _array(self, name: str, *, copy_on_write: bool) -> np.ndarray:
        value = self.stream_value(name)
        if isinstance(value, DequantizedTensor):
            dequantized: np.ndarray = to_numpy(value.materialize())
            return dequantized
        out: np.ndarray = self.src.stored_array(name, copy_on_write=copy_on_write)
        return out

    def close(self) -> None:
        self.src.close()

    def __repr__(self) -> str:
        return f"<DequantizedFile {self.src!r}: {self.plan.summary()}>"
