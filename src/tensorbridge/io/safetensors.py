"""Safetensors files, single and sharded: written like the official library, read without trust.

The format: an unsigned little-endian 64-bit header length ``N``, ``N`` bytes of
UTF-8 JSON (padded with spaces so the data starts 8-byte aligned), then the raw
little-endian tensor bytes. The header maps each name to its ``dtype`` code,
``shape`` and ``data_offsets`` ``[begin, end)`` relative to the data; the optional
``"__metadata__"`` maps strings to strings.

Writing matches the official writer byte for byte for the same tensors and
metadata: tensors laid out by dtype (its order, widest first) then by name, the
compact JSON, the padding. ``{"format": "pt"}`` is added to the metadata, as
Hugging Face writers do, and metadata keys are sorted (the official writer's
order is a hash map's). Unlike the official writer, :func:`save` streams: the
header comes from names, dtypes and shapes, then each tensor's bytes go to the
file a chunk at a time straight from its memory (cast on the way for
``float_dtype``), inside an atomic write. It also takes NumPy arrays,
non-contiguous tensors and tied tensors (each name gets its own copy of the
bytes; the official ``save_file`` refuses shared memory).

``F4`` (two float4_e2m1fn values a byte, element ``2i`` in the low nibble) is
stored from and loaded as torch ``float4_e2m1fn_x2`` (packed, the last dimension
halved) or ml_dtypes ``float4_e2m1fn`` (one value a byte; unpacking makes new
memory); the header shape counts values, like the official writer's.

Reading validates the whole header before anything else is touched; every
malformed file raises :class:`~tensorbridge.errors.FormatError` naming the file,
the tensor and the fault. Sharded checkpoints follow the Hugging Face layout
(``model-00001-of-00002.safetensors`` plus ``model.safetensors.index.json``).

Names are JSON strings, so any text is stored as given; :data:`NAMES` refuses a NUL
(C readers end the name there), a lone surrogate (no UTF-8) and ``__metadata__``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._torch_checks import is_tensor
from ..dtypes import (
    PACKED_BY_NUMPY,
    DTypeLike,
    DTypeRow,
)
from ..errors import (
    NoDataError,
    UnsupportedDtypeError,
    UnsupportedTensorError,
)
from ._commit import commit_files
from ._common import (
    DEFAULT_CHUNK,
    Deferred,
    StagedFiles,
    cast_target,
    destination_errors,
    iter_bytes,
    loader,
    progress_bar,
    row_of,
)
from ._detect import INDEX_SUFFIX, resolve
from ._files import Links
from ._formats import Layout, PlannedFile, by_name
from ._keys import NameRules, no_nul, reserved_name, valid_unicode
from ._locks import commit_lock
from ._pipeline import STREAM_CHUNK, pipelined
from ._safetensors_header import (
    LAYOUT_RANK,
    PACKED_ROWS,
    PSEUDO_ROWS,
    bit_width,
    encode,
)
from ._safetensors_header import MAX_HEADER as MAX_HEADER  # the limit on a header's JSON
from ._safetensors_read import SafetensorsFile
from ._safetensors_shards import index_json, remove_stale, stale_files
from ._safetensors_shards import parse_size as parse_size  # dcp and the CLI import it here
from .sharded import ShardedFile

if TYPE_CHECKING:
    import torch

__all__ = ["FileLayout", "SafetensorsFile", "layout", "load", "open", "remove_stale", "save"]

# --- writing ----------------------------------------------------------------------------------

# a header key is any JSON string; the rules of tensorbridge.io._keys that apply to it
NAMES = NameRules((no_nul, valid_unicode, reserved_name("__metadata__", "the header's metadata")))


@dataclass(frozen=True)
class _Item:
    """One tensor to write: where its bytes come from and what the header says."""

    name: str
    value: Any  # the tensor or array as given
    src: DTypeRow
    row: DTypeRow  # as stored, after float_dtype
    shape: tuple[int, ...]  # as in the header (F4: values, not bytes)
    nbytes: int


def save(
    tensors: Mapping[str, torch.Tensor | np.ndarray],
    path: str | os.PathLike[str],
    *,
    float_dtype: DTypeLike | None = None,
    metadata: Mapping[str, str] | None = None,
    progress: bool | None = None,
    max_shard_size: int | str | None = None,
    index: bool = False,
    chunk_bytes: int = DEFAULT_CHUNK,
) -> None:
    """Write tensors or arrays to a safetensors file (or shards), streamed and atomic.

    >>> import os, tempfile, torch
    >>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
    >>> save({"w": torch.ones(2, dtype=torch.bfloat16)}, path, metadata={"step": "7"})
    >>> with open(path) as f:
    ...     f.metadata, f["w"].dtype
    ({'format': 'pt', 'step': '7'}, dtype(bfloat16))

    Args:
        tensors: names to CPU or device tensors, or NumPy arrays (memory maps
            included), of any dtype with a safetensors code, or packed fp4.
        path: the file to write; a directory means ``path / "model.safetensors"``.
        float_dtype: store floating-point values as this dtype (cast chunk by chunk);
            integers and bools keep theirs.
        metadata: strings to strings for the header's ``__metadata__``, after
            ``{"format": "pt"}`` (a ``"format"`` key given here wins).
        progress: show a progress bar (``None``: when stderr is a terminal).
        max_shard_size: bytes (int) or a string like ``"5GB"`` (10**9), ``"2GiB"``
            (2**30), ``"500MB"``. When the data exceeds it, tensors fill shards
            ``model-00001-of-0000N.safetensors`` greedily in the mapping's order (one
            larger than the limit gets a shard of its own), and
            ``model.safetensors.index.json`` maps each name to its shard.
        index: write the sharded layout (shards and index) even when everything fits
            in one file, as a destination named ``model.safetensors.index.json`` asks.
        chunk_bytes: about how many bytes to hold at once when casting or copying.

    Each file is written to a temporary file, fsynced and renamed, so an interrupted
    save leaves the previous file or none. A sharded save writes the index last;
    afterwards it removes the previous save's files of the same name that the new one
    does not use (old shards, or the single file / the index it replaces).

    Raises:
        UnsupportedDtypeError: a dtype safetensors cannot store (complex128, complex32).
        UnsupportedTensorError: a value that is not a dense tensor or array.
        InvalidNameError: a name :data:`NAMES` refuses (a NUL, a lone surrogate,
            ``__metadata__``).
        TypeError / ValueError: malformed names, metadata or ``max_shard_size``.
    """
    target = Path(path)
    if target.is_dir():
        target = target / "model.safetensors"
    items, tied = _dedupe(_plan(tensors, float_dtype, target))
    meta = _file_metadata({**tied, **(metadata or {})})
    limit = parse_size(max_shard_size)
    shards = _split(items, limit) if limit is not None else [items]
    bar = progress_bar(
        sum(it.nbytes for it in items), f"saving {target.name}", progress, tensors=len(items)
    )
    try:
        if len(shards) <= 1 and not index:
            with StagedFiles() as staged:
                with staged.write(target) as f:
                    _write_file(f, items, meta, chunk_bytes, bar)
                with destination_errors(target), commit_lock(target.parent):
                    staged.commit()  # under the lock with the removal: one version wins
                    remove_stale(target)
            return
        stem, n = target.name.removesuffix(".safetensors"), len(shards)
        weight_map: dict[str, str] = {}
        index_path = target.parent / (target.name + INDEX_SUFFIX)
        with StagedFiles() as staged:
            for i, shard in enumerate(shards, 1):
                name = f"{stem}-{i:05d}-of-{n:05d}.safetensors"
                with staged.write(target.parent / name) as f:
                    _write_file(f, shard, meta, chunk_bytes, bar)
                weight_map.update((it.name, name) for it in shard)
            # every shard is written; only now does the previous checkpoint change
            files = {p.name: Path(tmp) for p, tmp in staged.temps.items()}
            staged.temps.clear()  # the commit owns them now (the claim stays held)
            index_text = index_json(weight_map, sum(it.nbytes for it in items))
            with destination_errors(target.parent):
                commit_files(
                    target.parent, files, index_path.name, index_text, lambda: stale_files(target)
                )
    finally:
        bar.close()


def _plan(tensors: Mapping[str, Any], float_dtype: Any, target: Path) -> list[_Item]:
    """Check every value and work out its header entry before a byte is written."""
    if not isinstance(tensors, Mapping):
        raise TypeError(
            f"save expects a mapping of names to tensors, got {type(tensors).__qualname__}; "
            "pass a dict such as model.state_dict()"
        )
    NAMES.check(tensors, repr(str(target)))
    items = []
    for name, value in tensors.items():
        try:
            items.append(_item(name, value, float_dtype))
        except (TypeError, ValueError) as e:
            raise type(e)(f"cannot save tensor {name!r} to {target}: {e}") from e
    return items


def _dedupe(items: list[_Item]) -> tuple[list[_Item], dict[str, str]]:
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


def _alias_key(it: _Item) -> tuple[Any, ...] | None:
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


def _item(name: Any, value: Any, float_dtype: Any) -> _Item:
    if not isinstance(name, str):
        raise TypeError(f"tensor names must be str, got {type(name).__qualname__}; pass str(name)")
    if is_tensor(value):
        import torch

        from ..dtypes import PACKED_BY_TORCH

        if value.layout is not torch.strided:
            raise UnsupportedTensorError(
                f"a {value.layout} tensor has no dense bytes to store; pass x.to_dense()"
            )
        if value.device.type == "meta":
            raise NoDataError("a meta tensor holds no data; materialise it first")
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
    elif isinstance(value, Deferred):
        src, shape = value.row, value.shape
    elif isinstance(value, np.ndarray):
        if isinstance(value, np.ma.MaskedArray):
            raise UnsupportedTensorError("a masked array's mask would be lost; pass a.filled()")
        one_a_byte = PACKED_BY_NUMPY.get(value.dtype)
        src = PSEUDO_ROWS[one_a_byte] if one_a_byte in PSEUDO_ROWS else row_of(value)
        shape = value.shape
    else:
        raise UnsupportedTensorError(
            f"the value is a {type(value).__qualname__}; safetensors stores torch.Tensor or "
            "np.ndarray values (pass torch.as_tensor(x))"
        )
    row = cast_target(src, float_dtype)
    if row.safetensors is None:
        fix = (
            "pass torch.view_as_real(x) (NumPy: a[..., None].view(a.real.dtype)) to store the "
            "real and imaginary parts losslessly"
            if row.category == "complex"
            else "pass float_dtype= or convert it to a dtype safetensors has"
        )
        raise UnsupportedDtypeError(f"{row.name} has no safetensors dtype code; {fix}")
    count = math.prod(shape)
    if count * bit_width(row) % 8:
        raise UnsupportedTensorError(
            f"{count} float4 values do not fill whole bytes; pad to an even number of values"
        )
    return _Item(name, value, src, row, tuple(int(d) for d in shape), count * bit_width(row) // 8)


def _file_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
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


def _split(items: list[_Item], limit: int) -> list[list[_Item]]:
    """Greedy in the mapping's order; a tensor larger than ``limit`` gets a shard of its own."""
    shards: list[list[_Item]] = []
    size = 0
    for it in items:
        if not shards or size + it.nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(it)
        size += it.nbytes
    return shards


