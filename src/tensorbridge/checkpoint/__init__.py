"""Whole checkpoints quantized and dequantized, with the config a loader reads:
``tb.quantize_checkpoint`` and ``tb.dequantize_checkpoint``.

This package sits above both ``io`` (it reads and saves files) and ``quant`` (the
schemes' layouts and kernels), which import neither it nor each other's upper layers.

:func:`quantize_checkpoint` (:mod:`.quantize`) reads a checkpoint (a file, shard index
or directory) and writes it as a safetensors checkpoint whose weights are quantized in
the scheme's published layout (which weights, and how they are stored:
:mod:`tensorbridge.quant.write`). Each weight is quantized a slice of rows at a time as
the writer pulls it, so memory holds one slice; everything else is copied bit for bit.
The source's ``config.json`` goes beside the output with the ``quantization_config`` a
loader (transformers, vLLM, compressed-tensors) reads the layout from. ``verify=True``
re-reads the output: each quantized weight must be :func:`tensorbridge.quantize`'s, bit
for bit, and every other tensor the source's. ``tensorbridge convert --quantize`` is
this call.

:func:`dequantize_checkpoint` (:mod:`.dequantize`) is the way back: a checkpoint of
codes and scales (or a GGUF file's blocks) written as the unquantized model, each
weight computed while the writer writes, with the source's ``config.json`` beside it
without its ``quantization_config`` (:func:`copy_config`, :mod:`.config`), so that a
loader reads a plain model. ``tensorbridge convert --dequantize`` is this call.

>>> import os, tempfile, torch, tensorbridge as tb
>>> d = tempfile.mkdtemp()
>>> tb.save({"l.weight": torch.randn(8, 64)}, os.path.join(d, "w.safetensors"))
>>> q = tb.quantize_checkpoint(os.path.join(d, "w.safetensors"),
...                            os.path.join(d, "q.safetensors"), "mxfp8")
>>> back = tb.dequantize_checkpoint(q.path, os.path.join(d, "b.safetensors"), "f32",
...                                 scheme="mxfp8")  # no config.json beside w.safetensors
>>> q.quantized == back.dequantized == ("l.weight",)
True
"""

from __future__ import annotations

from .config import copy_config
from .dequantize import DequantizedCheckpoint, dequantize_checkpoint
from .quantize import QuantizedCheckpoint, quantize_checkpoint

__all__ = [
    "DequantizedCheckpoint",
    "QuantizedCheckpoint",
    "copy_config",
    "dequantize_checkpoint",
    "quantize_checkpoint",
]
