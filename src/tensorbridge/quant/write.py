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
==============================  =========================================================

The values are those of :func:`tensorbridge.quantize`, computed a slice of rows at a
time as the writer pulls them (:class:`QuantizedPart`): memory holds one slice.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from ..convert import to_numpy
from ..dtypes import DTypeRow, resolve_dtype
from ..errors import QuantizationError
from ..io._common import Deferred
from . import base
from .base import as_torch, row_pieces
from .detect import SCHEMES, scheme_named

__all__ = [
    "DEFAULT_IGNORE",
    "LAYOUTS",
    "QuantizedPart",
    "quantization_config",
    "quantized_parts",
    "skip_reason",
    "stored_layout",
]

# names no toolkit quantizes by default: embeddings, the output head, norms
DEFAULT_IGNORE = ("*embed*", "*lm_head*", "*norm*")
# scheme -> tb.quantize's layout= for the published layout convert writes
LAYOUTS: dict[str, str | None] = {
    "fp8-block": None,
    "mxfp8": "compressed-tensors",
    "mxfp4": "compressed-tensors",
    "nvfp4-modelopt": None,
    "nvfp4-compressed-tensors": None,
}
_ROW_BLOCK = {"mxfp8": 32, "mxfp4": 32, "nvfp4-modelopt": 16, "nvfp4-compressed-tensors": 16}


def writable(scheme: str) -> str:
    """The canonical name of a scheme ``convert --quantize`` writes, or QuantizationError."""
    s = scheme_named(scheme)
    if s.name not in LAYOUTS:
        raise QuantizationError(
            f"--quantize {scheme}: tensorbridge dequantizes {s.name} but does not write it; "
            f"pass one of {', '.join(LAYOUTS)}"
        )
    return s.name


def skip_reason(
    name: str, row: DTypeRow, shape: tuple[int, ...], scheme: str, ignore: Sequence[str] = ()
) -> str | None:
    """Why ``name`` is left as stored when quantizing with ``scheme`` (None: it is quantized).

    >>> from tensorbridge.dtypes import resolve_dtype
    >>> bf16 = resolve_dtype("bfloat16")
    >>> skip_reason("model.layers.0.mlp.up_proj.weight", bf16, (64, 64), "mxfp4") is None
    True
    >>> skip_reason("model.embed_tokens.weight", bf16, (64, 64), "mxfp4")
    'matches *embed*'
    """
    if row.category != "float" or len(shape) < 2 or not name.endswith("weight"):
        return "not a floating-point weight of 2 or more dimensions"
    for pattern in (*DEFAULT_IGNORE, *ignore):
        if fnmatch.fnmatchcase(name, pattern):
            return f"matches {pattern}"
    block = _ROW_BLOCK.get(scheme)
    if block and shape[-1] % block:
        return f"rows of {shape[-1]} values are not a multiple of {scheme}'s {block}-value blocks"
    return None


