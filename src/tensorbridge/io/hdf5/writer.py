"""Writing HDF5 files: :func:`save` (every dataset contiguous and aligned, streamed, atomic).

The layout is in :mod:`tensorbridge.io.hdf5`. A save checks every name, tensor and
metadata value first; h5py then writes the file's structure into a temporary file
beside the destination (groups, each dataset's type, shape and storage, allocated
early, 64-byte aligned, never filled, and the attributes), and the values are streamed
into each dataset's bytes a chunk at a time (:func:`tensorbridge._chunks.iter_bytes`)
before the file is renamed into place (:func:`tensorbridge._atomic.atomic_write`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..._atomic import atomic_write
from ..._chunks import DEFAULT_CHUNK, iter_bytes, write_counted
from ..._keys import NameRules, mapping_of, no_nul, not_empty, valid_unicode
from ..._progress import progress_bar
from ..._tensorfile import cast_target, check_dense, row_of
from ..._torch_checks import is_tensor
from ...dtypes import DTypeLike, DTypeRow
from ...errors import InvalidArgumentError, InvalidNameError, UnsupportedTensorError
from .datatypes import MARKER, file_type, marker_of, require_h5py

__all__ = ["ALIGNMENT", "NAMES", "save"]

ALIGNMENT = 64  # every dataset's bytes start at a multiple of it (as .npz members, safetensors)


def hdf5_path(name: str) -> str | None:
    """A name that becomes an HDF5 path: ``/`` separates groups, so no empty part (a
    leading, trailing or double ``/``) and no ``.`` part (HDF5's name for the group itself)."""
    parts = name.split("/")
    if any(not p for p in parts):
        return "it has an empty path component (a leading, trailing or doubled '/')"
    if any(p in (".", "..") for p in parts):
        return "it has a '.' or '..' component, which HDF5 paths do not take as a name"
    return None


# HDF5 stores names as NUL-terminated UTF-8 strings
NAMES = NameRules((not_empty, no_nul, valid_unicode, hdf5_path))


@dataclass(frozen=True)
class _Item:
    name: str
    value: Any
    row: DTypeRow  # as stored (after float_dtype=)
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.row.itemsize


def save(
    tensors: Mapping[str, Any],
    path: str | os.PathLike[str],
    *,
    float_dtype: DTypeLike | None = None,
    metadata: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    chunk_bytes: int = DEFAULT_CHUNK,
) -> None:
    """Write tensors or arrays to an HDF5 file, one contiguous dataset each, streamed and atomic.

    A name's ``/`` makes groups (``layers/dense/vars/0`` is Keras' layout, so a Keras
    model loads such a file with ``model.load_weights``); bfloat16, the float8 types and
    complex32 are opaque bytes with a ``dtype`` attribute naming them, as Keras stores
    bfloat16.

    >>> import os, tempfile, ml_dtypes, numpy as np
    >>> from tensorbridge.io import hdf5
    >>> p = os.path.join(tempfile.mkdtemp(), "w.h5")
    >>> save({"a/b": np.ones(2, ml_dtypes.bfloat16)}, p, metadata={"epoch": 3})
    >>> with hdf5.open(p) as f:
    ...     f.keys(), f["a/b"].dtype, f.plain_values()
    (['a/b'], dtype(bfloat16), {'epoch': 3})

    Args:
        tensors: names to tensors or arrays of any dtype of the table.
        path: the file to write (replaced atomically: temporary file, fsync, rename).
        float_dtype: store floating-point values as this dtype (cast chunk by chunk).
        metadata: attributes: a key ``NAME`` is the root group's, ``PATH@NAME`` that
            of the dataset or group ``PATH`` (what the reader gives back). Strings,
            bools, numbers, NumPy arrays and lists of strings or of numbers are stored
            as they are; other values (dicts, None) as JSON text.
        progress: show a progress bar (``None``: when stderr is a terminal).
        chunk_bytes: about how many bytes to hold at once when casting.

    Raises:
        InvalidNameError: a name :data:`NAMES` refuses, or a name that is both a
            tensor and a group (``a`` and ``a/b``).
        UnsupportedDtypeError: a dtype with no row in the table (a packed type).
        UnsupportedTensorError: not a mapping, or a value that is no dense tensor or array.
        InvalidArgumentError: a metadata value HDF5 cannot store.
    """
    target = Path(path)
    where = repr(str(target))
    NAMES.check(mapping_of(tensors, where), where)
    _check_groups(list(tensors), where)
    items = []
    for name, value in tensors.items():
        try:
            items.append(_item(name, value, float_dtype))
        except (TypeError, ValueError) as e:
            raise type(e)(f"cannot save tensor {name!r} to {where}: {e}") from e
    attrs = _attributes(metadata, items, where)
    h5py = require_h5py()
    bar = progress_bar(
        sum(it.nbytes for it in items), f"saving {target.name}", progress, tensors=len(items)
    )
    try:
        with atomic_write(target, readable=True) as f:
            offsets = _structure(h5py, f, items, attrs, where)
            for it, offset in zip(items, offsets, strict=True):
                if offset is None:
                    continue
                f.seek(offset)
                chunks = iter_bytes(it.value, it.row, chunk_bytes)
                write_counted(f, chunks, it.name, it.nbytes, bar, "its dataset holds")
    finally:
        bar.close()


def _check_groups(names: list[Any], where: str) -> None:
    """Refuse a name that is both a tensor and a group of another tensor's path."""
    given = {n for n in names if isinstance(n, str)}
    for name in given:
        parts = name.split("/")
        for i in range(1, len(parts)):
            group = "/".join(parts[:i])
            if group in given:
                raise InvalidNameError(
                    f"{where}: the tensors {group!r} and {name!r} cannot both be stored: "
                    f"{group!r} would be a dataset and the group holding {name!r}; rename one"
                )


def _item(name: Any, value: Any, float_dtype: Any) -> _Item:
    if is_tensor(value):
        check_dense(value)
    elif not isinstance(value, np.ndarray) or isinstance(value, np.ma.MaskedArray):
        raise UnsupportedTensorError(
            f"the value is a {type(value).__qualname__}; HDF5 datasets hold torch.Tensor or "
            "np.ndarray values (pass torch.as_tensor(x))"
        )
    row = cast_target(row_of(value), float_dtype)
    return _Item(name, value, row, tuple(int(d) for d in value.shape))


def _attributes(
    metadata: Mapping[str, Any] | None, items: list[_Item], where: str
) -> list[tuple[str, str, Any]]:
    """``(object path, attribute name, value)`` for each metadata key, values checked."""
    paths = {it.name for it in items}
    marked = {it.name: marker_of(it.row) for it in items if marker_of(it.row) is not None}
    paths |= {it.name.rsplit("/", i)[0] for it in items for i in range(1, it.name.count("/") + 1)}
    out = []
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not key or "\x00" in key:
            raise InvalidArgumentError(
                f"{where}: metadata key {key!r} is no attribute name; pass non-empty str keys"
            )
        obj, at, attr = key.rpartition("@")
        if not (at and obj in paths and attr):
            obj, attr = "", key  # the root's (a name may hold '@' itself)
        if attr == MARKER and obj in marked:
            raise InvalidArgumentError(
                f"{where}: metadata {key!r} would replace the {MARKER!r} attribute that names "
                f"{obj!r}'s type ({marked[obj]}); leave it out of metadata="
            )
        out.append((obj, attr, _attribute_value(key, value, where)))
    return out


def _attribute_value(key: str, value: Any, where: str) -> Any:
    if isinstance(value, (str, bool, int, float, np.generic, np.ndarray)):
        return value
    if isinstance(value, (list, tuple)) and (
        all(isinstance(v, str) for v in value)
        or all(isinstance(v, (bool, int, float)) for v in value)
    ):
        return list(value)
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"{where}: metadata {key!r} is a {type(value).__qualname__}, which HDF5 cannot "
            "store as an attribute; pass a string, number, list or array"
        ) from None


