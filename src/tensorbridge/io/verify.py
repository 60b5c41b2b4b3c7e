"""Checking a conversion: the written file, re-read, against its source, bit for bit.

:func:`verify` opens what a save wrote and compares every tensor with the source's:
the same dtype and shape, and the same bytes (NaN payloads and signed zeros included:
bytes are compared, not values). A cast on the way (``float_dtype=``) is checked
against the source cast by the same kernel the save ran (``tb.to_numpy(x,
dtype=...)``), so the check says the file holds what was asked, not that the cast
lost nothing (:func:`tensorbridge.cast_report` says that). An entry a NumPy format
copied as its ``.npy`` bytes (a dtype torch lacks: float128, strings) must be in the
output byte for byte. ``tensorbridge convert --verify`` is this call.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._progress import progress_bar
from .._tensorfile import TensorFile, cast_target, row_of
from ..dtypes import DTypeLike
from ..errors import UnsupportedDtypeError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Verification", "verify"]


@dataclass(frozen=True)
class Verification:
    """What :func:`verify` found: the entries checked and every difference, one line each
    (``"w: the bytes differ"``, ``"b: missing from the output"``).

    >>> Verification(checked=("w",), problems=()).ok
    True
    """

    checked: tuple[str, ...]
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """True when every entry checked is in the output, bit for bit."""
        return not self.problems


def verify(
    src: str | os.PathLike[str] | TensorFile,
    dst: str | os.PathLike[str],
    *,
    names: Sequence[str] | None = None,
    float_dtype: DTypeLike | None = None,
    progress: bool | None = None,
) -> Verification:
    """Check that the file ``dst`` holds the tensors of ``src`` bit for bit.

    ``src`` is the checkpoint that was converted (a path, or the open file that was
    saved, such as ``tb.open(path, dequantize="bf16")``), ``dst`` what the save
    wrote (a file, a shard index, a directory). ``names`` are the entries to check
    (default: every entry of ``src`` that a save can write); ``float_dtype`` the
    cast the save was asked for. A file holding one bare array (``.npy``) stands
    for the one name given.

    >>> import os, tempfile, torch, tensorbridge as tb
    >>> from tensorbridge.io.verify import verify
    >>> d = tempfile.mkdtemp()
    >>> tb.save({"w": torch.randn(4, 4)}, os.path.join(d, "a.safetensors"))
    >>> tb.save(tb.open(os.path.join(d, "a.safetensors")), os.path.join(d, "b.npz"))
    >>> verify(os.path.join(d, "a.safetensors"), os.path.join(d, "b.npz")).ok
    True
    >>> verify(os.path.join(d, "a.safetensors"), os.path.join(d, "b.npz"),
    ...        float_dtype="bfloat16").problems
    ('w: bfloat16(4, 4) became float32(4, 4)',)

    Returns:
        A :class:`Verification`; ``ok`` is true when nothing differs.
    """
    with _opened(src) as f:
        skip = f.unsupported()
        wanted = list(f.keys() if names is None else names)
        carried = _carried(f, [n for n in wanted if n in skip])
        if names is None:
            wanted = [n for n in wanted if n not in skip or n in carried]
        kept = [n for n in wanted if n not in carried]
        problems = _values(f, kept, os.fspath(dst), float_dtype, progress) if kept else []
        problems += _carried_bytes(carried, os.fspath(dst))
    return Verification(checked=tuple(wanted), problems=tuple(problems))


@contextlib.contextmanager
def _opened(src: str | os.PathLike[str] | TensorFile) -> Iterator[TensorFile]:
    """``src`` as an open file: opened (and closed) here when it is a path."""
    if isinstance(src, TensorFile):
        yield src
        return
    from . import open as open_file

    with open_file(src) as f:
        yield f


def _carried(src: TensorFile, names: list[str]) -> dict[str, Any]:
    """The entries of ``names`` a NumPy source can only copy as their ``.npy`` bytes."""
    from .npy import NpyEntries

    out: dict[str, Any] = {}
    if not isinstance(src, NpyEntries):
        return out
    for name in names:
        with contextlib.suppress(UnsupportedDtypeError):  # an object array: never copied
            out[name] = src.npy_bytes(name)
    return out


def _values(
    src: TensorFile, names: list[str], dst: str, float_dtype: Any, progress: bool | None
) -> list[str]:
    """Every output tensor must equal the source, or its cast with the same kernel, bit for bit."""
    import numpy as np

    from . import open as open_file

    problems = []
    skip = src.unsupported()
    bar = progress_bar(sum(src.nbytes(n) for n in names), "verifying", progress, tensors=len(names))
    with open_file(dst) as written:
        keys = written.keys()
        if written.single:  # one bare array, named after the file
            where = {names[0]: keys[0]} if keys else {}
        else:
            stored = set(keys)
            where = {n: n for n in names if n in stored}
        try:
            for name in names:
                bar.update(src.nbytes(name))
                if name in skip:  # asked for by name, but neither readable nor copied
                    problems.append(f"{name}: {skip[name]}")
                    continue
                if name not in where:
                    problems.append(f"{name}: missing from the output")
                    continue
                a, b = src[name], written[where[name]]
                want = cast_target(row_of(a), float_dtype)
                if want.numpy != a.dtype:
                    from ..convert import to_numpy

                    a = to_numpy(a, dtype=want)
                if a.shape != b.shape or a.dtype != b.dtype:
                    problems.append(f"{name}: {a.dtype}{a.shape} became {b.dtype}{b.shape}")
                elif not np.array_equal(bits(a), bits(b)):
                    problems.append(f"{name}: the bytes differ")
        finally:
            bar.close()
    return problems


def _carried_bytes(carried: dict[str, Any], dst: str) -> list[str]:
    """Every member copied unchanged (``NpyBytes``) must be in the output byte for byte."""
    from . import open as open_file
    from .npy import NpyEntries

    problems: list[str] = []
    if not carried:
        return problems
    with open_file(dst) as written:
        keys = written.keys()
        for name, want in carried.items():
            key = keys[0] if written.single else name
            if key not in keys or not isinstance(written, NpyEntries):
                problems.append(f"{name}: missing from the output")
                continue
            got = written.npy_bytes(key)
            with want.opener() as a, got.opener() as b:
                step = 1 << 20
                same = want.size == got.size and all(
                    a.read(min(step, want.size - i)) == b.read(min(step, want.size - i))
                    for i in range(0, want.size, step)
                )
            if not same:
                problems.append(f"{name}: the bytes differ")
    return problems


def bits(a: np.ndarray) -> np.ndarray:
    """``a``'s bytes, flat, as ``uint8``: what "bit for bit" compares."""
    import numpy as np

    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)
