"""Writing a checkpoint quantized (``convert --quantize``): which weights, names, config.

Which weights are quantized follows the toolkits' defaults (llm-compressor's
``targets: ["Linear"], ignore: ["lm_head"]``, torchao's ``quantize_`` filter on
``nn.Linear``, ModelOpt's excluded ``lm_head``): floating-point tensors of two or
more dimensions whose name ends in ``weight``, except those matching
:data:`DEFAULT_IGNORE` (embeddings, ``lm_head``, norms) or a caller's ``ignore``
pattern. A weight whose rows do not fit the scheme's blocks (MX: a multiple of 32
values; NVFP4: of 16) is left as stored and listed. Everything else (biases, norms,
integer tensors) is copied bit for bit.

Each quantized weight is written in the layout of the toolkit that publishes it:

==============================  =========================================================
scheme                          stored tensors, config
==============================  =========================================================
``fp8-block``                   ``W`` F8_E4M3, ``W_scale_inv`` F32 (DeepSeek-V3);
                                ``quant_method: "fp8"``, ``weight_block_size``
``mxfp8``                       ``W`` F8_E4M3, ``W_scale`` U8 e8m0 exponents
                                (compressed-tensors ``mxfp8-quantized``)
``mxfp4``                       ``W_packed`` U8, ``W_scale`` U8 e8m0 exponents
                                (compressed-tensors ``mxfp4-pack-quantized``)
``nvfp4-modelopt``              ``W`` U8, ``W_scale`` F8_E4M3, ``W_scale_2`` F32;
                                ``quant_method: "modelopt"``, ``quant_algo: "NVFP4"``
``nvfp4-compressed-tensors``    ``W_packed`` U8, ``W_scale`` F8_E4M3,
                                ``W_global_scale`` F32 (``nvfp4-pack-quantized``)
``mxfp4``, ``layout="gpt-oss"``  ``E.gate_up_proj_blocks`` U8 ``[E, out, in / 32, 16]``,
                                ``E.gate_up_proj_scales`` U8 e8m0 exponents
                                (openai/gpt-oss-20b); ``quant_method: "mxfp4"``,
                                ``modules_to_not_convert``
==============================  =========================================================

MXFP8 takes ``element="e5m2"`` (codes ``F8_E5M2``, same names): compressed-tensors'
config has no field for the fp8 element type (its ``num_bits: 8, type: float`` means
e4m3 when it quantizes); its decompressor, like tensorbridge, takes the codes' type
from the safetensors header.

The gpt-oss layout quantizes what transformers' ``Mxfp4GptOssExperts`` holds: the
3-D ``...experts.gate_up_proj`` / ``...experts.down_proj`` tensors (``[E, in, out]``,
stored transposed as blocks); everything else, biases included, is copied.

The values are those of :func:`tensorbridge.quantize`, computed a slice of rows at a
time as the writer pulls them (:class:`QuantizedPart`): memory holds one slice.
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from .._pipeline import Slot, Task
from .._tensorfile import Deferred
from ..convert import to_numpy
from ..dtypes import DTypeRow
from ..errors import QuantizationError
from . import base
from .base import as_torch, require, row_pieces
from .mx import GPT_OSS_NOT_CONVERTED
from .registry import SCHEMES, scheme_named

__all__ = [
    "DEFAULT_IGNORE",
    "GPT_OSS_NOT_CONVERTED",
    "LAYOUTS",
    "OTHER_LAYOUTS",
    "QuantizedPart",
    "config_caveat",
    "quantization_config",
    "quantized_parts",
    "skip_reason",
    "stored_layout",
    "unconverted_modules",
    "writable",
]

# names no toolkit quantizes by default: embeddings, the output head, norms
DEFAULT_IGNORE = ("*embed*", "*lm_head*", "*norm*")
# scheme -> tb.quantize's layout= for the published layout convert writes (each
# scheme's ``published_layout``; the schemes that write are those ``convert`` takes)
LAYOUTS: dict[str, str | None] = {s.name: s.published_layout for s in SCHEMES.values() if s.writes}
# scheme -> the other layouts ``convert --quantize SCHEME --layout L`` writes
OTHER_LAYOUTS: dict[str, tuple[str, ...]] = {
    s.name: s.other_layouts for s in SCHEMES.values() if s.writes and s.other_layouts
}
_GPT_OSS_PROJECTIONS = ("experts.gate_up_proj", "experts.down_proj")


def writable(
    scheme: str,
    layout: str | None = None,
    element: str | None = None,
    block_size: tuple[int, int] | None = None,
) -> str:
    """The canonical name of a scheme :func:`tensorbridge.quantize_checkpoint` writes,
    checked against ``layout=``, ``element=`` and ``block_size=``, or QuantizationError.

    The messages name the Python arguments; the command line says them as its options
    (``scheme=`` is ``--quantize``: ``cli/_quantize.py``).

    >>> writable("mxfp4", "gpt-oss"), writable("mxfp8", element="e5m2")
    ('mxfp4', 'mxfp8')
    """
    s = scheme_named(scheme)
    if s.name not in LAYOUTS:
        raise QuantizationError(
            f"scheme={scheme!r}: tensorbridge dequantizes {s.name} but does not write it; "
            f"pass one of {', '.join(LAYOUTS)}"
        )
    others = OTHER_LAYOUTS.get(s.name, ())
    if layout is not None and layout != LAYOUTS[s.name] and layout not in others:
        with_layouts = [f"{k} ({', '.join(v)})" for k, v in OTHER_LAYOUTS.items()]
        raise QuantizationError(
            f"layout={layout!r}: {s.name} is written in its published layout only; leave "
            f"out layout= (other layouts: {', '.join(with_layouts)})"
            if not others
            else f"layout={layout!r}: {s.name} is written as {LAYOUTS[s.name]} (the default) "
            f"or {' or '.join(others)}; pass one of those"
        )
    if element is not None:
        require(
            bool(s.elements),
            f"element={element!r}: the element type is mxfp8's choice (e4m3 or e5m2); "
            f"{s.name}'s is fixed, leave out element=",
        )
        require(
            element in s.elements,
            f"element={element!r}: mxfp8's elements are e4m3 (float8_e4m3fn, the default) "
            "or e5m2 (float8_e5m2); pass one of those",
        )
    if block_size is not None and not s.takes_block_size:
        raise QuantizationError(
            f"block_size= is fp8-block's; {s.name} has fixed blocks (leave out block_size=)"
        )
    return s.name


def config_caveat(scheme: str, element: str | None = None) -> str | None:
    """What the written config cannot say, for a note beside the output (None: nothing).

    >>> config_caveat("mxfp8", "e5m2").split(";")[0]
    "compressed-tensors' config has no field for the element type and means e4m3"
    >>> config_caveat("mxfp8") is None
    True
    """
    return SCHEMES[scheme].config_caveat(element)


def _layout(scheme: str, layout: str | None) -> str | None:
    """The layout written: ``layout``, else the scheme's published one."""
    return LAYOUTS.get(scheme) if layout is None else layout