def stored_layout(
    name: str, shape: tuple[int, ...], scheme: str, block_size: tuple[int, int] | None = None
) -> dict[str, tuple[str, DTypeRow, tuple[int, ...]]]:
    """The stored tensors one weight quantizes into (name -> role, dtype row, shape), from
    its shape alone: a streaming writer needs them for the header before any value.

    >>> {k: (r, row.name, s) for k, (r, row, s) in stored_layout("w", (8, 64), "mxfp4").items()}
    {'w_packed': ('codes', 'uint8', (8, 32)), 'w_scale': ('scale', 'uint8', (8, 2))}
    """
    *lead, k = shape
    u8, e4m3, f32 = (resolve_dtype(n) for n in ("uint8", "float8_e4m3fn", "float32"))
    if scheme == "fp8-block":
        br, bc = block_size or (128, 128)
        grid = (*shape[:-2], math.ceil(shape[-2] / br), math.ceil(k / bc))
        return {name: ("codes", e4m3, shape), name + "_scale_inv": ("scale", f32, grid)}
    scale = ("scale", u8, (*lead, k // 32))
    if scheme == "mxfp8":
        return {name: ("codes", e4m3, shape), name + "_scale": scale}
    if scheme == "mxfp4":
        return {name + "_packed": ("codes", u8, (*lead, k // 2)), name + "_scale": scale}
    codes, glob, gshape = (
        ("", "_scale_2", ()) if scheme == "nvfp4-modelopt" else ("_packed", "_global_scale", (1,))
    )
    return {
        name + codes: ("codes", u8, (*lead, k // 2)),
        name + "_scale": ("scale", e4m3, (*lead, k // 16)),
        name + glob: ("global_scale", f32, gshape),
    }


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
    ) -> None:
        self.load, self.scheme, self.role, self.block_size = load, scheme, role, block_size
        self.row, self.shape = row, shape

    def slices(self) -> Iterator[dict[str, torch.Tensor]]:
        """Each slice's parts by role, in the stored tensors' C order."""
        w = as_torch(self.load())
        block_rows = (self.block_size or (128, 128))[0] if self.scheme == "fp8-block" else 1
        *lead, rows, cols = w.shape
        opts: dict[str, Any] = {"scales_only": self.role != "codes"}
        if self.scheme == "fp8-block":
            opts["block_size"] = self.block_size or (128, 128)
        if self.scheme.startswith("nvfp4"):
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
                yield self.quantize_rows(w[rows_at], opts)
                if self.role == "global_scale":
                    return  # one value for the whole weight

    def quantize_rows(self, rows: torch.Tensor, opts: dict[str, Any]) -> dict[str, torch.Tensor]:
        """One slice's parts by role, in the written layout (compressed-tensors: U8 e8m0)."""
        parts = SCHEMES[self.scheme].quantize(rows, **opts)
        if LAYOUTS[self.scheme] == "compressed-tensors":  # e8m0 exponents as U8
            parts["scale"] = parts["scale"].view(torch.uint8)
        return parts

    def chunks(self, chunk_bytes: int) -> Iterator[memoryview]:
        for parts in self.slices():
            raw = to_numpy(parts[self.role].contiguous()).reshape(-1).view(np.uint8)
            for at in range(0, raw.size, max(1, chunk_bytes)):
                yield raw[at : at + chunk_bytes].data


def quantized_parts(
    name: str,
    load: Callable[[], Any],
    shape: tuple[int, ...],
    scheme: str,
    block_size: tuple[int, int] | None = None,
) -> dict[str, QuantizedPart]:
    """The stored tensors of one weight, by name, each computed as it is written."""
    return {
        stored: QuantizedPart(load, scheme, role, row, shp, block_size)
        for stored, (role, row, shp) in stored_layout(name, shape, scheme, block_size).items()
    }


def quantization_config(
    scheme: str, block_size: tuple[int, int] | None, ignored: Sequence[str]
) -> dict[str, Any]:
    """The ``quantization_config`` a loader reads the written layout from.

    ``ignored``: the modules left unquantized (``lm_head``, ...), listed as each
    toolkit lists them.

    >>> quantization_config("fp8-block", (128, 128), [])["weight_block_size"]
    [128, 128]
    """
    ignored = sorted(ignored)
    if scheme == "fp8-block":
        return {
            "quant_method": "fp8",
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "weight_block_size": list(block_size or (128, 128)),
        }
    if scheme == "nvfp4-modelopt":
        return {
            "quant_method": "modelopt",
            "quant_algo": "NVFP4",
            "group_size": 16,
            "ignore": ignored,
        }
    fmt, bits, group, strategy = {
        "mxfp8": ("mxfp8-quantized", 8, 32, "group"),
        "mxfp4": ("mxfp4-pack-quantized", 4, 32, "group"),
        "nvfp4-compressed-tensors": ("nvfp4-pack-quantized", 4, 16, "tensor_group"),
    }[scheme]
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "format": fmt,
                "weights": {
                    "num_bits": bits,
                    "type": "float",
                    "strategy": strategy,
                    "group_size": group,
                    "symmetric": True,
                    "dynamic": False,
                },
                "input_activations": None,
            }
        },
        "ignore": ignored,
    }