def _header(items: list[_Item], metadata: dict[str, str]) -> bytes:
    return encode(
        [(it.name, it.row.safetensors or "", it.shape, it.nbytes) for it in items], metadata
    )


def _write_file(
    f: Any, items: list[_Item], metadata: dict[str, str], chunk_bytes: int, bar: Any
) -> None:
    ordered = sorted(items, key=lambda it: (LAYOUT_RANK.get(it.row.safetensors or "", 0), it.name))
    f.write(_header(ordered, metadata))
    written = dict.fromkeys(range(len(ordered)), 0)
    chunks = _units(ordered, chunk_bytes)
    computed = any(isinstance(it.value, Deferred) for it in ordered)
    # computed values: tasks run by worker threads while the chunk before is written
    for i, chunk in pipelined(chunks) if computed else chunks:
        f.write(chunk)
        written[i] += len(chunk)
        bar.update(len(chunk))
    for i, it in enumerate(ordered):
        if written[i] != it.nbytes:  # the tensor changed size while being saved
            raise RuntimeError(
                f"tensor {it.name!r} yielded {written[i]} bytes where its header says "
                f"{it.nbytes}; do not resize tensors while they are being saved"
            )


def _units(ordered: list[_Item], chunk_bytes: int) -> Iterator[tuple[int, Any]]:
    """Each item's bytes, tagged with its place: computing tasks where a value has them,
    else chunks (valid until the next is pulled)."""
    for i, it in enumerate(ordered):
        tasks = None
        if isinstance(it.value, Deferred):
            _check_deferred(it)
            tasks = it.value.tasks(min(chunk_bytes, STREAM_CHUNK))
        for unit in tasks if tasks is not None else _chunks(it, chunk_bytes):
            yield i, unit


