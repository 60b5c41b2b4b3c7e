"""A tensor's or array's values as bytes, about one chunk at a time, for streamed writes.

:func:`iter_bytes` yields the values in C order, cast on the way when asked (torch's
kernel into one reused buffer; ml_dtypes' where torch has none), releasing the pages
of a read-only memory-mapped source once they are written (:func:`releaser`), so peak
memory stays near one chunk whatever the size. Every writer that streams uses it: the formats of
:mod:`tensorbridge.io` and the DCP writers.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ._ml_cast import astype
from ._tensorfile import StoredBits, row_of
from ._torch_checks import is_tensor
from ._versions import byte_bounds
from .dtypes import DTypeRow

if TYPE_CHECKING:
    import torch

DEFAULT_CHUNK = 64 << 20
_PAGE = mmap.PAGESIZE


def iter_bytes(
    x: Any, dst: DTypeRow | None = None, chunk_bytes: int = DEFAULT_CHUNK
) -> Iterator[memoryview]:
    """Yield ``x``'s values as ``dst`` bytes in C order, about ``chunk_bytes`` at a time.

    ``x`` is a tensor (any device), an array (memory-mapped ones included) or a file's
    :class:`~tensorbridge._tensorfile.StoredBits` (copied as its carrier's bytes). A
    yielded view is only valid until the next one is requested: the cast buffer is
    reused.
    """
    src = row_of(x)
    dst = dst or src
    if isinstance(x, StoredBits):
        if dst is src:  # a copy: the carrier's bytes are the values' bytes
            x = x.bits
            src = dst = row_of(x)
        else:  # a cast: the values (importing ml_dtypes)
            x = x.array()
    if is_tensor(x):
        if x.device.type != "cpu":
            yield from _iter_device(x, src, dst, chunk_bytes)
            return
        from .convert import to_numpy

        a = to_numpy(x)
    else:
        a = np.asarray(x)
    if a.size == 0:
        return
    per_elem = max(src.itemsize, dst.itemsize)
    step = max(1, chunk_bytes // per_elem)
    if dst is not src:
        from . import _memory as mem  # a cast: torch's kernel

    release = releaser(a)
    buf: np.ndarray | None = None
    if a.flags.c_contiguous:
        flat = a.reshape(-1)
        pieces: Iterator[np.ndarray] = (flat[i : i + step] for i in range(0, flat.size, step))
    else:
        rows = max(1, step // max(1, a[0].size if a.ndim else 1))
        pieces = (a[i : i + rows] for i in range(0, a.shape[0], rows))
    for piece in pieces:
        if dst is src and piece.flags.c_contiguous and piece.dtype.isnative:
            yield piece.view(src.carrier_numpy).reshape(-1).view(np.uint8).data
        else:
            if buf is None:
                buf = np.empty(min(step, a.size) if a.flags.c_contiguous else piece.size, dst.numpy)
            out = buf[: piece.size].reshape(piece.shape)
            if dst is src:
                np.copyto(out, piece)
            elif not (src.kernels and dst.kernels):  # int4, float6, ...: ml_dtypes' cast
                out[...] = astype(piece, dst.numpy)
            else:
                native = piece if piece.dtype.isnative else piece.astype(src.numpy)
                mem.as_tensor(out, dst).copy_(mem.reader(native, src))
            yield out.reshape(-1).view(dst.carrier_numpy).view(np.uint8).data
        release(piece)


def write_counted(
    f: Any, chunks: Iterable[Any], name: str, nbytes: int, bar: Any, declared: str
) -> None:
    """Write ``chunks`` (tensor ``name``'s bytes) to ``f``, updating the progress ``bar``,
    and check that they made the ``nbytes`` the file ``declared`` (``"its header says"``).

    Raises:
        RuntimeError: another count: the tensor was resized while being saved.
    """
    written = 0
    for chunk in chunks:
        f.write(chunk)
        written += len(chunk)
        bar.update(len(chunk))
    if written != nbytes:
        raise RuntimeError(
            f"tensor {name!r} yielded {written} bytes where {declared} {nbytes}; do not "
            "resize tensors while they are being saved"
        )


def _iter_device(
    t: torch.Tensor, src: DTypeRow, dst: DTypeRow, chunk_bytes: int
) -> Iterator[memoryview]:
    from .convert import to_numpy

    if src.carrier is not None and not src.kernels:  # int4 has no copy kernel: move bytes
        t = t.view(src.carrier)
    flat = t.reshape(-1)
    step = max(1, chunk_bytes // max(src.itemsize, dst.itemsize))
    for i in range(0, flat.numel(), step):
        if src.kernels:
            piece = to_numpy(flat[i : i + step].to(dst.torch).cpu())
        else:
            piece = astype(to_numpy(flat[i : i + step].cpu()).view(src.numpy), dst.numpy)
        yield piece.view(dst.carrier_numpy).view(np.uint8).data


def _shared_map(a: np.ndarray) -> mmap.mmap | None:
    """The memory map behind ``a`` if dropping its pages loses nothing (not copy-on-write).

    ``np.memmap`` records its mode; a read-only ``memoryview`` of an ``mmap`` (what
    tensorbridge's own readers hand out) can only come from an ``ACCESS_READ`` map.
    """
    base: Any = a
    while base is not None:
        cand = getattr(base, "_mmap", None)
        if isinstance(cand, mmap.mmap):
            return cand if getattr(base, "mode", "c") in ("r", "r+", "w+") else None
        if isinstance(base, memoryview):
            return base.obj if isinstance(base.obj, mmap.mmap) and base.readonly else None
        base = getattr(base, "base", None)
    return None


def releaser(a: np.ndarray) -> Any:
    """For a shared (not copy-on-write) memory map, drop pages from RSS once written.

    ``release(piece)`` drops the whole pages inside the span of ``piece`` (any view of
    ``a``, strided ones included); for an array that is no such map it does nothing.
    """
    mm = _shared_map(a)
    if mm is None:
        return lambda piece: None
    start = np.frombuffer(mm, np.uint8).__array_interface__["data"][0]
    size = len(mm)

    def release(piece: np.ndarray) -> None:
        if piece.size == 0:
            return
        low, high = byte_bounds(piece)
        addr = low - start
        lo = max(0, addr // _PAGE * _PAGE)
        hi = min(size, high - start)
        if 0 <= lo < hi:
            with contextlib.suppress(OSError, ValueError):
                mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    return release
