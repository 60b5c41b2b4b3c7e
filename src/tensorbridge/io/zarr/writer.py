"""Writing a whole Zarr store: :func:`save` and :class:`StoreWriter`, committed atomically.

A store is built in a staging directory and committed by its group ``zarr.json``,
written last (the layout and the commit are described in :mod:`tensorbridge.io.zarr`).
:class:`StoreWriter` is the one way tensorbridge's Zarr writers (:func:`save`,
``tb.ZarrWriter``, the conversion of DCP checkpoints) make a store; the region-level
pieces it uses are :mod:`.store`'s.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._atomic import destination_errors
from ..._chunks import DEFAULT_CHUNK
from ..._commit import abandon, begin_store, new_save_id, pending, publish_store
from ..._keys import mapping_of
from ..._progress import progress_bar
from ..._tensorfile import cast_target
from ..._torch_checks import is_tensor
from ...dtypes import DTypeLike, DTypeRow, resolve_dtype
from ...errors import FormatError, NoDataError, UnsupportedDtypeError, UnsupportedTensorError
from .._formats import StoreLayout
from .store import (
    GROUP_FILE,
    MAX_CHUNK_BYTES,
    RESERVED,
    check_names,
    chunk_grid,
    create_array,
    require_zarr,
    storable,
    write_region,
)

if TYPE_CHECKING:
    import zarr as zarr_module

__all__ = ["StoreWriter", "attributes", "existing_arrays", "group_document", "save"]


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
        write_region.__module__,  # the store module: its open_region opens each array
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
    check_names(mapping_of(tensors, where, "named arrays"), where)
    plans = []
    for name, x in tensors.items():
        try:
            plans.append((name, x, storable(cast_target(_source_row(x), float_dtype))))
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
        return storable(x.dtype)  # torch's packed float4 refused before any cast
    if isinstance(x, np.ndarray):
        if isinstance(x, np.ma.MaskedArray):
            raise UnsupportedTensorError("a masked array's mask would be lost; pass a.filled()")
        return resolve_dtype(x.dtype.newbyteorder("=") if x.dtype.byteorder == ">" else x.dtype)
    raise UnsupportedTensorError(
        f"the value is a {type(x).__qualname__}; a Zarr store holds tensors or arrays"
    )
