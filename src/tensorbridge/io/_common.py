"""The ``load`` every format module has: one function, built from the format's ``open``."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

from .._tensorfile import TensorFile
from ..dtypes import DeviceLike, DTypeLike


def loader(open_: Callable[..., TensorFile], doc: str | None) -> Callable[..., Any]:
    """The ``load`` of a module whose ``open`` is ``open_``: one function for every format.

    ``load(path, *, framework, mmap, device, float_dtype, keys, **options)`` opens the
    file with ``open_(path, **options)`` (the keyword options ``open_`` takes: ``dtype``,
    ``dequantize``, ``follow_links``, ...) and returns :meth:`TensorFile.read`'s result.
    Its signature, module and docstring (``doc``, whose examples run as the module's
    doctests) are ``open_``'s module's own.

    >>> import inspect
    >>> from tensorbridge.io import npz
    >>> list(inspect.signature(npz.load).parameters)
    ['path', 'framework', 'mmap', 'device', 'float_dtype', 'keys', 'dtype']
    """
    common = inspect.signature(_read_options).parameters.values()
    opening = [
        p
        for p in inspect.signature(open_).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    accepted = {p.name for p in opening}

    def load(
        path: str | os.PathLike[str],
        *,
        framework: str = "numpy",
        mmap: bool = True,
        device: DeviceLike | None = None,
        float_dtype: DTypeLike | None = None,
        keys: Any = None,
        **options: Any,
    ) -> Any:
        unknown = sorted(set(options) - accepted)
        if unknown:
            raise TypeError(f"load() got an unexpected keyword argument {unknown[0]!r}")
        return load_with(
            open_,
            path,
            framework=framework,
            mmap=mmap,
            device=device,
            float_dtype=float_dtype,
            keys=keys,
            **options,
        )

    load.__module__ = open_.__module__
    load.__doc__ = doc
    load.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [*common, *opening], return_annotation="Any"
    )
    return load


def load_with(
    open_: Callable[..., TensorFile],
    path: str | os.PathLike[str],
    *,
    framework: str = "numpy",
    mmap: bool = True,
    device: DeviceLike | None = None,
    float_dtype: DTypeLike | None = None,
    keys: Any = None,
    **options: Any,
) -> Any:
    """What every ``load`` does: ``open_(path, **options)``, then every entry (or ``keys``)
    as :meth:`TensorFile.read` gives them, the file closed after."""
    with open_(path, **options) as f:
        return f.read(keys, framework=framework, mmap=mmap, device=device, float_dtype=float_dtype)


def _read_options(
    path: str | os.PathLike[str],
    *,
    framework: str = "numpy",
    mmap: bool = True,
    device: DeviceLike | None = None,
    float_dtype: DTypeLike | None = None,
    keys: Any = None,
) -> None:
    """The parameters every ``load`` has (:func:`loader` builds the signature from them)."""