def _structure(
    h5py: Any, f: Any, items: list[_Item], attrs: list[tuple[str, str, Any]], where: str
) -> list[int | None]:
    """Write the file's groups, datasets (allocated, not filled) and attributes through
    h5py into ``f``; each dataset's byte offset in it (None: no bytes)."""
    h5d, h5p, h5s = h5py.h5d, h5py.h5p, h5py.h5s
    offsets: list[int | None] = []
    with h5py.File(
        f, "w", track_order=True, alignment_threshold=1, alignment_interval=ALIGNMENT
    ) as h:
        groups: dict[str, Any] = {"": h.id}
        for it in items:
            parent, _, leaf = it.name.rpartition("/")
            gid = _group(h5py, groups, parent)
            dcpl = h5p.create(h5p.DATASET_CREATE)
            dcpl.set_layout(h5d.CONTIGUOUS)
            dcpl.set_alloc_time(h5d.ALLOC_TIME_EARLY)  # the bytes' place known now, ...
            dcpl.set_fill_time(h5d.FILL_TIME_NEVER)  # ... written below, once
            dcpl.set_obj_track_times(False)  # the same tensors make the same file
            space = h5s.create_simple(it.shape) if it.shape else h5s.create(h5s.SCALAR)
            dsid = h5d.create(gid, leaf.encode(), file_type(it.row), space, dcpl=dcpl)
            marker = marker_of(it.row)
            if marker is not None:
                h5py.Dataset(dsid).attrs[MARKER] = marker
            offset = dsid.get_offset() if it.nbytes else None
            offsets.append(None if offset is None else int(offset))
        for obj, attr, value in attrs:
            holder = h if not obj else h[obj]
            try:
                holder.attrs[attr] = value
            except (TypeError, ValueError, OverflowError) as err:
                raise InvalidArgumentError(
                    f"{where}: metadata {attr!r} ({type(value).__qualname__}) cannot be an HDF5 "
                    f"attribute ({err}); pass a string, number, list or array"
                ) from None
    return offsets


def _group(h5py: Any, groups: dict[str, Any], path: str) -> Any:
    """The group ``path`` (created with its parents, links kept in creation order)."""
    gid = groups.get(path)
    if gid is not None:
        return gid
    parent, _, leaf = path.rpartition("/")
    above = _group(h5py, groups, parent)
    gcpl = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
    tracked = h5py.h5p.CRT_ORDER_TRACKED | h5py.h5p.CRT_ORDER_INDEXED
    gcpl.set_link_creation_order(tracked)
    gcpl.set_obj_track_times(False)
    gid = groups[path] = h5py.h5g.create(above, leaf.encode(), gcpl=gcpl)
    return gid
