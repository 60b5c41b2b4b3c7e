"""The Zarr store's layout and the pieces every Zarr writer shares.

What :mod:`tensorbridge.io.zarr` describes, as code: the store's names (:data:`NAMES`),
the chunk grid that keeps parallel writers apart (:func:`chunk_grid`), arrays created
and filled region by region (:func:`create_array`, :func:`open_region`,
:func:`write_region`), the dtypes a Zarr array can hold (:func:`storable`), and what a
directory's ``zarr.json`` says it is (:func:`store_kind`, which needs no zarr). The
whole-store writer (:mod:`.writer`), the reader (:mod:`.reader`), DCP's ``ZarrWriter``
and file-to-file conversion all build on these, so they live apart from each of them.
"""

from __future__ import annotations

import functools
import json
import math
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._chunks import DEFAULT_CHUNK
from ..._files import read_limited
from ..._keys import (
    NameRules,
    case_insensitive,
    no_nul,
    not_empty,
    one_file_name,
    reserved_prefix,
    valid_unicode,
)
from ..._tensorfile import row_of
from ..._torch_checks import is_tensor, is_torch_dtype
from ...dtypes import DTypeLike, DTypeRow
from ...errors import MissingExtraError, UnsupportedDtypeError, UnsupportedTensorError

if TYPE_CHECKING:
    import zarr as zarr_module

__all__ = [
    "GROUP_FILE",
    "MAX_CHUNK_BYTES",
    "MAX_NODE_JSON",
    "NAMES",
    "RESERVED",
    "check_names",
    "chunk_grid",
    "create_array",
    "open_region",
    "require_zarr",
    "storable",
    "store_kind",
    "write_region",
]

GROUP_FILE = "zarr.json"  # a node's metadata; the group's is the store's commit record
MAX_NODE_JSON = 1 << 26  # a zarr.json larger than 64 MiB is not read as a store
MAX_CHUNK_BYTES = 16 << 20  # chunks at most this large (a grid may make them smaller)
RESERVED = "tensorbridge"  # the group attribute that holds the tensors' order
_CONFIG = {"write_empty_chunks": True}

# each name is a directory of the store: the rules of tensorbridge._keys that apply
NAMES = NameRules(
    (not_empty, no_nul, valid_unicode, one_file_name, reserved_prefix("__", "the Zarr spec")),
    same=case_insensitive,
    same_means="differ only in case: as directories of a store they are one on a "
    "case-insensitive filesystem (macOS, Windows)",
)


def require_zarr() -> Any:
    """The ``zarr`` module with tensorbridge's data types registered, or a clear error.

    Raises:
        MissingExtraError: zarr (3.1 or later) is not installed.
    """
    try:
        import zarr

        from ... import zarr_dtypes  # noqa: F401 - registers bfloat16, float8, ...
    except ImportError as err:
        raise MissingExtraError(
            f"Zarr stores need zarr 3.1 or later ({err}); pip install tensorbridge[zarr]"
        ) from None
    return zarr


# --- the chunk grid ---------------------------------------------------------------------------


