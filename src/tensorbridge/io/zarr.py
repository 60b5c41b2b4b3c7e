"""Zarr v3 stores: a group directory holding one array per tensor, committed atomically.

Layout of ``OUT.zarr`` as :func:`save` and :class:`tensorbridge.ZarrWriter` write it::

    OUT.zarr/zarr.json         the group: {"zarr_format": 3, "node_type": "group",
                               "attributes": {...metadata, "tensorbridge": {...}}}
    OUT.zarr/<name>/zarr.json  one array per tensor, named by its dotted key
    OUT.zarr/<name>/c/0/1      its chunks: a regular grid, raw little-endian bytes

**Data types.** Every row of the dtype table: the classic ones under zarr's own names
(``bool``, ``int8`` ... ``uint64``, ``float16`` ... ``float64``, ``complex64``,
``complex128``), bfloat16, float8, float8_e8m0fnu and complex32 under the names of
:mod:`tensorbridge.zarr_dtypes` (tensorstore's), so a plain NumPy process with zarr,
dask or tensorstore reads the bits back. Packed float4 (torch ``float4_e2m1fn_x2``) is
refused rather than unpacked behind the caller's back.

**Chunks** are uncompressed (the ``bytes`` codec alone, as safetensors stores bytes)
and at most ``max_chunk_bytes``; every chunk is written, even one that equals the fill
value (zarr would otherwise skip it, and its comparison folds NaN payloads and -0.0).

**Names** are Zarr node names and directories: :data:`NAMES` holds them to the v3
spec's rules (not empty, no ``/``, not only periods, no leading ``__``) and to what a
directory can hold faithfully: no NUL, no lone surrogate, no ``\\``, and no two names
that differ only in case (one directory on macOS and Windows).

**Metadata** goes to the group's attributes as JSON values (``tb.load`` gives them
back in ``metadata`` as strings and typed in ``plain_values()``); the key
``"tensorbridge"`` is reserved for the tensors' order.

**Commit.** The new store is built, group ``zarr.json`` included, in a hidden sibling
staging directory ``.tensorbridge-tmp-<id>.OUT.zarr``, then swapped with ``OUT.zarr``
in one atomic exchange (the protocol of :mod:`tensorbridge._commit`): a save that
dies leaves the previous store (or none) under ``OUT.zarr``, never a partial one.

**Writing regions.** Parallel writers (DCP ranks, conversion workers) share a store
through :func:`create_array`, :func:`open_region` and :func:`write_region`: the chunk
grid comes from :func:`chunk_grid`, aligned to every writer's block, so no two
writers ever touch one chunk (two unaligned writers of one chunk lose data: each
rewrites the whole chunk).

zarr is an optional dependency: ``pip install tensorbridge[zarr]``.

>>> import os, tempfile, numpy as np, tensorbridge as tb
>>> p = os.path.join(tempfile.mkdtemp(), "w.zarr")
>>> w = np.arange(6, dtype=np.int16).reshape(2, 3)
>>> tb.save({"w": w}, p, metadata={"step": 7})
>>> with tb.open(p) as f:
...     f.keys(), f["w"].tolist(), f.plain_values()
(['w'], [[0, 1, 2], [3, 4, 5]], {'step': 7})
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

from .._atomic import destination_errors
from .._chunks import DEFAULT_CHUNK
from .._commit import abandon, begin_store, new_save_id, pending, publish_store, require_committed
from .._filemap import check_same_version, identity
from .._files import Links, read_limited, read_regular
from .._keys import (
    NameRules,
    case_insensitive,
    no_nul,
    not_empty,
    one_file_name,
    reserved_prefix,
    valid_unicode,
)
from .._progress import progress_bar
from .._tensorfile import TensorFile, cast_target, row_of
from .._torch_checks import is_tensor, is_torch_dtype
from ..dtypes import PACKED_BY_NUMPY, DTypeLike, DTypeRow
from ..errors import (
    FormatError,
    MissingExtraError,
    NoDataError,
    UnsupportedDtypeError,
    UnsupportedTensorError,
)
from ._common import loader
from ._formats import StoreLayout

if TYPE_CHECKING:
    import zarr as zarr_module

__all__ = [
    "GROUP_FILE",
    "MAX_CHUNK_BYTES",
    "MAX_FILL_BYTES",
    "MAX_FILL_CHUNKS",
    "NAMES",
    "StoreWriter",
    "ZarrFile",
    "chunk_grid",
    "create_array",
    "group_document",
    "load",
    "open",
    "open_region",
    "require_zarr",
    "save",
    "storable",
    "write_region",
]

GROUP_FILE = "zarr.json"  # a node's metadata; the group's is the store's commit record
MAX_NODE_JSON = 1 << 26  # a zarr.json larger than 64 MiB is not read as a store
MAX_CHUNK_BYTES = 16 << 20  # chunks at most this large (a grid may make them smaller)
MAX_FILL_BYTES = 64 << 20  # what a read may make up from fill_value beyond the chunk files
MAX_FILL_CHUNKS = 1024  # absent chunks a read may fill (zarr looks up each one)
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

        from .. import zarr_dtypes  # noqa: F401 - registers bfloat16, float8, ...
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
        from ..convert import to_numpy

        out: np.ndarray = to_numpy(x, dtype=None if x.dtype is dst.torch else dst)
        return out
    a = np.asarray(x)
    if row_of(a) is dst:
        return a
    from ..convert import to_numpy, to_torch  # a cast: torch's kernel

    cast: np.ndarray = to_numpy(to_torch(a), dtype=dst)
    return cast


def storable(dtype: Any) -> DTypeRow:
    """The table row for ``dtype``, refusing the packed types no Zarr array holds as such."""
    from ..dtypes import resolve_dtype

    if is_torch_dtype(dtype):
        from ..dtypes import PACKED_BY_TORCH

        if dtype in PACKED_BY_TORCH:
            raise UnsupportedDtypeError(_PACKED_MESSAGE.format(PACKED_BY_TORCH[dtype].name))
    try:
        if not isinstance(dtype, (str, DTypeRow)) and not is_torch_dtype(dtype):
            packed = PACKED_BY_NUMPY.get(np.dtype(dtype))
            if packed is not None:
                raise UnsupportedDtypeError(_PACKED_MESSAGE.format(packed.name))
    except TypeError:
        pass
    return resolve_dtype(dtype)


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


# --- saving a whole state dict ----------------------------------------------------------------


def group_document(attributes: Mapping[str, Any]) -> bytes:
    """The group's ``zarr.json``: what commits a store (written last)."""
    doc = {"zarr_format": 3, "node_type": "group", "attributes": dict(attributes)}
    return json.dumps(doc, indent=2, allow_nan=False).encode()


