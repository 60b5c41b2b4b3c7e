"""The ``config.json`` beside a checkpoint written: a quantized checkpoint's with the
``quantization_config`` a loader reads its layout from, a dequantized one's without it.
An existing ``config.json`` beside the output is kept unless ``overwrite``."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from .._tensorfile import TensorFile

__all__ = ["copy_config", "write_quantized_config"]


def write_quantized_config(
    src: TensorFile,
    dst: os.PathLike[str],
    scheme: str,
    block_size: tuple[int, int] | None,
    ignored: list[str],
    layout: str | None,
    overwrite: bool,
) -> tuple[str | None, str | None]:
    """A quantized checkpoint's config.json: the source's, with its ``quantization_config``
    (written only when the source directory has a config.json). Returns the path written
    and the path of an existing config.json kept (``overwrite`` false)."""
    from ..quant.write import quantization_config

    source = getattr(src, "path", None)
    if source is None:
        return None, None

    def quantized(data: Any) -> Any:
        if not isinstance(data, dict):
            return None
        qc = quantization_config(scheme, block_size, ignored, layout=layout)
        return {**data, "quantization_config": qc}

    here = source if os.path.isdir(source) else os.path.dirname(os.path.abspath(source))
    return config_beside(here, dst, overwrite, quantized)


def copy_config(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], *, overwrite: bool = False
) -> str | None:
    """Copy the ``config.json`` beside checkpoint file ``src`` to beside ``dst``, without
    its ``quantization_config``: the config of ``src`` dequantized to ``dst``.

    Nothing is written when ``src`` has no config.json beside it, when both are in one
    directory, or when one exists beside ``dst`` (unless ``overwrite``). Returns the
    path written, or None.

    >>> import json, os, tempfile
    >>> a, b = tempfile.mkdtemp(), tempfile.mkdtemp()
    >>> with open(os.path.join(a, "config.json"), "w") as f:
    ...     json.dump({"model_type": "llama", "quantization_config": {}}, f)
    >>> src, dst = os.path.join(a, "q.safetensors"), os.path.join(b, "w.safetensors")
    >>> path = copy_config(src, dst)
    >>> with open(path) as f:
    ...     json.load(f)
    {'model_type': 'llama'}
    """

    def plain(data: Any) -> Any:
        if isinstance(data, dict):
            data.pop("quantization_config", None)
        return data

    return config_beside(os.path.dirname(os.path.abspath(src)), dst, overwrite, plain)[0]


def config_beside(
    here: str, dst: str | os.PathLike[str], overwrite: bool, change: Callable[[Any], Any]
) -> tuple[str | None, str | None]:
    """The ``config.json`` of directory ``here`` written beside ``dst`` as ``change`` makes
    it (``change`` returns None: nothing is written). Nothing is written either when
    ``here`` has none or is ``dst``'s own directory, or when one is beside ``dst`` and not
    ``overwrite`` (it is kept). Returns the path written and the path kept."""
    from .._atomic import atomic_write

    there = os.path.dirname(os.path.abspath(dst))
    config, target = os.path.join(here, "config.json"), os.path.join(there, "config.json")
    if os.path.abspath(here) == there or not os.path.isfile(config):
        return None, None
    if os.path.exists(target) and not overwrite:
        return None, target
    with open(config, encoding="utf-8") as f:
        data = change(json.load(f))
    if data is None:
        return None, None
    with atomic_write(target) as out:
        out.write((json.dumps(data, indent=2) + "\n").encode("utf-8"))
    return target, None
