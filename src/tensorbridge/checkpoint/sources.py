"""The checkpoint a whole-checkpoint call reads: a path opened (and closed) here, or a
file the caller opened; and the refusal of entries no reader gives, when every name is
asked for."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from .._tensorfile import TensorFile
from ..errors import UnsupportedDtypeError

__all__ = ["opened", "path_of", "refuse_unsupported"]


@contextlib.contextmanager
def opened(src: str | os.PathLike[str] | TensorFile) -> Iterator[TensorFile]:
    """``src`` as an open file: opened (and closed) here when it is a path."""
    if isinstance(src, TensorFile):
        yield src
        return
    from ..io import open as open_file

    with open_file(src) as f:
        yield f


def path_of(f: TensorFile) -> Any:
    return getattr(f, "path", None) or f.filename


def refuse_unsupported(f: TensorFile, verb: str) -> None:
    """Refuse a file with entries no reader gives (strings, a GGUF file's blocks read
    without ``dequantize=``) when every name is asked for."""
    unsupported = f.unsupported()
    if unsupported:
        first, reason = next(iter(unsupported.items()))
        raise UnsupportedDtypeError(f"{reason}; pass names= without {first!r} to {verb} the rest")