def skip_reason(
    name: str,
    row: DTypeRow,
    shape: tuple[int, ...],
    scheme: str,
    ignore: Sequence[str] = (),
    *,
    layout: str | None = None,
) -> str | None:
    """Why ``name`` is left as stored when quantizing with ``scheme`` (None: it is quantized).

    A reason starting ``"not a "`` means the tensor is no candidate at all (a bias, a
    norm); the others are weights left out, which the config lists.

    >>> from tensorbridge.dtypes import resolve_dtype
    >>> bf16 = resolve_dtype("bfloat16")
    >>> skip_reason("model.layers.0.mlp.up_proj.weight", bf16, (64, 64), "mxfp4") is None
    True
    >>> skip_reason("model.embed_tokens.weight", bf16, (64, 64), "mxfp4")
    'matches *embed*'
    """
    if layout == "gpt-oss":
        if row.category != "float" or len(shape) != 3 or not name.endswith(_GPT_OSS_PROJECTIONS):
            return "not a gpt-oss expert projection (3-D ...experts.gate_up_proj / down_proj)"
    elif row.category != "float" or len(shape) < 2 or not name.endswith("weight"):
        return "not a floating-point weight of 2 or more dimensions"
    for pattern in (*DEFAULT_IGNORE, *ignore):
        if fnmatch.fnmatchcase(name, pattern):
            return f"matches {pattern}"
    if layout == "gpt-oss" and shape[-2] % 32:
        return (
            f"{shape[-2]} inputs (the [E, in, out] weight's middle axis) are not a multiple "
            "of mxfp4's 32-value blocks"
        )
    block = SCHEMES[scheme].row_block
    if block and shape[-1] % block:
        return f"rows of {shape[-1]} values are not a multiple of {scheme}'s {block}-value blocks"
    return None


