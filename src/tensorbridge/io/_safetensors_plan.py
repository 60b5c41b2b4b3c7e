"""Planning a safetensors save: each tensor's header entry, ties, shards, headers, layout.

Before :func:`tensorbridge.io.safetensors.save` writes a byte, every value is checked
and given its header entry (:class:`Item`: stored dtype, shape, size), tied values are
written once (:func:`dedupe`), the tensors are split into shards and each file's header
made (:func:`split_shards`, :func:`header_bytes`). :func:`layout` gives the same files,
headers and offsets for tensors that exist only as names, dtypes and shapes, and
:func:`assembly` is the format row's ``assembly`` built on it (a chunked checkpoint
converted). :mod:`tensorbridge.io.safetensors` re-exports :data:`NAMES`,
:class:`FileLayout`, :func:`layout` and :func:`assembly`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._keys import NameRules, mapping_of, no_nul, reserved_name, valid_unicode
from .._packed import PSEUDO_ROWS
from .._tensorfile import Deferred, StoredBits, cast_target, check_dense, row_of
from .._torch_checks import is_tensor
from ..dtypes import (
    DTypeRow,
    packed_of_numpy,
)
from ..errors import (
    UnsupportedDtypeError,
    UnsupportedTensorError,
)
from ._detect import INDEX_SUFFIX
from ._formats import Layout, PlannedFile
from ._safetensors_shards import index_json, parse_size, remove_stale, stale_files
from .safetensors_header import (
    LAYOUT_RANK,
    bit_width,
    encode,
    unheld,
)

# a header key is any JSON string; the rules of tensorbridge._keys that apply to it
NAMES = NameRules((no_nul, valid_unicode, reserved_name("__metadata__", "the header's metadata")))


@dataclass(frozen=True)
class Item:
    """One tensor to write: where its bytes come from and what the header says."""

    name: str
    value: Any  # the tensor or array as given
    src: DTypeRow
    row: DTypeRow  # as stored, after float_dtype
    shape: tuple[int, ...]  # as in the header (F4: values, not bytes)
    nbytes: int


def plan_items(tensors: Mapping[str, Any], float_dtype: Any, target: Path) -> list[Item]:
    """Check every value and work out its header entry before a byte is written."""
    NAMES.check(mapping_of(tensors, repr(str(target))), repr(str(target)))
    items = []
    for name, value in tensors.items():
        try:
            items.append(make_item(name, value, float_dtype))
        except (TypeError, ValueError) as e:
            raise type(e)(f"cannot save tensor {name!r} to {target}: {e}") from e
    return items


def dedupe(items: list[Item]) -> tuple[list[Item], dict[str, str]]:
    """Tied weights written once: names whose values are the same memory, viewed the same way.

    The first name in the mapping's order is kept (for a language model, the input
    embedding before ``lm_head``, the one ``transformers`` keeps); each other name is
    recorded in the metadata as ``{name: kept}``, the convention of safetensors'
    ``save_model``, which this module's reader (and ``load_model``) restore ties from.
    """
    kept: dict[tuple[Any, ...], str] = {}
    out, tied = [], {}
    for it in items:
        key = _alias_key(it)
        if key is not None and key in kept:
            tied[it.name] = kept[key]
            continue
        if key is not None:
            kept[key] = it.name
        out.append(it)
    return out, tied


def _alias_key(it: Item) -> tuple[Any, ...] | None:
    """What makes two values the same bytes on disk: memory, layout, dtype and the cast."""
    v = it.value
    if it.nbytes == 0:
        return None
    if is_tensor(v):
        where: tuple[Any, ...] = (str(v.device), v.data_ptr(), tuple(v.stride()))
    elif isinstance(v, np.ndarray):
        where = ("cpu", v.__array_interface__["data"][0], v.strides)
    else:
        return None
    return (*where, it.shape, str(v.dtype), it.row.name)


def make_item(name: Any, value: Any, float_dtype: Any) -> Item:
    if not isinstance(name, str):
        raise TypeError(f"tensor names must be str, got {type(name).__qualname__}; pass str(name)")
    if is_tensor(value):
        from ..dtypes import PACKED_BY_TORCH

        check_dense(value)
        packed = PACKED_BY_TORCH.get(value.dtype)
        if packed is not None and packed in PSEUDO_ROWS:
            if value.ndim == 0:
                raise UnsupportedTensorError(
                    f"a 0-d {packed.name} tensor has no last dimension to count its "
                    f"{packed.per_byte} values a byte in; pass x.reshape(1)"
                )
            shape = (*value.shape[:-1], packed.per_byte * value.shape[-1])
            src = PSEUDO_ROWS[packed]
        else:
            src, shape = row_of(value), tuple(value.shape)
    elif isinstance(value, (Deferred, StoredBits)):
        src, shape = value.row, value.shape
    elif isinstance(value, np.ndarray):
        if isinstance(value, np.ma.MaskedArray):
            raise UnsupportedTensorError("a masked array's mask would be lost; pass a.filled()")
        one_a_byte = packed_of_numpy(value.dtype)
        src = PSEUDO_ROWS[one_a_byte] if one_a_byte in PSEUDO_ROWS else row_of(value)
        shape = value.shape
    else:
        raise UnsupportedTensorError(
            f"the value is a {type(value).__qualname__}; safetensors stores torch.Tensor or "
            "np.ndarray values (pass torch.as_tensor(x))"
        )
    row = cast_target(src, float_dtype)
    if row.safetensors is None:
        raise UnsupportedDtypeError(unheld(row))
    count = math.prod(shape)
    if count * bit_width(row) % 8:
        raise UnsupportedTensorError(
            f"{count} float4 values do not fill whole bytes; pad to an even number of values"
        )
    return Item(name, value, src, row, tuple(int(d) for d in shape), count * bit_width(row) // 8)


def file_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    meta = {"format": "pt"}
    if metadata is not None:
        if not isinstance(metadata, Mapping):
            raise TypeError(
                f"metadata must be a mapping of str to str, got {type(metadata).__qualname__}"
            )
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError(
                    f"metadata must map str to str; metadata[{k!r}] = {v!r} "
                    f"({type(k).__qualname__} -> {type(v).__qualname__}); pass str() of both"
                )
        meta.update(metadata)
    return dict(sorted(meta.items()))


def split_shards(items: list[Item], limit: int) -> list[list[Item]]:
    """Greedy in the mapping's order; a tensor larger than ``limit`` gets a shard of its own."""
    shards: list[list[Item]] = []
    size = 0
    for it in items:
        if not shards or size + it.nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(it)
        size += it.nbytes
    return shards