def attributes(
    metadata: Mapping[str, Any] | None, keys: Sequence[str], where: str
) -> dict[str, Any]:
    """The group attributes for ``metadata`` and the tensors' order, checked to be JSON."""
    attrs: dict[str, Any] = {}
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or key == RESERVED:
            raise ValueError(
                f"{where}: metadata key {key!r} is not allowed (keys are strings, and "
                f"{RESERVED!r} is reserved); rename it"
            )
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            raise ValueError(
                f"{where}: metadata {key!r} = {value!r} is not a JSON value; pass a str, "
                "number, bool, None, list or dict"
            ) from None
        attrs[key] = value
    attrs[RESERVED] = {"keys": list(keys)}
    return attrs


def existing_arrays(path: Path) -> list[str]:
    """The arrays of a committed store at ``path`` (to remove once a new save commits).

    Raises:
        FormatError: ``path`` exists but is no Zarr store (it is left alone).
    """
    if not path.exists():
        return []
    if not (path / GROUP_FILE).is_file() and not (path.is_dir() and _only_staging(path)):
        raise FormatError(f"{path} exists and is no Zarr store; remove it or save to another path")
    return [p.name for p in path.iterdir() if p.is_dir() and (p / GROUP_FILE).is_file()]


def assembly(
    entries: list[tuple[str, DTypeRow, tuple[int, ...]]],
    target: Path,
    *,
    metadata: Mapping[str, Any] | None,
    max_shard_size: int | str | None = None,
    index: bool = False,
) -> StoreLayout:
    """A chunked checkpoint converted to the store ``target`` (the row's ``assembles``): one
    uncompressed array per tensor, staged, committed by the group's zarr.json (plain
    values its attributes), the arrays of an earlier save removed."""
    names = [n for n, _, _ in entries]
    check_names(names, repr(str(target)))
    attrs = attributes(metadata, names, repr(str(target)))
    stale = existing_arrays(target)
    with destination_errors(target, only_destination=True):  # a file in the way
        staging = begin_store(target, new_save_id())
    try:
        with destination_errors(target):  # a full disk, a file size limit
            placed = []
            for n, row, shape in entries:
                whole = [((0,) * len(shape), shape)]
                create_array(staging, n, shape, row, chunk_grid(shape, whole, row.itemsize))
                placed.append((n, str(staging / n), math.prod(shape) * row.itemsize))
    except BaseException:
        abandon(staging)
        raise

    def publish() -> None:
        with destination_errors(target):
            publish_store(target, staging, names, GROUP_FILE, group_document(attrs), stale)

    return StoreLayout(
        __name__,
        tuple(placed),
        publish,
        lambda: abandon(staging),
        tuple([target / n for n in names] + [target / GROUP_FILE]),
    )