def stored_layout(
    name: str,
    shape: tuple[int, ...],
    scheme: str,
    block_size: tuple[int, int] | None = None,
    *,
    layout: str | None = None,
    element: str | None = None,
) -> dict[str, tuple[str, DTypeRow, tuple[int, ...]]]:
    """The stored tensors one weight quantizes into (name -> role, dtype row, shape), from
    its shape alone: a streaming writer needs them for the header before any value
    (the scheme's :meth:`~tensorbridge.quant.base.Scheme.stored`).

    >>> {k: (r, row.name, s) for k, (r, row, s) in stored_layout("w", (8, 64), "mxfp4").items()}
    {'w_packed': ('codes', 'uint8', (8, 32)), 'w_scale': ('scale', 'uint8', (8, 2))}
    >>> sorted(stored_layout("e.down_proj", (4, 64, 96), "mxfp4", layout="gpt-oss").items())[0]
    ('e.down_proj_blocks', ('codes', DTypeRow(uint8), (4, 96, 2, 16)))
    """
    s = SCHEMES[scheme]
    return s.stored(name, shape, block_size=block_size, layout=layout, element=element)


class QuantizedPart(Deferred):
    """One stored tensor (codes, scales, global scale) of a weight quantized as it is written.

    The weight is read (mapped) and quantized a slice of rows at a time, whole block
    rows for fp8-block: every scheme written here quantizes rows independently (NVFP4
    given the whole weight's ``amax``, found in a first pass), so the slices' codes and
    scales are those of :func:`~tensorbridge.quantize` on the whole weight, and memory
    holds one slice, whatever the weight's size. A weight with two or three stored
    tensors is read that many times.
    """

    def __init__(
        self,
        load: Callable[[], Any],
        scheme: str,
        role: str,
        row: DTypeRow,
        shape: tuple[int, ...],
        block_size: tuple[int, int] | None = None,
        *,
        layout: str | None = None,
        element: str | None = None,
    ) -> None:
        self.load, self.scheme, self.role, self.block_size = load, scheme, role, block_size
        self.row, self.shape = row, shape
        self.layout, self.element = _layout(scheme, layout), element

    def pieces(self) -> Iterator[tuple[torch.Tensor, dict[str, Any]]]:
        """Each slice of the weight with the options that quantize it, in C order; each
        slice quantizes on its own (the tasks of :meth:`tasks` run side by side)."""
        w = as_torch(self.load())
        opts: dict[str, Any] = {"scales_only": self.role != "codes"}
        if self.element is not None:
            opts["element"] = self.element
        if self.layout == "gpt-oss":
            yield from self.gpt_oss_pieces(w, opts)
            return
        s = SCHEMES[self.scheme]
        block_rows = (self.block_size or (128, 128))[0] if s.takes_block_size else 1
        *lead, rows, cols = w.shape
        if s.takes_block_size:
            opts["block_size"] = self.block_size or (128, 128)
        if self.layout is not None:
            opts["layout"] = self.layout
        if s.per_tensor_amax:
            amax = torch.zeros((), dtype=torch.float32)
            for idx, r0, r1 in row_pieces(tuple(lead), rows, cols, 1):
                at: tuple[Any, ...] = (*idx, slice(r0, r1))
                part = w[at].to(torch.float32)
                amax = torch.maximum(amax, part.abs().amax())
            opts["amax"] = amax
        # whole block rows (fp8-block's tiles are block_rows high), about a piece's values
        per = max(block_rows, base.PIECE_ELEMENTS // max(1, cols) // block_rows * block_rows)
        for idx in np.ndindex(*lead):
            for r0 in range(0, rows, per):
                rows_at: tuple[Any, ...] = (*idx, slice(r0, r0 + per))
                yield w[rows_at], opts
                if self.role == "global_scale":
                    return  # one value for the whole weight

    def gpt_oss_pieces(
        self, w: torch.Tensor, opts: dict[str, Any]
    ) -> Iterator[tuple[torch.Tensor, dict[str, Any]]]:
        """gpt-oss blocks ``[E, out, G, 16]`` hold the transpose of the ``[E, in, out]``
        weight: each slice is a run of output columns of one expert (all of its inputs)."""
        *lead, k_in, out = w.shape
        per = max(1, base.PIECE_ELEMENTS // max(1, k_in))
        opts = {**opts, "layout": "gpt-oss"}
        for idx in np.ndindex(*lead):
            for c0 in range(0, out, per):
                cols: tuple[Any, ...] = (*idx, slice(None), slice(c0, c0 + per))
                yield w[cols], opts

    def tasks(self, chunk_bytes: int) -> Iterator[Task]:
        """One task a slice: quantized by a worker thread into its slot while the writer
        writes the slice before (:mod:`tensorbridge._pipeline`)."""
        for rows, opts in self.pieces():
            yield functools.partial(self.fill, rows, opts)

    def fill(self, rows: torch.Tensor, opts: dict[str, Any], slot: Slot) -> memoryview:
        """Quantize one slice into ``slot``; its bytes of this part."""
        part = self.quantize_rows(rows, opts)[self.role].contiguous()
        raw = to_numpy(part).reshape(-1).view(np.uint8)
        buf = slot.reserve(raw.size)
        buf[: raw.size] = raw
        return buf[: raw.size].data

    def quantize_rows(self, rows: torch.Tensor, opts: dict[str, Any]) -> dict[str, torch.Tensor]:
        """One slice's parts by role, in the written layout (compressed-tensors: U8 e8m0)."""
        return SCHEMES[self.scheme].quantize(rows, **opts)


def quantized_parts(
    name: str,
    load: Callable[[], Any],
    shape: tuple[int, ...],
    scheme: str,
    block_size: tuple[int, int] | None = None,
    *,
    layout: str | None = None,
    element: str | None = None,
) -> dict[str, QuantizedPart]:
    """The stored tensors of one weight, by name, each computed as it is written."""
    kw: dict[str, Any] = {"layout": layout, "element": element}
    stored = stored_layout(name, shape, scheme, block_size, **kw)
    return {
        k: QuantizedPart(load, scheme, role, row, shp, block_size, **kw)
        for k, (role, row, shp) in stored.items()
    }


def unconverted_modules(
    left: Sequence[str], quantized: Sequence[str], *, layout: str | None = None
) -> list[str]:
    """The modules a loader must leave unquantized, from the weights left as stored
    (``left``) and those quantized, as the written layout's config names them.

    gpt-oss converts a whole experts module (both projections) or none of it, so an
    experts module with one projection left out is refused.

    >>> unconverted_modules(["lm_head.weight"], ["a.weight"])
    ['lm_head']
    """
    if layout != "gpt-oss":
        return [n[: -len(".weight")] if n.endswith(".weight") else n for n in left]
    modules = {n.rsplit(".", 1)[0] for n in quantized}
    for n in left:
        module = n.rsplit(".", 1)[0]
        if module in modules:
            raise QuantizationError(
                f"{n} is left unquantized but {module}'s other projection is not: "
                "transformers' gpt-oss MXFP4 loader converts a whole experts module; "
                f"ignore both (ignore=['{module}.*']) or neither"
            )
    return sorted({n.rsplit(".", 1)[0] for n in left})


def quantization_config(
    scheme: str,
    block_size: tuple[int, int] | None,
    ignored: Sequence[str],
    *,
    layout: str | None = None,
) -> dict[str, Any]:
    """The ``quantization_config`` a loader reads the written layout from.

    ``ignored``: the modules left unquantized (``lm_head``, ...), listed as each
    toolkit lists them (gpt-oss: added to its own ``modules_to_not_convert``).

    >>> quantization_config("fp8-block", (128, 128), [])["weight_block_size"]
    [128, 128]
    >>> quantization_config("mxfp4", None, [], layout="gpt-oss")["quant_method"]
    'mxfp4'
    """
    return SCHEMES[scheme].written_config(block_size, sorted(ignored), layout)
