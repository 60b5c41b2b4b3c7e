"""File formats: ``save`` / ``load`` / ``open`` choose the format by the path's suffix.

=====================================  =========================================
suffix                                 module
=====================================  =========================================
``.safetensors``, ``.index.json``,     :mod:`tensorbridge.io.safetensors`
a directory of shards
``.npy``, ``.npz``                     :mod:`tensorbridge.io.npy`
``.pt``, ``.pth``, ``.bin``            :mod:`tensorbridge.io.pt` (read with
                                       ``weights_only=True``: never unpickles
                                       arbitrary objects)
=====================================  =========================================

Every format module has the same verbs, so a new format is one new module and one
row in :data:`_SUFFIXES`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from ..errors import FormatError
from . import npy, pt, safetensors
from ._common import TensorFile

__all__ = ["load", "open", "save"]

_SUFFIXES = {
    ".safetensors": "safetensors",
    ".json": "safetensors",  # model.safetensors.index.json
    ".npy": "npy",
    ".npz": "npy",
    ".pt": "pt",
    ".pth": "pt",
    ".bin": "pt",
}


def _module(path: str | os.PathLike[str]) -> ModuleType:
    p = Path(path)
    if p.is_dir():
        name = "safetensors"
    else:
        name = _SUFFIXES.get(p.suffix.lower(), "")
        if not name:
            raise FormatError(
                f"{str(p)!r}: cannot tell the format from the suffix {p.suffix!r}; use one of "
                f"{', '.join(sorted(_SUFFIXES))}"
            )
    return {"safetensors": safetensors, "npy": npy, "pt": pt}[name]


def flatten_state(obj: Any, prefix: str = "") -> dict[str, Any]:
    """A flat ``{name: tensor | array}`` from a state dict, a module, or nested mappings.

    Nested mappings join their keys with ``.`` (the ``state_dict`` convention).
    """
    if isinstance(obj, torch.nn.Module):
        obj = obj.state_dict()
    if not isinstance(obj, Mapping):
        raise TypeError(
            f"expected a mapping of names to tensors or arrays, got {type(obj).__qualname__}; "
            "pass a state dict, e.g. {'weight': tensor}"
        )
    flat: dict[str, Any] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_state(value, f"{name}."))
        elif isinstance(value, (torch.Tensor, np.ndarray, np.generic)):
            flat[name] = np.asarray(value) if isinstance(value, np.generic) else value
        else:
            raise TypeError(
                f"at {name!r}: {type(value).__qualname__} is not a tensor or array; file "
                "formats store tensors only (put other values in metadata=)"
            )
    return flat


def save(
    obj: Any,
    path: str | os.PathLike[str],
    *,
    float_dtype: Any = None,
    metadata: Mapping[str, str] | None = None,
    max_shard_size: int | str | None = None,
    progress: bool | None = None,
) -> None:
    """Save tensors or arrays to ``path``, streamed chunk by chunk, atomically.

    ``obj`` is a state dict (or module, or nested mapping) of tensors/arrays; for
    ``.npy``, a single tensor or array. ``float_dtype`` casts floating-point values
    only, on the way. bf16, fp8 and complex32 keep their dtype in every format.

    >>> import tempfile, os, torch, tensorbridge as tb
    >>> p = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    >>> tb.save({"w": torch.ones(2, dtype=torch.bfloat16)}, p)
    >>> tb.load(p)["w"].dtype
    dtype(bfloat16)
    """
    module = _module(path)
    suffix = Path(path).suffix.lower()
    if module.__name__.endswith(".safetensors"):
        module.save(
            flatten_state(obj),
            path,
            float_dtype=float_dtype,
            metadata=metadata,
            max_shard_size=max_shard_size,
            progress=progress,
        )
        return
    if metadata is not None or max_shard_size is not None:
        raise ValueError(
            f"metadata= and max_shard_size= need the safetensors format; {suffix!r} has neither "
            "(save to a .safetensors path)"
        )
    if suffix == ".npy":
        module.save(obj, path, float_dtype=float_dtype, progress=progress)
    else:
        module.save(flatten_state(obj), path, float_dtype=float_dtype, progress=progress)


def load(
    path: str | os.PathLike[str],
    *,
    framework: str = "numpy",
    mmap: bool = True,
    device: Any = None,
    float_dtype: Any = None,
    keys: Any = None,
) -> Any:
    """Load a file's tensors as NumPy arrays (default) or torch tensors.

    With ``mmap=True`` NumPy results are read-only views of the mapped file (a write
    raises, never reaches the file) and torch results are copy-on-write; ``mmap=False``
    gives ordinary owned memory. ``keys`` selects a subset.
    """
    return _module(path).load(
        path, framework=framework, mmap=mmap, device=device, float_dtype=float_dtype, keys=keys
    )


def open(path: str | os.PathLike[str]) -> TensorFile:
    """Open a file lazily: ``.keys()``, ``[name]``, ``.metadata``; nothing is read until asked.

    >>> import tempfile, os, numpy as np, tensorbridge as tb
    >>> p = os.path.join(tempfile.mkdtemp(), "a.npz")
    >>> tb.save({"x": np.arange(3)}, p)
    >>> with tb.open(p) as f:
    ...     f.keys(), f["x"].tolist()
    (['x'], [0, 1, 2])
    """
    reader: TensorFile = _module(path).open(path)
    return reader
