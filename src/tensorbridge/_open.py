"""A checkpoint read as its unquantized model: where file formats and schemes meet.

``tb.open(path, dequantize="bf16")`` opens the file with its format's reader
(:mod:`tensorbridge.io`) and hands it here, to be read through the quantization
scheme its config or names call for (:mod:`tensorbridge.quant`). This module sits
above both: no format module knows a scheme and no scheme a format, and
:func:`tensorbridge.io.open` imports this module only when ``dequantize=`` is given
for a file whose format does not dequantize itself (GGUF's block types do).

>>> import os, tempfile, torch, tensorbridge as tb
>>> p = os.path.join(tempfile.mkdtemp(), "q.safetensors")
>>> tb.save(tb.quantize(torch.ones(2, 32), "mxfp8", name="w"), p)
>>> with tb.open(p, dequantize="float32") as f:
...     f.keys(), f["w"].tolist()[0][:2]
(['w'], [1.0, 1.0])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .dtypes import DTypeLike
from .quant.api import DequantizedFile

if TYPE_CHECKING:
    from ._tensorfile import TensorFile

__all__ = ["dequantized"]


def dequantized(
    f: TensorFile,
    dtype: DTypeLike,
    *,
    scheme: str | None = None,
    config: Any = None,
    block_size: tuple[int, int] | None = None,
) -> DequantizedFile:
    """``f`` read as the unquantized model (a :class:`~tensorbridge.quant.api.DequantizedFile`);
    ``f`` is closed when that is refused.

    Raises:
        QuantizationError: the scheme cannot be decided, or the parts do not fit it.
    """
    try:
        return DequantizedFile(f, dtype, scheme=scheme, config=config, block_size=block_size)
    except BaseException:
        f.close()
        raise
