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

The values are those of :func:`tensorbridge.quantize` (one weight at a time: memory
holds one weight and its codes, never the model).
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..dtypes import DTypeRow, resolve_dtype
from ..errors import QuantizationError
from ..io._common import Deferred
from .api import quantize
from .detect import scheme_named

__all__ = [
    "DEFAULT_IGNORE",
    "LAYOUTS",
    "PendingWeight",
    "QuantizedPart",
    "quantization_config",
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
) -> dict[str, tuple[DTypeRow, tuple[int, ...]]]:
    """The stored tensors (name -> dtype row, shape) one weight quantizes into, from its
    shape alone: a streaming writer needs them for the header before any value."""
    *lead, k = shape
    u8, e4m3, f32 = (resolve_dtype(n) for n in ("uint8", "float8_e4m3fn", "float32"))
    if scheme == "fp8-block":
        br, bc = block_size or (128, 128)
        rows = shape[-2]
        grid = (*shape[:-2], math.ceil(rows / br), math.ceil(k / bc))
        return {name: (e4m3, shape), name + "_scale_inv": (f32, grid)}
    if scheme == "mxfp8":
        return {name: (e4m3, shape), name + "_scale": (u8, (*lead, k // 32))}
    if scheme == "mxfp4":
        return {name + "_packed": (u8, (*lead, k // 2)), name + "_scale": (u8, (*lead, k // 32))}
    codes, glob, gshape = (
        ("", "_scale_2", ()) if scheme == "nvfp4-modelopt" else ("_packed", "_global_scale", (1,))
    )
    return {
        name + codes: (u8, (*lead, k // 2)),
        name + "_scale": (e4m3, (*lead, k // 16)),
        name + glob: (f32, gshape),
    }


class PendingWeight:
    """One weight, quantized when its first stored tensor is written, kept until its last.

    A safetensors writer pulls tensors in order, so a weight's codes and scales are
    written one after the other: memory holds one weight's parts at a time.
    """

    def __init__(
        self,
        name: str,
        load: Callable[[], Any],
        scheme: str,
        block_size: tuple[int, int] | None,
        layout: dict[str, tuple[DTypeRow, tuple[int, ...]]],
    ) -> None:
        self.name, self.load, self.scheme, self.block_size = name, load, scheme, block_size
        self.layout = layout
        self.parts: dict[str, np.ndarray] | None = None
        self.taken: set[str] = set()

    def take(self, stored: str) -> np.ndarray:
        if self.parts is None:
            got = quantize(
                np.asarray(self.load()),
                self.scheme,
                name=self.name,
                block_size=self.block_size,
                layout=LAYOUTS[self.scheme],
            )
            said = {k: (v.dtype, tuple(v.shape)) for k, v in got.items()}
            want = {k: (row.numpy, shape) for k, (row, shape) in self.layout.items()}
            if said != want:  # pragma: no cover - stored_layout disagrees with quantize
                raise AssertionError(f"{self.name}: quantize gave {said}, the header says {want}")
            self.parts = got
        value = self.parts[stored]
        self.taken.add(stored)
        if self.taken == set(self.layout):
            self.parts, self.taken = None, set()  # written: let it go
        return value


class QuantizedPart(Deferred):
    """One stored tensor of a :class:`PendingWeight` (its codes, its scales)."""

    def __init__(self, weight: PendingWeight, stored: str) -> None:
        self.weight, self.stored = weight, stored
        self.row, self.shape = weight.layout[stored]

    def chunks(self, chunk_bytes: int) -> Iterator[memoryview]:
        raw = np.ascontiguousarray(self.weight.take(self.stored)).reshape(-1).view(np.uint8)
        for at in range(0, raw.size, max(1, chunk_bytes)):
            yield raw[at : at + chunk_bytes].data


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
