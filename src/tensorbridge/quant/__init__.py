"""Quantized weights: codes and scales in, plain floating-point weights out (and back).

One module per scheme behind one small interface (:class:`~.base.Scheme`: detect,
dequantize, quantize, describe):

==============================  ===================================================
scheme                          module
==============================  ===================================================
``fp8-block``                   :mod:`tensorbridge.quant.fp8_block` (DeepSeek-V3)
``fp8``                         :mod:`tensorbridge.quant.fp8_scaled` (per tensor /
                                per channel: compressed-tensors, FBGEMM, ModelOpt)
``mxfp8``, ``mxfp4``            :mod:`tensorbridge.quant.mx` (OCP MX; gpt-oss)
``nvfp4-modelopt``,             :mod:`tensorbridge.quant.nvfp4`
``nvfp4-compressed-tensors``
``gptq``                        :mod:`tensorbridge.quant.gptq` (v1, v2, act-order)
``awq``                         :mod:`tensorbridge.quant.awq` (AutoAWQ GEMM)
``pack-quantized``              :mod:`tensorbridge.quant.ct_packed`
                                (compressed-tensors int4 / int8)
==============================  ===================================================

:mod:`tensorbridge.quant.detect` decides which scheme a checkpoint uses (config
first, then unambiguous names; otherwise a :class:`~tensorbridge.QuantizationError`),
and :mod:`tensorbridge.quant.api` holds ``tb.dequantize``, ``tb.quantize`` and the
dequantizing view that ``tb.open(path, dequantize="bf16")`` returns.

>>> from tensorbridge.quant import SCHEMES
>>> sorted(SCHEMES)[:3]
['awq', 'fp8', 'fp8-block']
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .base import Config, Group, Scheme
from .detect import SCHEMES, Plan, plan, read_config, scheme_named

if TYPE_CHECKING:
    from .api import DequantizedFile, dequantize, quantize

__all__ = [
    "SCHEMES",
    "Config",
    "DequantizedFile",
    "Group",
    "Plan",
    "Scheme",
    "dequantize",
    "plan",
    "quantize",
    "read_config",
    "scheme_named",
]


def __getattr__(name: str) -> Any:
    """:mod:`.api`'s names, imported on first use (PEP 562): detecting a checkpoint's scheme
    (``tensorbridge inspect``) needs neither torch nor the file formats that api loads."""
    if name not in ("DequantizedFile", "dequantize", "quantize"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(".api", __name__), name)
    globals()[name] = value
    return value