def header_bytes(items: list[Item], metadata: dict[str, str]) -> bytes:
    return encode(
        [(it.name, it.row.safetensors or "", it.shape, it.nbytes) for it in items], metadata
    )


@dataclass(frozen=True)
class FileLayout:
    """One file of a planned save: its name, header bytes, size, and where each tensor goes."""

    name: str  # in the destination's directory
    header: bytes
    size: int  # header and data
    offsets: dict[str, int]  # tensor name -> absolute offset of its bytes in the file


def layout(
    entries: list[tuple[str, DTypeRow, tuple[int, ...]]],
    target: Path,
    *,
    metadata: Mapping[str, str] | None = None,
    max_shard_size: int | str | None = None,
    index: bool = False,
) -> tuple[list[FileLayout], bytes | None]:
    """The files :func:`save` would write for tensors of these names, dtypes and shapes.

    Byte for byte :func:`save`'s headers and offsets (its shard split, its order), so
    a writer that fills each tensor's bytes at its offset, in any order or in
    parallel, produces the file :func:`save` would. Returns the files and the shard
    index's bytes (None for a single file).

    >>> import tensorbridge as tb
    >>> files, idx = layout([("w", tb.resolve_dtype("f32"), (2,))], Path("m.safetensors"))
    >>> [(f.name, f.size, f.offsets) for f in files], idx
    ([('m.safetensors', 104, {'w': 96})], None)
    """
    NAMES.check((name for name, _, _ in entries), repr(str(target)))
    items = []
    for name, row, shape in entries:
        if row.safetensors is None:
            raise UnsupportedDtypeError(
                f"cannot save tensor {name!r} to {target}: {row.name} has no safetensors dtype "
                "code; pass float_dtype= or convert it to a dtype safetensors has"
            )
        make_item(name, np.empty(0, np.uint8), None)  # the name's checks
        nbytes = math.prod(shape) * row.itemsize
        items.append(Item(name, None, row, row, tuple(shape), nbytes))
    meta = file_metadata(metadata)
    limit = parse_size(max_shard_size)
    shards = split_shards(items, limit) if limit is not None else [items]
    single = len(shards) <= 1 and not index
    stem, n = target.name.removesuffix(".safetensors"), len(shards)
    files: list[FileLayout] = []
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards, 1):
        name = target.name if single else f"{stem}-{i:05d}-of-{n:05d}.safetensors"
        ordered = sorted(
            shard, key=lambda it: (LAYOUT_RANK.get(it.row.safetensors or "", 0), it.name)
        )
        header = header_bytes(ordered, meta)
        offsets, at = {}, len(header)
        for it in ordered:
            offsets[it.name] = at
            at += it.nbytes
        files.append(FileLayout(name, header, at, offsets))
        weight_map.update((it.name, name) for it in shard)
    if single:
        return files, None
    return files, index_json(weight_map, sum(it.nbytes for it in items))


def assembly(
    entries: list[tuple[str, DTypeRow, tuple[int, ...]]],
    target: Path,
    *,
    metadata: Mapping[str, str] | None,
    max_shard_size: int | str | None,
    index: bool,
) -> Layout:
    """A chunked checkpoint converted to ``target`` (the row's ``assembles``): the files of
    :func:`layout`, the shards committed with their index and replacing an earlier save's.
    """
    files, index_bytes = layout(
        entries, target, metadata=metadata, max_shard_size=max_shard_size, index=index
    )
    nbytes = {n: math.prod(shape) * row.itemsize for n, row, shape in entries}
    where = target.parent
    planned = tuple(PlannedFile(where / fl.name, fl.header, fl.size) for fl in files)
    placed = tuple(
        (n, where / fl.name, off, nbytes[n]) for fl in files for n, off in fl.offsets.items()
    )
    if index_bytes is None:
        return Layout(where, planned, placed, after=lambda: remove_stale(target))
    return Layout(
        where,
        planned,
        placed,
        index=(target.name + INDEX_SUFFIX, index_bytes),
        replaces=lambda: stale_files(target),
    )