def _check_deferred(it: _Item) -> None:
    if it.row is not it.src:
        raise UnsupportedDtypeError(
            f"{it.name!r} is computed as {it.src.name} while it is written; pass its "
            "dtype where it is made (dequantize=) rather than float_dtype="
        )


def _chunks(it: _Item, chunk_bytes: int) -> Iterator[Any]:
    """``it``'s bytes as stored, a chunk at a time: zero-copy views where the memory allows."""
    if isinstance(it.value, Deferred):
        _check_deferred(it)
        yield from it.value.chunks(chunk_bytes)
        return
    packing = PACKED_ROWS.get(it.src)
    if packing is None:
        yield from iter_bytes(it.value, it.row, chunk_bytes)
        return
    v = it.value
    if is_tensor(v) and it.row is it.src:
        import torch

        yield from iter_bytes(v.view(torch.uint8), None, chunk_bytes)  # already packed
        return
    k = packing.per_byte  # values a piece: whole bytes, and their float32 fit a chunk
    step = max(k, chunk_bytes // 4 // k * k)
    if is_tensor(v):
        import torch

        from ..convert import to_numpy

        packed = to_numpy(v.view(torch.uint8).cpu()).reshape(-1)
        pieces = (
            packing.unpack(packed[i : i + step // k]) for i in range(0, packed.size, step // k)
        )
    else:
        flat = np.ravel(v)
        pieces = (flat[i : i + step] for i in range(0, flat.size, step))
    for piece in pieces:
        if it.row is it.src:
            yield packing.pack(piece).data
        else:  # float_dtype: float4 values are exact in float32, then torch's cast
            yield from iter_bytes(piece.astype(np.float32), it.row, chunk_bytes)


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
        _item(name, np.empty(0, np.uint8), None)  # the name's checks
        nbytes = math.prod(shape) * row.itemsize
        items.append(_Item(name, None, row, row, tuple(shape), nbytes))
    meta = _file_metadata(metadata)
    limit = parse_size(max_shard_size)
    shards = _split(items, limit) if limit is not None else [items]
    single = len(shards) <= 1 and not index
    stem, n = target.name.removesuffix(".safetensors"), len(shards)
    files: list[FileLayout] = []
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards, 1):
        name = target.name if single else f"{stem}-{i:05d}-of-{n:05d}.safetensors"
        ordered = sorted(
            shard, key=lambda it: (LAYOUT_RANK.get(it.row.safetensors or "", 0), it.name)
        )
        header = _header(ordered, meta)
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


# --- reading ----------------------------------------------------------------------------------


def open(
    path: str | os.PathLike[str], *, follow_links: bool = False
) -> SafetensorsFile | ShardedFile:
    """Open a safetensors file, a ``*.safetensors.index.json`` or a directory holding one.

    Only the header is read (and checked); tensors are mapped when asked for. A shard
    (or a directory's file) that is a link leading out of the directory raises
    :class:`~tensorbridge.errors.LinkError` unless ``follow_links=True``.

    >>> import os, tempfile, numpy as np
    >>> path = os.path.join(tempfile.mkdtemp(), "a.safetensors")
    >>> save({"x": np.arange(3, dtype=np.int16)}, path)
    >>> with open(path) as f:
    ...     f.keys(), f["x"], f.info("x")[1]
    (['x'], array([0, 1, 2], dtype=int16), (3,))

    Raises:
        FormatError: the file or index is malformed; the message names the file, the
            tensor and what is wrong.
        FileNotFoundError: no such file, or a directory without one.
    """
    given = Path(path)
    p = resolve(given, by_name("safetensors").in_directory)
    if p != given:
        Links.of(given, follow=follow_links).check(p)
    if p.name.endswith(INDEX_SUFFIX):
        return ShardedFile(p, SafetensorsFile, Links.of(p, follow=follow_links))
    return SafetensorsFile(p)


load = loader(
    open,
    """Load every tensor (or ``keys``) of a safetensors file, index or directory.

    With ``mmap=True`` NumPy arrays are read-only views of the file and tensors are
    copy-on-write; ``mmap=False`` reads into new memory.

    >>> import os, tempfile, torch
    >>> path = os.path.join(tempfile.mkdtemp(), "a.safetensors")
    >>> save({"x": torch.arange(3)}, path)
    >>> load(path, framework="torch")
    {'x': tensor([0, 1, 2])}
    """,
)
