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
memory); the header shape counts values, like the official writer's. ``F6_E2M3`` /
``F6_E3M2`` are refused both ways: safetensors defines their size, not their bit
order (:func:`~tensorbridge.io.safetensors_header.no_bit_order`); a dtype with no
code (int4, float8_e3m4, ...) is refused on save, naming ``.npy`` / ``.npz``.

Reading validates the whole header before anything else is touched; every
malformed file raises :class:`~tensorbridge.errors.FormatError` naming the file,
the tensor and the fault. Sharded checkpoints follow the Hugging Face layout
(``model-00001-of-00002.safetensors`` plus ``model.safetensors.index.json``).

Names are JSON strings, so any text is stored as given; :data:`NAMES` refuses a NUL
(C readers end the name there), a lone surrogate (no UTF-8) and ``__metadata__``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._atomic import StagedFiles, destination_errors
from .._chunks import DEFAULT_CHUNK, iter_bytes
from .._commit import commit_files
from .._filemap import array_at, bits_at
from .._files import Links
from .._locks import commit_lock
from .._packed import PACKED_ROWS
from .._pipeline import STREAM_CHUNK, pipelined
from .._progress import progress_bar
from .._tensorfile import Deferred, StoredBits, TensorFile, cast_target
from .._torch_checks import is_tensor
from ..dtypes import (
    DeviceLike,
    DTypeLike,
    DTypeRow,
)
from ..errors import (
    InvalidArgumentError,
    UnsupportedDtypeError,
)
from ._common import loader
from ._detect import INDEX_SUFFIX, resolve
from ._formats import by_name
from ._safetensors_plan import NAMES as NAMES  # dcp imports it here
from ._safetensors_plan import (
    FileLayout,
    Item,
    dedupe,
    file_metadata,
    header_bytes,
    layout,
    plan_items,
    split_shards,
)
from ._safetensors_plan import assembly as assembly  # the format row's assembly (assembles)
from ._safetensors_read import Shard
from ._safetensors_shards import index_json, remove_stale, stale_files
from ._safetensors_shards import parse_size as parse_size  # dcp and the CLI import it here
from .safetensors_header import (
    LAYOUT_RANK,
    Entry,
)
from .safetensors_header import MAX_HEADER as MAX_HEADER  # the limit on a header's JSON
from .sharded import ShardedFile

if TYPE_CHECKING:
    import torch

__all__ = ["FileLayout", "SafetensorsFile", "layout", "load", "open", "remove_stale", "save"]

# --- writing ----------------------------------------------------------------------------------


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
    items, tied = dedupe(plan_items(tensors, float_dtype, target))
    meta = file_metadata({**tied, **(metadata or {})})
    limit = parse_size(max_shard_size)
    shards = split_shards(items, limit) if limit is not None else [items]
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


def _write_file(
    f: Any, items: list[Item], metadata: dict[str, str], chunk_bytes: int, bar: Any
) -> None:
    ordered = sorted(items, key=lambda it: (LAYOUT_RANK.get(it.row.safetensors or "", 0), it.name))
    f.write(header_bytes(ordered, metadata))
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


def _units(ordered: list[Item], chunk_bytes: int) -> Iterator[tuple[int, Any]]:
    """Each item's bytes, tagged with its place: computing tasks where a value has them,
    else chunks (valid until the next is pulled)."""
    for i, it in enumerate(ordered):
        tasks = None
        if isinstance(it.value, Deferred):
            _check_deferred(it)
            tasks = it.value.tasks(min(chunk_bytes, STREAM_CHUNK))
        for unit in tasks if tasks is not None else _chunks(it, chunk_bytes):
            yield i, unit


def _check_deferred(it: Item) -> None:
    if it.row is not it.src:
        raise UnsupportedDtypeError(
            f"{it.name!r} is computed as {it.src.name} while it is written; pass its "
            "dtype where it is made (dequantize=) rather than float_dtype="
        )


def _chunks(it: Item, chunk_bytes: int) -> Iterator[Any]:
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


# --- reading ----------------------------------------------------------------------------------


