"""A DCP checkpoint's ``.metadata``: unpickled by the pickle machine, checked into plain data.

DCP's ``Metadata`` pickle names torch's classes; here only those DCP writes are let
through (as inert records of :mod:`tensorbridge.io.pickle_machine`, never built), then
read field by field into a :class:`CheckpointMetadata` of plain values: each key's
:class:`TensorEntry` (dtype, shape, stored boxes) and each item's :class:`StoredItem`
(file, offset, length). The reader (:mod:`.reader`) works from that alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..._filemap import read_small
from ..._files import Links
from ..._keys import broken, no_nul, not_empty, one_file_name, valid_unicode
from ...errors import FormatError
from ..pickle_machine import DICTS, Opaque, unpickle

__all__ = [
    "MAX_METADATA",
    "METADATA_FILE",
    "CheckpointMetadata",
    "StoredItem",
    "TensorEntry",
    "read_metadata",
]

METADATA_FILE = ".metadata"
MAX_METADATA = 1 << 30  # a .metadata larger than this is no checkpoint's


# a .distcp file an item names: one file of the checkpoint's directory (tensorbridge._keys)
_FILE_NAME = (not_empty, no_nul, valid_unicode, one_file_name)

_DCP = "torch.distributed.checkpoint.metadata"
_OLD = "torch.distributed._shard.sharded_tensor.metadata"  # torch 2.0 - 2.2 pickled these
_ALLOWED = {
    (_DCP, "Metadata"),
    (_DCP, "TensorStorageMetadata"),
    (_DCP, "BytesStorageMetadata"),
    (_DCP, "ChunkStorageMetadata"),
    (_DCP, "TensorProperties"),
    (_DCP, "_MEM_FORMAT_ENCODING"),
    (_DCP, "MetadataIndex"),
    (_DCP, "StorageMeta"),
    (_OLD, "TensorProperties"),
    (_OLD, "MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "PureWindowsPath"),
}


_PLACEHOLDERS = frozenset(
    f"{module}.{name}"
    for module, name in _ALLOWED
    if module not in ("torch", "torch.serialization", "collections")
)  # DCP's classes: inert records of the pickle machine, read below field by field


@dataclass(frozen=True)
class TensorEntry:
    """A ``TensorStorageMetadata``, as plain data: dtype, global shape, stored boxes."""

    dtype: torch.dtype
    size: tuple[int, ...]
    chunks: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]  # (offsets, sizes) each


@dataclass(frozen=True)
class StoredItem:
    """A ``_StorageInfo``, as plain data: where an item's bytes lie."""

    relative_path: str
    offset: int
    length: int
    transforms: tuple[str, ...]  # stream transforms (compression): only DCP's reader undoes them

    @property
    def transformed(self) -> bool:
        return bool(self.transforms)


@dataclass(frozen=True)
class CheckpointMetadata:
    """A DCP ``Metadata``, as plain data, checked: what :class:`DcpFile` reads from.

    ``entries`` maps each state-dict key to its :class:`TensorEntry`, or ``None`` for a
    value stored as bytes; ``storage`` maps ``(key, chunk offsets or None)`` to its
    :class:`StoredItem`.
    """

    entries: dict[str, TensorEntry | None]
    storage: dict[tuple[str, tuple[int, ...] | None], StoredItem]


def read_metadata(path: str | os.PathLike[str], links: Links | None = None) -> CheckpointMetadata:
    """A DCP ``.metadata`` file, through the pickle machine, checked field by field.

    ``path`` is the checkpoint directory or its ``.metadata`` file; ``links`` confines
    it to the checkpoint's directory (default: no confinement, the caller named it).
    DCP's classes become inert records of the machine (nothing of torch's is built or
    called), read into a :class:`CheckpointMetadata` of plain values.

    Raises:
        FormatError: a global that is not DCP metadata (nothing of it is called), a
            malformed pickle, or fields of the wrong types or out of range.
    """
    p = Path(path)
    if p.is_dir():
        p = p / METADATA_FILE
    raw = read_small(p, MAX_METADATA, "DCP .metadata file", links)
    try:
        meta = unpickle(raw, placeholders=_PLACEHOLDERS)
    except FormatError as err:
        raise FormatError(
            f"{p}: refused to unpickle: {err}; tensorbridge reads only the classes "
            "torch.distributed.checkpoint writes (if you trust the file, load it with "
            "torch.distributed.checkpoint itself)"
        ) from None
    return _check_metadata(p, meta)


def _fields(obj: Any) -> dict[str, Any]:
    """A record's fields: its ``BUILD`` state (a dict, or ``(dict, slots)``)."""
    state = obj.state if isinstance(obj, Opaque) else None
    if type(state) is tuple and len(state) == 2:
        out = dict(state[0]) if type(state[0]) in DICTS else {}
        if type(state[1]) in DICTS:
            out.update(state[1])
        return out
    return dict(state) if isinstance(state, dict) else {}  # a dict or an OrderedDict