def _only_staging(path: Path) -> bool:
    staged = set(pending(path))
    return all(p in staged for p in path.iterdir())


def save(
    tensors: Mapping[str, Any],
    path: str | os.PathLike[str],
    *,
    float_dtype: DTypeLike | None = None,
    metadata: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    chunk_bytes: int = DEFAULT_CHUNK,
    max_chunk_bytes: int = MAX_CHUNK_BYTES,
) -> None:
    """Write a mapping of names to tensors or arrays as a Zarr v3 store, one array each.

    Each tensor streams to its array about ``chunk_bytes`` at a time (cast on the way
    when ``float_dtype`` asks); the store is committed by its group ``zarr.json``,
    written last. An existing store at ``path`` is replaced (its arrays that the new
    save does not write are removed after the commit).

    >>> import os, tempfile, torch
    >>> p = os.path.join(tempfile.mkdtemp(), "m.zarr")
    >>> save({"w": torch.ones(2, 3, dtype=torch.bfloat16)}, p)
    >>> import zarr; zarr.open_array(p + "/w").dtype
    dtype(bfloat16)

    Args:
        tensors: a mapping of names (Zarr node names: no ``/``) to tensors or arrays.
        path: the store's directory (``.zarr`` by convention).
        float_dtype: cast floating-point values (only) to this dtype.
        metadata: JSON values kept in the group's attributes.
        progress: show a progress bar (``None``: when stderr is a terminal).
        chunk_bytes: about how many bytes are converted at a time.
        max_chunk_bytes: the largest chunk in the store.

    Raises:
        MissingExtraError: zarr is not installed.
        UnsupportedDtypeError: a dtype with no row in the dtype table, or packed float4.
        InvalidNameError: a name :data:`NAMES` refuses (no Zarr node name, a NUL, two
            names one directory on a case-insensitive filesystem).
        UnsupportedTensorError: not a mapping, a sparse tensor.
        FormatError: ``path`` exists and is no Zarr store.
    """
    require_zarr()
    path = Path(path)
    where = repr(str(path))
    if not isinstance(tensors, Mapping):
        raise UnsupportedTensorError(
            f"{where}: a Zarr store holds named arrays; pass a mapping such as "
            f"{{'x': array}}, not a {type(tensors).__qualname__}"
        )
    check_names(tensors, where)
    plans = []
    for name, x in tensors.items():
        try:
            plans.append((name, x, cast_target(_source_row(x), float_dtype)))
        except (UnsupportedDtypeError, UnsupportedTensorError) as err:
            raise type(err)(f"at {name!r}: {err}") from None
    total = sum(math.prod(x.shape) * dst.itemsize for _, x, dst in plans)
    bar = progress_bar(total, f"saving {path.name}", progress, tensors=len(plans))
    try:
        with (
            destination_errors(path),
            StoreWriter(path, metadata=metadata, max_chunk_bytes=max_chunk_bytes) as store,
        ):
            for name, x, dst in plans:
                array = store.create(name, tuple(int(n) for n in x.shape), dst)
                origin = (0,) * x.ndim
                bar.update(write_region(array, origin, x, dtype=dst, buffer_bytes=chunk_bytes))
    finally:
        bar.close()