def chunk_grid(
    shape: Sequence[int],
    blocks: Iterable[tuple[Sequence[int], Sequence[int]]],
    itemsize: int,
    max_chunk_bytes: int = MAX_CHUNK_BYTES,
) -> tuple[int, ...]:
    """A chunk shape that tiles every block exactly, and holds at most ``max_chunk_bytes``.

    ``blocks`` are ``(offsets, sizes)`` of the regions that separate writers write.
    Along each dimension the chunk length divides every block's offset and size (it
    divides their gcd), so each chunk lies inside one block: no two writers share a
    chunk. Outer dimensions shrink first (to a divisor of that gcd) until a chunk fits
    ``max_chunk_bytes``, which keeps chunks contiguous runs of the array.

    >>> chunk_grid((10, 6), [((0, 0), (6, 6)), ((6, 0), (4, 6))], 4)  # rows 0-5, 6-9
    (2, 6)
    >>> whole = [((0, 0), (1024, 1024))]
    >>> chunk_grid((1024, 1024), whole, 2, max_chunk_bytes=64 << 10)
    (32, 1024)
    """
    n = len(shape)
    grid = [0] * n
    for offsets, sizes in blocks:
        for d in range(n):
            grid[d] = math.gcd(grid[d], int(offsets[d]), int(sizes[d]))
    grid = [g if g > 0 else max(1, int(s)) for g, s in zip(grid, shape, strict=True)]
    limit = max(1, max_chunk_bytes // max(1, itemsize))
    for d in range(n):
        if math.prod(grid) <= limit:
            break
        inner = math.prod(grid[d + 1 :])
        grid[d] = _largest_divisor(grid[d], max(1, limit // inner))
    return tuple(grid)


def _largest_divisor(n: int, at_most: int) -> int:
    """The largest divisor of ``n`` that is at most ``at_most``."""
    if n <= at_most:
        return n
    best = 1
    i = 1
    while i * i <= n:
        if n % i == 0:
            for cand in (i, n // i):
                if best < cand <= at_most:
                    best = cand
        i += 1
    return best


# --- creating arrays and writing regions --------------------------------------------------------


def create_array(
    root: str | os.PathLike[str],
    name: str,
    shape: Sequence[int],
    dtype: DTypeLike,
    chunks: Sequence[int],
    *,
    attributes: Mapping[str, Any] | None = None,
) -> zarr_module.Array[Any]:
    """Create the array ``root/name`` (shape, dtype, chunk grid; no data yet); return it.

    ``dtype`` is any spelling of a dtype-table row. The array is uncompressed, filled
    with zero bits where nothing is written, and writes every chunk (see the module
    docstring). Other writers open it with :func:`open_region`.

    >>> import tempfile
    >>> a = create_array(tempfile.mkdtemp(), "w", (4, 2), "bfloat16", (2, 2))
    >>> a.metadata.data_type.to_json(zarr_format=3), a.chunks
    ('bfloat16', (2, 2))
    """
    zarr = require_zarr()
    row = storable(dtype)
    check_names([name], repr(os.fspath(root)))
    return zarr.create_array(  # type: ignore[no-any-return]
        store=os.fspath(Path(root) / name),
        shape=tuple(int(n) for n in shape),
        chunks=tuple(int(n) for n in chunks),
        dtype=row.numpy,
        compressors=None,
        filters=None,
        zarr_format=3,
        attributes=dict(attributes or {}),
        config=_CONFIG,
    )


def open_region(path: str | os.PathLike[str]) -> zarr_module.Array[Any]:
    """Open an array made by :func:`create_array` for writing regions into it."""
    zarr = require_zarr()
    return zarr.open_array(os.fspath(path), mode="r+", zarr_format=3, config=_CONFIG)  # type: ignore[no-any-return]


def write_region(
    array: zarr_module.Array[Any],
    offsets: Sequence[int],
    block: Any,
    *,
    dtype: DTypeLike | None = None,
    buffer_bytes: int = DEFAULT_CHUNK,
) -> int:
    """Write ``block`` (a tensor or array) into ``array`` at ``offsets``; the bytes written.

    The block must cover whole chunks (its end may be the array's end): a region
    that cuts a chunk would make two writers rewrite it, and one of them would lose.
    Rows go to the store about ``buffer_bytes`` at a time (converted, or cast to
    ``dtype``, on the way), so the memory used is the block plus that buffer.

    Raises:
        ValueError: the region lies outside the array or does not cover whole chunks.
    """
    shape = tuple(int(n) for n in array.shape)
    chunks = tuple(int(n) for n in array.chunks)
    sizes = tuple(int(n) for n in block.shape)
    offsets = tuple(int(o) for o in offsets)
    if len(offsets) != len(shape) or len(sizes) != len(shape):
        raise ValueError(
            f"a block of shape {sizes} at {offsets} does not match the array's "
            f"{len(shape)} dimensions; pass one offset per dimension"
        )
    for d, (o, s, n, c) in enumerate(zip(offsets, sizes, shape, chunks, strict=True)):
        if o < 0 or o + s > n:
            raise ValueError(
                f"the block {sizes} at {offsets} lies outside the array's shape {shape} "
                f"(dimension {d})"
            )
        if s and (o % c or ((o + s) % c and o + s != n)):
            raise ValueError(
                f"the block {sizes} at {offsets} cuts chunks of {chunks} on dimension {d}; "
                "make the chunk grid divide every block (chunk_grid) so no two writers "
                "share a chunk"
            )
    if 0 in sizes:
        return 0
    dst = storable(dtype if dtype is not None else array.dtype)
    if not shape:
        array[()] = _host(block, dst)
        return dst.itemsize
    row_bytes = math.prod(sizes[1:]) * dst.itemsize
    step = max(1, buffer_bytes // max(1, row_bytes)) // chunks[0] * chunks[0] or chunks[0]
    for start in range(0, sizes[0], step):
        stop = min(sizes[0], start + step)
        rest = (slice(o, o + s) for o, s in zip(offsets[1:], sizes[1:], strict=True))
        where = (slice(offsets[0] + start, offsets[0] + stop), *rest)
        array[where] = _host(block[start:stop], dst)
    return math.prod(sizes) * dst.itemsize


def _host(x: Any, dst: DTypeRow) -> np.ndarray:
    """A piece of a block as a host NumPy array of ``dst`` (bit-exact, or cast when asked)."""
    if is_tensor(x):
        from ...convert import to_numpy

        same = dst.in_torch and x.dtype is dst.torch
        out: np.ndarray = to_numpy(x, dtype=None if same else dst)
        return out
    a = np.asarray(x)
    src = row_of(a)
    if src is dst:
        return a
    from ...convert import to_numpy, to_torch

    if not (src.kernels and dst.kernels):  # a type torch has no kernel for: ml_dtypes' cast
        cast: np.ndarray = to_numpy(a, dtype=dst)
    else:
        cast = to_numpy(to_torch(a), dtype=dst)  # torch's kernel, as every cast
    return cast


def storable(dtype: Any) -> DTypeRow:
    """The table row for ``dtype``, refusing what no Zarr data type holds.

    That is torch's packed float4 (unpack it first) and the rows for which neither
    zarr-extensions nor tensorstore names a data type (``int1``, ``uint1``,
    ``float8_e5m3fnu``: :func:`tensorbridge.zarr_dtypes.zarr_name` is None), which
    ``.npy`` / ``.npz`` keep.
    """
    from ...dtypes import resolve_dtype

    if is_torch_dtype(dtype):
        from ...dtypes import PACKED_BY_TORCH

        if dtype in PACKED_BY_TORCH:
            raise UnsupportedDtypeError(_PACKED_MESSAGE.format(PACKED_BY_TORCH[dtype].name))
    row = resolve_dtype(dtype)
    if row.carried:
        require_zarr()
        from ... import zarr_dtypes

        if zarr_dtypes.zarr_name(row.numpy) is None:
            raise UnsupportedDtypeError(
                f"{row.name} has no Zarr data type (zarr-extensions and tensorstore define "
                f"none); save it to .npy or .npz, which keep every dtype of the table"
            )
    return row


_PACKED_MESSAGE = (
    "{} packs two values a byte and a Zarr array holds whole elements; unpack it to "
    "one float4_e2m1fn a byte first (tb.to_numpy(x, dtype=ml_dtypes.float4_e2m1fn))"
)


def check_names(names: Iterable[Any], where: str) -> None:
    """Refuse names that are no Zarr node names or break :data:`NAMES` (``where``: the store).

    Raises:
        UnsupportedTensorError: a name that is no string.
        InvalidNameError: a name :data:`NAMES` refuses, or two that collide.
    """
    names = list(names)
    for name in names:
        if not isinstance(name, str):
            raise UnsupportedTensorError(f"{where}: Zarr array names are strings, got {name!r}")
    NAMES.check(names, where)


def store_kind(path: str | os.PathLike[str]) -> str | None:
    """``"group"`` or ``"array"`` when ``path`` is a Zarr v3 node's directory, else None.

    Reads only the node's small ``zarr.json``; needs no zarr installed.
    """
    doc = Path(path) / GROUP_FILE
    try:
        st = doc.stat()
    except OSError:
        return None
    if st.st_size > MAX_NODE_JSON or not stat.S_ISREG(st.st_mode):  # a FIFO, /dev/zero
        return None
    # detecting, resolving and opening a store each ask: parse a large zarr.json once
    return _node_kind(str(doc), st.st_ino, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _node_kind(doc: str, ino: int, size: int, mtime_ns: int) -> str | None:
    try:  # a file swapped for a FIFO or a device since the stat is refused, never waited on
        meta = json.loads(read_limited(doc, MAX_NODE_JSON, GROUP_FILE))
    except (OSError, ValueError, RecursionError):
        return None
    if isinstance(meta, dict) and meta.get("zarr_format") == 3:
        kind = meta.get("node_type")
        return kind if kind in ("group", "array") else None
    return None