def _is(obj: Any, name: str) -> bool:
    return isinstance(obj, Opaque) and obj.args is not None and obj.name.rsplit(".", 1)[1] == name


def _check_metadata(p: Path, meta: Any) -> CheckpointMetadata:
    def bad(what: str) -> FormatError:
        return FormatError(f"{p}: {what}; the checkpoint's metadata is corrupt")

    if not _is(meta, "Metadata"):
        held = meta.name if isinstance(meta, Opaque) else type(meta).__qualname__
        raise bad(f"it holds a {held}, not a DCP Metadata")
    fields = _fields(meta)
    sdm = fields.get("state_dict_metadata")
    if not isinstance(sdm, dict):  # a dict or an OrderedDict
        raise bad("state_dict_metadata is not a dict")
    entries: dict[str, TensorEntry | None] = {}
    for key, item in sdm.items():
        if type(key) is not str:
            raise bad(f"the state-dict key {key!r:.80} is not a string")
        if _is(item, "BytesStorageMetadata"):
            entries[key] = None
            continue
        if not _is(item, "TensorStorageMetadata"):
            held = item.name if isinstance(item, Opaque) else type(item).__qualname__
            raise bad(f"{key!r} is described by a {held}")
        tsm = _fields(item)
        props = tsm.get("properties")
        state = (
            props.state if isinstance(props, Opaque) and _is(props, "TensorProperties") else None
        )
        # torch >= 2.3 pickles (dtype, layout, requires_grad, memory_format, pin_memory)
        dtype = state[0] if type(state) is tuple and state else _fields(props).get("dtype")
        if not isinstance(dtype, torch.dtype):
            raise bad(f"{key!r} has no dtype")
        shape = _ints(tsm.get("size"))
        chunks = tsm.get("chunks")
        if shape is None or type(chunks) is not list:
            raise bad(f"{key!r} has no shape or chunk list")
        boxes = []
        for c in chunks:
            box = _fields(c)
            off, size = _ints(box.get("offsets")), _ints(box.get("sizes"))
            if (
                not _is(c, "ChunkStorageMetadata")
                or off is None
                or size is None
                or len(off) != len(shape)
                or len(size) != len(shape)
                or any(o + s > n for o, s, n in zip(off, size, shape, strict=True))
            ):
                raise bad(f"a chunk of {key!r} lies outside its shape {list(shape)}")
            boxes.append((off, size))
        entries[key] = TensorEntry(dtype, shape, tuple(boxes))
    storage_data = fields.get("storage_data")
    if not isinstance(storage_data, dict):  # a dict or an OrderedDict
        raise bad("storage_data is not a dict (not written by FileSystemWriter)")
    storage: dict[tuple[str, tuple[int, ...] | None], StoredItem] = {}
    for index, info in storage_data.items():
        where, stored = _fields(index), _fields(info)
        fqn, offset = where.get("fqn"), where.get("offset")
        offsets = None if offset is None else _ints(offset)
        if (
            not _is(index, "MetadataIndex")
            or type(fqn) is not str
            or (offset is not None and offsets is None)
            or not _is(info, "_StorageInfo")
        ):
            raise bad("storage_data maps something other than MetadataIndex -> _StorageInfo")
        rel = stored.get("relative_path")
        if not _file_name(rel):
            shown = repr(rel[:80]) if type(rel) is str else f"a {type(rel).__qualname__}"
            raise bad(f"the item of {fqn!r} names the file {shown}, not one in the directory")
        start, length = stored.get("offset"), stored.get("length")
        if type(start) is not int or type(length) is not int or start < 0 or length < 0:
            raise bad(f"the item of {fqn!r} has no valid offset and length")
        transforms = stored.get("transform_descriptors") or []
        if type(transforms) not in (list, tuple) or not all(type(t) is str for t in transforms):
            raise bad(f"the item of {fqn!r} has transforms that are not names")
        storage[(fqn, offsets)] = StoredItem(str(rel), start, length, tuple(transforms))
    return CheckpointMetadata(entries, storage)


def _file_name(rel: Any) -> bool:
    """Whether ``rel`` (a plain ``str``) names a file in the checkpoint directory itself."""
    return (
        type(rel) is str
        and broken(rel, _FILE_NAME) is None
        and len(rel.encode("utf-8")) <= 255  # no longer than a file name can be
    )


def _ints(x: Any) -> tuple[int, ...] | None:
    if type(x) not in (tuple, list, torch.Size) or not all(type(v) is int and v >= 0 for v in x):
        return None
    return tuple(x)