class StoreWriter:
    """A store being written: arrays created in a staging directory, committed on exit.

    The one way tensorbridge's Zarr writers (:func:`save`, ``tb.ZarrWriter``, the
    conversion of DCP checkpoints) build a store: :meth:`create` makes each array
    (chunked to tile the ``blocks`` its writers will write), writers fill it with
    :func:`write_region`, and leaving the ``with`` block commits (:meth:`commit`: arrays
    moved into place, the group's ``zarr.json`` last, the previous save's other arrays
    removed) or, on an exception, abandons the staging directory, so the previous store
    (or none) stays.

    >>> import os, tempfile, numpy as np
    >>> p = os.path.join(tempfile.mkdtemp(), "s.zarr")
    >>> blocks = [((0, 0), (2, 3)), ((2, 0), (2, 3))]  # two writers' rows
    >>> with StoreWriter(p, metadata={"step": 1}) as store:
    ...     a = store.create("w", (4, 3), "float32", blocks=blocks)
    ...     for row in (0, 2):
    ...         _ = write_region(a, (row, 0), np.full((2, 3), row, np.float32))
    >>> load(p)["w"][:, 0].tolist(), a.chunks
    ([0.0, 0.0, 2.0, 2.0], (2, 3))

    Raises:
        FormatError: ``path`` exists and is no Zarr store.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        metadata: Mapping[str, Any] | None = None,
        max_chunk_bytes: int = MAX_CHUNK_BYTES,
    ) -> None:
        require_zarr()
        self.path = Path(path)
        self.metadata = dict(metadata or {})
        self.max_chunk_bytes = max_chunk_bytes
        self.names: list[str] = []
        self.saved: dict[str, Any] = {}  # more of tensorbridge's own group attribute
        attributes(self.metadata, [], repr(str(self.path)))  # refuse bad metadata up front
        self.stale = existing_arrays(self.path)
        with destination_errors(self.path, only_destination=True):  # a file in the way
            self.staging = begin_store(self.path, new_save_id(), owner=self)

    def create(
        self,
        name: str,
        shape: Sequence[int],
        dtype: DTypeLike,
        *,
        blocks: Iterable[tuple[Sequence[int], Sequence[int]]] | None = None,
    ) -> zarr_module.Array[Any]:
        """Create the array ``name``, chunked to tile ``blocks`` (default: one whole block)."""
        shape = tuple(int(n) for n in shape)
        row = storable(dtype)
        whole = [((0,) * len(shape), shape)]
        chunks = chunk_grid(shape, blocks or whole, row.itemsize, self.max_chunk_bytes)
        with destination_errors(self.path):
            array = create_array(self.staging, name, shape, row, chunks)
        self.names.append(name)
        return array

    def commit(self) -> None:
        """Move the arrays into place and write the group's ``zarr.json``, last."""
        attrs = attributes(self.metadata, self.names, repr(str(self.path)))
        attrs[RESERVED].update(self.saved)
        doc = group_document(attrs)
        with destination_errors(self.path):
            publish_store(self.path, self.staging, self.names, GROUP_FILE, doc, self.stale)

    def abandon(self) -> None:
        """Delete the staging directory: nothing of this save is committed."""
        abandon(self.staging)

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            try:
                self.commit()
                return
            except BaseException:
                self.abandon()
                raise
        self.abandon()


def _source_row(x: Any) -> DTypeRow:
    if is_tensor(x):
        import torch

        if x.layout is not torch.strided or x.is_nested:
            raise UnsupportedTensorError(
                f"a {x.layout} tensor has no dense Zarr layout; pass x.to_dense()"
            )
        if x.device.type == "meta":
            raise NoDataError(f"a meta tensor (shape {tuple(x.shape)}) holds no data to save")
        return storable(x.dtype)
    if isinstance(x, np.ndarray):
        if isinstance(x, np.ma.MaskedArray):
            raise UnsupportedTensorError("a masked array's mask would be lost; pass a.filled()")
        return storable(x.dtype.newbyteorder("=") if x.dtype.byteorder == ">" else x.dtype)
    raise UnsupportedTensorError(
        f"the value is a {type(x).__qualname__}; a Zarr store holds tensors or arrays"
    )


# --- reading --------------------------------------------------------------------------------


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


