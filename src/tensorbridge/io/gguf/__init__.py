"""GGUF, llama.cpp's file format: read memory-mapped and checked, written atomically.

The layout is in :mod:`tensorbridge.io._gguf_header` (checked field by field before
anything is mapped or allocated). What this module promises:

* **Shapes in PyTorch order.** GGUF stores dimensions innermost first (ggml's
  ``ne[0]`` is the row length), so a ``[4096, 11008]`` weight is ``[11008, 4096]`` in
  the file; reading reverses them back and writing reverses them again, so
  ``tb.load(tb.save(x))`` has ``x``'s shape. The bytes are the same row-major bytes.
* **Plain types zero-copy.** F32, F16, BF16, F64, I8, I16, I32 and I64 tensors are
  read-only views of the memory-mapped file (torch: copy-on-write). BF16 comes as
  ``ml_dtypes.bfloat16`` / ``torch.bfloat16``, never as raw ``uint8`` bytes.
* **Quantized types kept or dequantized, never guessed.** A block-quantized tensor
  (Q4_0 ... Q8_0, the K-quants, IQ types, MXFP4, NVFP4) read as a plain array raises
  :class:`~tensorbridge.errors.UnsupportedDtypeError` naming ``dequantize=``; opened
  with ``dequantize="bf16"`` (or ``"f32"``, ``"f16"``) it reads as values: computed
  in float32 exactly as the ``gguf`` package (the reference) computes them, and
  rounded once to that dtype. ``f.raw(name)`` gives the untouched
  blocks, ``f.ggml_type(name)`` the type; each type's block layout (nibble order
  included: GGUF's MXFP4 puts element ``j`` and ``j + 16`` in one byte, safetensors'
  F4 ``2j`` and ``2j + 1``) is in :data:`tensorbridge.quant.ggml.TYPES`.
* **Metadata.** ``f.metadata`` shows every key-value pair as text (lists as JSON);
  ``f.plain_values()`` gives them typed (NumPy scalars keep UINT32 apart from INT32),
  ``f.metadata_types`` names each type (``"ARRAY[STRING]"``).
* **Writing** F32 / F16 / BF16 / F64 / I8-I64 tensors, and Q8_0 (``quantize="q8_0"``:
  bit-identical to the ``gguf`` package's quantizer), with the caller's metadata,
  which must name ``general.architecture`` (the spec requires it). Tensor names are
  written as given: mapping Hugging Face names to llama.cpp's (``blk.0.attn_q.weight``)
  is a model converter's job (llama.cpp's ``convert_hf_to_gguf.py``), as is choosing
  the architecture's other keys; llama.cpp itself also limits names to 63 bytes.

The ``gguf`` package (``pip install tensorbridge[gguf]``) is needed only to dequantize
and to write Q8_0; plain tensors and metadata are read and written without it.

The package: :mod:`.reader` (:class:`GGUFFile`, :func:`open`, :func:`load`),
:mod:`.writer` (:func:`save` and its metadata helpers), the header in
:mod:`tensorbridge.io._gguf_header`, the block kernels in :mod:`tensorbridge.quant.ggml`.

>>> import os, tempfile, numpy as np
>>> p = os.path.join(tempfile.mkdtemp(), "m.gguf")
>>> meta = {"general.architecture": "llama"}
>>> save({"w": np.ones((2, 3), np.float16)}, p, metadata=meta)
>>> with open(p) as f:
...     f["w"].shape, f.metadata["general.architecture"]
((2, 3), 'llama')
"""

from __future__ import annotations

from ...quant.ggml import dequantize_blocks
from .reader import GGUFFile, load, open
from .writer import NAMES as NAMES
from .writer import Quantize as Quantize
from .writer import check_architecture, metadata_value, save
from .writer import check_metadata as check_metadata

__all__ = [
    "GGUFFile",
    "check_architecture",
    "dequantize_blocks",
    "load",
    "metadata_value",
    "open",
    "save",
]
