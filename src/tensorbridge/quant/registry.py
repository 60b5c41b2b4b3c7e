"""The schemes tensorbridge knows, by name: one line each, the scheme modules' only index.

Importing this loads the scheme modules (their kernels: torch, NumPy, ml_dtypes) and
nothing of :mod:`tensorbridge.io`, so a torchao ``MXTensor`` dequantized by
``to_numpy`` loads the kernels alone. A scheme's other names (``aliases``) and the
names that could mean two schemes (``ambiguous``) come from the schemes themselves.

>>> scheme_named("FP8_block_wise").name
'fp8-block'
"""

from __future__ import annotations

from ..errors import QuantizationError
from .awq import AWQ
from .base import Scheme
from .ct_packed import PackQuantized
from .fp8_block import FP8Block
from .fp8_scaled import FP8Scaled
from .gptq import GPTQ
from .mx import MX
from .nvfp4 import NVFP4

__all__ = ["SCHEMES", "scheme_named"]

# The order is the order of messages, of detection from a config, and of subclass matching.
SCHEMES: dict[str, Scheme] = {
    s.name: s
    for s in (
        FP8Block(),
        FP8Scaled(),
        MX("mxfp8"),
        MX("mxfp4"),
        NVFP4("modelopt"),
        NVFP4("compressed-tensors"),
        GPTQ(),
        AWQ(),
        PackQuantized(),
    )
}
_ALIASES = {alias: s for s in SCHEMES.values() for alias in s.aliases}
_AMBIGUOUS = {name: why for s in SCHEMES.values() for name, why in s.ambiguous.items()}


def scheme_named(name: str) -> Scheme:
    """The scheme called ``name``; an unknown or incomplete name raises QuantizationError."""
    key = name.lower().replace("_", "-")
    if key in SCHEMES:
        return SCHEMES[key]
    if key in _ALIASES:
        return _ALIASES[key]
    if key in _AMBIGUOUS:
        raise QuantizationError(_AMBIGUOUS[key])
    raise QuantizationError(f"unknown scheme {name!r}; pass one of {', '.join(SCHEMES)}")