class SafetensorsFile(TensorFile):
    """A validated safetensors file; tensors are read when asked for.

    ``[name]`` is a read-only NumPy view of the memory-mapped file (writing raises);
    ``.get(name, framework="torch")`` is a copy-on-write tensor over it;
    ``mmap=False`` reads into new memory. ``keys()`` come in file order (shard by
    shard); ``metadata`` is the (first) file's ``__metadata__``.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = Path(path)
        shard = Shard(self.path)
        self._shards: list[Shard] = [shard]
        self._where: dict[str, tuple[Shard, Entry]] = {
            k: (shard, e) for k, e in shard.entries.items()
        }
        self.metadata = dict(shard.metadata)
        self._restore_ties(self._where)

    def keys(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def _lookup(self, name: str) -> tuple[Shard, Entry]:
        try:
            return self._where[name]
        except KeyError:
            keys = self.keys()[:10]
            raise KeyError(f"{name!r} is not in {self.path}; its keys are {keys}") from None

    def info(self, name: str) -> tuple[DTypeRow, tuple[int, ...]]:
        """The stored dtype row (F4: ``float4_e2m1fn``) and the header's shape of ``name``."""
        _, e = self._lookup(name)
        return e.row, e.shape

    def _bytes(self, name: str, *, copy_on_write: bool | None) -> np.ndarray:
        """``name``'s raw bytes: a view of a map, or new memory when ``copy_on_write`` is None."""
        shard, e = self._lookup(name)
        if copy_on_write is None:
            out = np.empty(e.nbytes, np.uint8)
            shard.read_into(out.data, e.begin)
            return out
        if e.nbytes == 0:
            return np.empty(0, np.uint8)
        return np.frombuffer(shard.buffer(copy_on_write), np.uint8, e.nbytes, e.begin)

    def _array(self, name: str, *, copy_on_write: bool) -> np.ndarray:
        shard, e = self._lookup(name)
        packing = PACKED_ROWS.get(e.row)
        if packing is not None:
            values: np.ndarray = packing.unpack(self._bytes(name, copy_on_write=False))
            return values.reshape(e.shape)
        return array_at(shard.buffer(copy_on_write), e.begin, e.shape, e.row, name=name)

    def stored_bits(self, name: str) -> StoredBits | None:
        """A carried tensor (not F4) mapped read-only as its carrier's integers."""
        shard, e = self._lookup(name)
        if not e.row.carried or e.row in PACKED_ROWS:
            return None
        return StoredBits(bits_at(shard.buffer(False), e.begin, e.shape, e.row, name=name), e.row)

    def _owned(self, name: str) -> np.ndarray:
        _, e = self._lookup(name)
        raw = self._bytes(name, copy_on_write=None)
        packing = PACKED_ROWS.get(e.row)
        if packing is not None:
            unpacked: np.ndarray = packing.unpack(raw)
            return unpacked.reshape(e.shape)
        return raw.view(e.row.carrier_numpy).view(e.row.numpy).reshape(e.shape)

    def get(
        self,
        name: str,
        *,
        framework: str = "numpy",
        mmap: bool = True,
        device: DeviceLike | None = None,
        float_dtype: DTypeLike | None = None,
    ) -> Any:
        """One tensor: a NumPy array (read-only view when ``mmap``) or a torch tensor (COW).

        F4 tensors come as ml_dtypes ``float4_e2m1fn`` arrays (one value a byte, new
        memory) or torch ``float4_e2m1fn_x2`` tensors (packed, zero-copy).
        """
        _, e = self._lookup(name)
        packing = PACKED_ROWS.get(e.row)
        if packing is None:
            return super().get(
                name, framework=framework, mmap=mmap, device=device, float_dtype=float_dtype
            )
        if framework not in ("numpy", "torch"):
            raise InvalidArgumentError(
                f"framework={framework!r} is not supported; pass 'numpy' or 'torch'"
            )
        as_torch = framework == "torch"
        dst = cast_target(e.row, float_dtype)
        if dst is not e.row:  # float4 values are exact in float32; torch's kernel does the rest
            from ..convert import to_numpy, to_torch

            values = self._array(name, copy_on_write=False).astype(np.float32)
            if as_torch:
                return to_torch(values, dtype=dst, device=device)
            return to_numpy(values, dtype=dst)
        if not as_torch:
            return self._owned(name) if not mmap else self._array(name, copy_on_write=False)
        k = packing.per_byte
        if not e.shape or e.shape[-1] % k:
            pairs = "pairs values along an even" if k == 2 else f"packs {k} values a byte along a"
            raise UnsupportedDtypeError(
                f"{self.path}: tensor {name!r} is {e.row.safetensors} with shape "
                f"{list(e.shape)}; torch's {packing.name} {pairs} last dimension; pass "
                f"framework='numpy' for ml_dtypes.{packing.numpy} values"
            )
        import torch

        from ..convert import to_torch

        raw = self._bytes(name, copy_on_write=True if mmap else None)
        packed = torch.from_numpy(raw).view(packing.torch)
        t = packed.reshape(*e.shape[:-1], e.shape[-1] // k)
        return t if device is None else to_torch(t, device=device)

    def close(self) -> None:
        """Close the files; arrays and tensors already handed out stay valid."""
        for shard in self._shards:
            shard.close()

    def __enter__(self) -> SafetensorsFile:
        return self

    def __repr__(self) -> str:
        return f"<SafetensorsFile {str(self.path)!r}: {len(self._where)} tensors>"


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