class ZarrFile(TensorFile):
    """A Zarr v3 store: its arrays by name, read whole into memory when asked.

    A group gives its arrays (in the order tensorbridge saved them, else by name) and
    its attributes as metadata; a bare array is one entry named after its directory.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_fill_bytes: int | None = MAX_FILL_BYTES,
        follow_links: bool = False,
    ) -> None:
        super().__init__()
        zarr = require_zarr()
        p = Path(path)
        self.path = p
        self.max_fill_bytes = max_fill_bytes
        self.follow_links = follow_links
        where = repr(str(p))
        links = Links.of(p, follow=follow_links)
        try:  # the version opened: a save replaces the store's zarr.json with the store
            self._version = identity(os.stat(p / GROUP_FILE))
        except OSError:
            self._version = (0, 0, 0, 0)
        kind = store_kind(p)
        if kind is None:
            if os.path.lexists(p / GROUP_FILE):  # a FIFO, a device, a link out: say which
                links.read(p / GROUP_FILE, MAX_NODE_JSON, GROUP_FILE)
            require_committed(p, GROUP_FILE, "Zarr store")  # raises: uncommitted, or missing
            raise FormatError(f"{where}: its {GROUP_FILE} is no Zarr v3 group or array")
        store = _confined_store(p, links)
        self._arrays: dict[str, Any] = {}
        self._values: dict[str, Any] = {}
        self._saved: dict[str, Any] = {}
        try:
            if kind == "array":
                self.single = True
                self._arrays[p.name.removesuffix(".zarr") or "x"] = zarr.open_array(
                    store, mode="r", zarr_format=3
                )
                return
            group = zarr.open_group(store, mode="r", zarr_format=3)
            attrs = dict(group.attrs)
            saved = attrs.pop(RESERVED, None)
            order = saved.get("keys") if isinstance(saved, dict) else None
            names = (
                list(order)
                if isinstance(order, list) and all(isinstance(n, str) for n in order)
                else sorted(group.array_keys())
            )
            for name in names:
                if "\x00" in name or any(len(part.encode()) > 255 for part in name.split("/")):
                    raise FormatError(  # checked first: such a name is no path at all
                        f"{where}: the group lists the array {name[:80]!r}, which is no "
                        "valid file name; its zarr.json is corrupt"
                    )
                node = group[name]
                if not isinstance(node, zarr.Array):
                    raise FormatError(
                        f"{where}: {name!r} is a Zarr group, not an array; tensorbridge "
                        "reads a group of arrays (open the subgroup's directory itself)"
                    )
                self._arrays[name] = node
        except FormatError:
            raise
        except (KeyError, ValueError, TypeError, RecursionError, ArithmeticError) as err:
            raise FormatError(f"{where}: not a readable Zarr v3 store: {err}") from None
        self._values = attrs
        self._saved = saved if isinstance(saved, dict) else {}
        self._check_version()  # the documents read are all of the version opened
        self.metadata = {k: v if isinstance(v, str) else json.dumps(v) for k, v in attrs.items()}

    def keys(self) -> list[str]:
        return list(self._arrays)

    def plain_values(self) -> dict[str, Any]:
        return dict(self._values)

    def saved_attributes(self) -> dict[str, Any]:
        """What tensorbridge recorded for itself in the group (the tensors' order, ...)."""
        return dict(self._saved)

    def _get(self, name: str) -> Any:
        if name not in self._arrays:
            raise KeyError(f"{name!r} is not in this file; its keys are {self.keys()[:10]}")
        return self._arrays[name]

    def info(self, name: str) -> tuple[DTypeRow, tuple[int, ...]]:
        from ..dtypes import resolve_dtype

        array = self._get(name)
        try:
            row = resolve_dtype(array.dtype.newbyteorder("="))
        except UnsupportedDtypeError:
            raise UnsupportedDtypeError(
                f"{str(self.path)!r}: array {name!r} holds {array.dtype}, which has no torch "
                "counterpart; read it with zarr directly"
            ) from None
        return row, tuple(int(n) for n in array.shape)

    def array(self, name: str) -> zarr_module.Array[Any]:
        """The zarr array itself, for reading regions (``f.array(name)[0:10]``).

        It reads the store's chunk files as they are when read: unlike ``f[name]``, it
        cannot tell whether another save replaced the store since it was opened.
        """
        array: zarr_module.Array[Any] = self._get(name)
        return array

    def _check_version(self) -> None:
        """Refuse to read on once the store was replaced since it was opened.

        A store is a directory of chunk files, read when asked for: they cannot all be
        held open. A save replaces the group's ``zarr.json`` (with the whole store, or
        last), so a read followed by this check that passes read the version opened.
        """
        check_same_version(self.path / GROUP_FILE, self._version, repr(str(self.path)))

    def _array(self, name: str, *, copy_on_write: bool) -> np.ndarray:
        a = self._owned(name)
        a.flags.writeable = copy_on_write
        return a

    def _owned(self, name: str) -> np.ndarray:
        self.info(name)  # refuses what has no row before reading anything
        # zarr fills absent chunks with fill_value (a store written with
        # write_empty_chunks=False has none for a zero tensor), so the declared shape,
        # not the chunk files, sets what a read allocates: refuse what no read could hold
        nbytes = self.nbytes(name)
        if nbytes > _physical_memory():
            raise FormatError(
                f"{str(self.path)!r}: array {name!r} declares {nbytes:,} bytes, more than "
                "this machine's memory; its zarr.json is corrupt (or read it in regions "
                "with f.array(name)[...])"
            )
        self._check_fill(name, nbytes)
        self._check_version()
        try:
            out: np.ndarray = np.asarray(self._get(name)[...])
        except FormatError:  # a chunk that is a FIFO, a device, a link out of the store
            raise
        except (ValueError, TypeError, KeyError, IndexError, ArithmeticError) as err:
            self._check_version()  # a store replaced while read is no corrupt one
            # zarr's codecs and indexers say so (a chunk of 0 elements divides by zero)
            raise FormatError(
                f"{str(self.path)!r}: array {name!r}: its chunks do not match its zarr.json "
                f"({err}); the store is corrupt"
            ) from None
        self._check_version()  # chunks of a store replaced meanwhile may be in ``out``
        if not out.dtype.isnative:
            out = out.astype(out.dtype.newbyteorder("="))
        return out

    def _check_fill(self, name: str, nbytes: int) -> None:
        """Refuse a read that zarr would mostly make up from ``fill_value``.

        An absent chunk reads as ``fill_value``, so a ``zarr.json`` declaring a large
        shape over few chunk files makes a read allocate far more than the store
        holds, and a fine chunk grid makes zarr look up each absent chunk (about
        0.3 ms apiece: a few bytes of JSON can ask for millions). zarr's own writers
        skip chunks equal to the fill value by default (``write_empty_chunks=False``),
        so a sparse store can be genuine; tensorbridge writes every chunk. The bytes
        the chunk files can account for (each file at most one chunk, or one shard)
        may be exceeded by ``max_fill_bytes``, and their count by
        ``MAX_FILL_CHUNKS``, no more.
        """
        limit = self.max_fill_bytes
        if limit is None:
            return
        array = self._get(name)
        outer = array.shards or array.chunks
        grid = math.prod(-(-n // max(c, 1)) for n, c in zip(array.shape, outer, strict=True))
        if nbytes <= limit and grid <= MAX_FILL_CHUNKS:
            return
        chunk_bytes = max(1, math.prod(outer) * array.dtype.itemsize)
        root = self.path if getattr(self, "single", False) else self.path / name
        files = 0
        for _, _, names in os.walk(root):
            files += sum(1 for f in names if f != GROUP_FILE)
            if nbytes - files * chunk_bytes <= limit and grid - files <= MAX_FILL_CHUNKS:
                return
        sparse = (
            "if the store is sparse by design (zarr's write_empty_chunks=False), read it "
            "with tensorbridge.io.zarr.open(path, max_fill_bytes=None), else its zarr.json "
            "is corrupt"
        )
        if grid - files > MAX_FILL_CHUNKS:
            raise FormatError(
                f"{str(self.path)!r}: array {name!r} declares {grid:,} chunks but the store "
                f"holds {files:,} chunk file{'s' if files != 1 else ''}: zarr would look up "
                f"each absent one; {sparse}"
            )
        raise FormatError(
            f"{str(self.path)!r}: array {name!r} declares {nbytes:,} bytes but its chunk "
            f"files hold at most {files * chunk_bytes:,}: zarr would fill the rest with its "
            f"fill_value; {sparse}"
        )


def _confined_store(path: Path, links: Links) -> Any:
    """A read-only zarr store of ``path`` that reads only regular files inside it.

    zarr's ``LocalStore`` reads a key with ``Path.read_bytes()``: a chunk or a
    ``zarr.json`` that is ``/dev/zero`` is read until memory runs out, a FIFO hangs
    the read, a link is followed anywhere. This store reads each key through
    :class:`~tensorbridge._files.Links` (a regular file, confined to the store
    unless links are followed) and by the bytes it holds.
    """
    return _store_class()(path, links)


@functools.cache
def _store_class() -> Any:
    import asyncio

    from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest
    from zarr.core.buffer import default_buffer_prototype
    from zarr.storage import LocalStore

    def read(links: Links, path: Path, byte_range: Any) -> bytes | None:
        try:
            f = links.open(path)
        except (FileNotFoundError, NotADirectoryError):
            return None  # an absent chunk: zarr fills it with the fill value
        with f:
            size = os.fstat(f.fileno()).st_size
            if byte_range is None:
                limit = MAX_NODE_JSON if path.name == GROUP_FILE else size
                return read_regular(f, path, limit, f"Zarr {path.name} ({size:,} bytes)")
            if isinstance(byte_range, RangeByteRequest):
                start, n = byte_range.start, byte_range.end - byte_range.start
            elif isinstance(byte_range, OffsetByteRequest):
                start, n = byte_range.offset, size - byte_range.offset
            elif isinstance(byte_range, SuffixByteRequest):
                start = max(0, size - byte_range.suffix)
                n = size - start
            else:  # pragma: no cover - zarr's three kinds of request
                raise FormatError(f"{path}: an unknown byte range {byte_range!r}")
            f.seek(max(0, start))
            return f.read(max(0, min(n, size - start)))

    class ConfinedStore(LocalStore):
        def __init__(self, root: Path, links: Links) -> None:
            super().__init__(root, read_only=True)
            self.links = links

        def with_read_only(self, read_only: bool = False) -> Any:
            return type(self)(self.root, self.links)

        async def get(self, key: str, prototype: Any = None, byte_range: Any = None) -> Any:
            prototype = prototype or default_buffer_prototype()
            if not self._is_open:
                await self._open()
            data = await asyncio.to_thread(read, self.links, self.root / key, byte_range)
            return None if data is None else prototype.buffer.from_bytes(data)

        async def get_partial_values(self, prototype: Any, key_ranges: Any) -> list[Any]:
            return [await self.get(key, prototype, r) for key, r in key_ranges]

    return ConfinedStore


def _physical_memory() -> int:
    """This machine's RAM in bytes (no limit where the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def open(
    path: str | os.PathLike[str],
    *,
    max_fill_bytes: int | None = MAX_FILL_BYTES,
    follow_links: bool = False,
) -> TensorFile:
    """Open a Zarr v3 store (a group of arrays, or one array) lazily.

    Reading an array whose chunk files account for less than its declared size by
    more than ``max_fill_bytes`` (zarr fills absent chunks with the fill value) raises
    :class:`~tensorbridge.errors.FormatError`; ``max_fill_bytes=None`` reads sparse
    stores (zarr skips chunks equal to the fill value by default) whatever they
    declare. A ``zarr.json`` or chunk that is a link leading out of the store raises
    :class:`~tensorbridge.errors.LinkError` unless ``follow_links=True``.

    >>> import os, tempfile, numpy as np
    >>> p = os.path.join(tempfile.mkdtemp(), "s.zarr")
    >>> save({"a": np.arange(3)}, p)
    >>> with open(p) as f:
    ...     f.keys(), f.info("a")[1]
    (['a'], (3,))

    Raises:
        UncommittedCheckpointError: a save into ``path`` never committed.
        FormatError: ``path`` is no Zarr v3 store.
    """
    return ZarrFile(path, max_fill_bytes=max_fill_bytes, follow_links=follow_links)


load = loader(
    open,
    """Read a Zarr store: a dict of its arrays (or tensors) by name.

    Arrays are read into memory (chunks are files); with ``mmap=True`` NumPy results
    are read-only, as every format's are.
    """,
)
