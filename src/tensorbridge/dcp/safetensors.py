"""DCP storage for the final Hugging Face safetensors checkpoint, written by every rank at once.

``dcp.save(state_dict, storage_writer=SafetensorsWriter(dir))`` on N ranks leaves in
``dir`` what ``save_pretrained`` would: ``model-0000i-of-0000N.safetensors`` files and
``model.safetensors.index.json`` (``metadata.total_size``, ``weight_map``), every
header with ``{"format": "pt"}`` in its ``__metadata__``. There is no consolidation
pass and no rank ever holds more than its own shards:

1. ``prepare_global_plan`` (the coordinator) lays out every file from DCP's global
   plan: names, global shapes, dtypes, files (``max_shard_size``), offsets
   (``_hf_layout.py``). It creates the files, at their final size, in a staging
   directory (``tensorbridge._commit``) and hands each rank the placements of its tensors in
   the plans' ``storage_data``.
2. ``write_data`` (every rank) writes the bytes of the chunks DCP assigned it, at
   their final offsets: a row-sharded chunk is one range written straight from the
   tensor's memory; a column-sharded chunk is a range a row, copied through a
   memory map of at most ``buffer_size`` bytes of the file (or ``pwrite`` per range,
   with ``map_small_writes=False``). Replicated tensors are written once, by the
   rank DCP's deduplication picks. Non-tensor entries are looked up, never pickled.
3. ``finish`` (the coordinator, after every rank reported success) checks that
   every tensor's bytes were written, writes the headers (with the non-tensor
   entries' values), renames the files into ``dir`` and writes the index last.

``SafetensorsReader(dir)`` reads any committed safetensors checkpoint (this
writer's, ``save_pretrained``'s, a single ``model.safetensors``) with ``dcp.load``
into any sharding, reading only the requested slices of the mapped files, and
refuses a directory whose save never committed.

>>> import tempfile, torch, torch.distributed.checkpoint as dcp
>>> import tensorbridge as tb
>>> d = tempfile.mkdtemp()
>>> _ = dcp.save({"w": torch.arange(6.0).reshape(2, 3), "step": 7},
...              storage_writer=tb.SafetensorsWriter(d))
>>> tb.load(d)["w"].tolist(), tb.open(d).metadata["step"]
([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], '7')
>>> back = {"w": torch.zeros(2, 3), "step": 0}
>>> dcp.load(back, storage_reader=tb.SafetensorsReader(d))
>>> back["w"][1].tolist(), back["step"]
([3.0, 4.0, 5.0], 7)
"""

from __future__ import annotations

import dataclasses
import io
import json
import mmap
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from .. import _commit as commit
from .._chunks import iter_bytes
from .._packed import PACKED_ROWS
from ..dtypes import PACKED_BY_TORCH
from ..errors import FormatError, InvalidArgumentError, UnsupportedTensorError
from ..io.safetensors import NAMES, parse_size
from ._hf_layout import (
    INDEX_NAME,
    OBJECTS_KEY,
    SINGLE_NAME,
    SKIPPED_KEY,
    Block,
    Layout,
    Placement,
    TensorSpec,
    block_runs,
    file_metadata,
    plan_layout,
    simple_value,
    spec_of,
)
from ._plannable import check_plannable
from ._tiling import check_tiles

__all__ = ["SafetensorsReader", "SafetensorsWriter"]

_SHARD_NAME = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
_SMALL_RUN = 1 << 16  # shorter runs go through a memory map: one copy instead of a syscall each


@dataclass(frozen=True)
class _RankPlan:
    """What the coordinator tells each rank: where to write, and where each tensor goes."""

    staging: str
    placements: dict[str, Placement]


@dataclass(frozen=True)
class _Written:
    file: str
    nbytes: int


@dataclass(frozen=True)
class _Value:
    text: str | None  # JSON text for the header, or None when skipped
    reason: str


class SafetensorsWriter(StorageWriter):
    """A DCP ``StorageWriter`` whose output is the final Hugging Face safetensors checkpoint.

    >>> import os, tempfile, torch
    >>> import torch.distributed.checkpoint as dcp, tensorbridge as tb
    >>> d = tempfile.mkdtemp()
    >>> sd = {"a": torch.ones(4), "b": torch.zeros(4, dtype=torch.int8)}
    >>> _ = dcp.save(sd, storage_writer=tb.SafetensorsWriter(d, max_shard_size=16))
    >>> for name in sorted(os.listdir(d)):
    ...     print(name)
    model-00001-of-00002.safetensors
    model-00002-of-00002.safetensors
    model.safetensors.index.json

    Args:
        path: the checkpoint directory (created if missing). A previous checkpoint
            there stays readable until the new one commits, then is replaced.
        max_shard_size: bytes per file (an int, or ``"5GB"``, ``"500MB"``, ``"2GiB"``);
            tensors fill files greedily in state-dict order, one larger than the
            limit gets a file of its own. ``None``: one file.
        buffer_size: the most bytes of a file a rank maps at once to write the rows
            of a column-sharded tensor.
        map_small_writes: write ranges shorter than 64 KiB through a shared memory
            map of the file (one NumPy copy for a whole block) instead of a
            ``pwrite`` each. Ranks then write different bytes of the same pages,
            which one machine's page cache keeps coherent; pass ``False`` when ranks
            on different hosts write one file over a network filesystem.

    Every dtype with a safetensors code is written, 0-dim tensors included;
    ``complex128`` and ``complex32`` are refused before anything is written.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_shard_size: int | str | None = "5GB",
        buffer_size: int = 64 << 20,
        map_small_writes: bool = True,
    ) -> None:
        super().__init__()
        self.path = Path(path)
        self.max_shard_size = parse_size(max_shard_size)
        if buffer_size <= 0:
            raise InvalidArgumentError(
                f"buffer_size={buffer_size!r} is not a positive number of bytes; pass an int "
                "such as 64 << 20 (64 MiB)"
            )
        self.buffer_size = buffer_size
        self.map_small_writes = map_small_writes
        self.is_coordinator = False
        self._layout: Layout | None = None
        self._staging: Path | None = None

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None:
            self.path = Path(checkpoint_id)
        if self._staging is not None:  # a save that failed on some rank: never committed
            commit.abandon(self._staging)
        self._layout = None
        self._staging = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=str(self.path))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        for item in plan.items:
            if item.tensor_data is not None:
                check_plannable(item.index.fqn, item.tensor_data.properties.dtype)
        # the state dict's order, for the file layout: the global plan is regrouped by rank
        order = list(dict.fromkeys(item.index.fqn for item in plan.items))
        return dataclasses.replace(plan, storage_data=order)

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        order: dict[str, None] = {}
        for plan in plans:
            order.update(dict.fromkeys(plan.storage_data or ()))
            order.update(dict.fromkeys(item.index.fqn for item in plan.items))
        specs: dict[str, TensorSpec] = {}
        boxes: dict[str, list[tuple[torch.Size, torch.Size]]] = {}
        objects: list[str] = []
        for plan in plans:
            for item in plan.items:
                name = item.index.fqn
                if item.type == WriteItemType.BYTE_IO:
                    objects.append(name)
                    continue
                td = item.tensor_data
                if td is None:  # pragma: no cover - DCP always describes tensors
                    raise UnsupportedTensorError(
                        f"tensor {name!r} has no shape or dtype in the plan"
                    )
                if name not in specs:
                    NAMES.check([name], repr(str(self.path)))
                    specs[name] = spec_of(name, td.properties.dtype, tuple(td.size))
                boxes.setdefault(name, []).append((td.chunk.offsets, td.chunk.sizes))
        for name, spec in specs.items():
            check_tiles(name, spec.shape, boxes[name])
        tensors = [specs[n] for n in order if n in specs]
        layout = plan_layout(tensors, [n for n in order if n in objects], self.max_shard_size)
        staging = commit.begin(self.path, commit.new_save_id(), owner=self)
        for f in layout.files:
            with open(staging / f.name, "wb") as out:
                out.truncate(f.size)
        self._layout, self._staging = layout, staging
        placements = layout.placements()
        return [
            dataclasses.replace(
                plan,
                storage_data=_RankPlan(
                    str(staging),
                    {
                        i.index.fqn: placements[i.index.fqn]
                        for i in plan.items
                        if i.index.fqn in placements
                    },
                ),
            )
            for plan in plans
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        rank_plan = plan.storage_data
        if not isinstance(rank_plan, _RankPlan):
            raise RuntimeError(
                "SafetensorsWriter.write_data got a plan it did not prepare; use a planner "
                "without plan caching (DefaultSavePlanner(enable_plan_caching=False))"
            )
        staging = Path(rank_plan.staging)
        fds: dict[str, int] = {}
        results: list[WriteResult] = []
        try:
            for item in plan.items:
                name = item.index.fqn
                if item.type == WriteItemType.BYTE_IO:
                    results.append(WriteResult(item.index, 0, _lookup(planner, item.index)))
                    continue
                at = rank_plan.placements[name]
                fd = fds.get(at.file)
                if fd is None:
                    fd = fds[at.file] = _open_staged(staging / at.file)
                tensor = planner.resolve_data(item)
                if not isinstance(tensor, torch.Tensor) or item.tensor_data is None:
                    raise UnsupportedTensorError(
                        f"tensor {name!r}: the save planner resolved it to a "
                        f"{type(tensor).__qualname__}, not a tensor"
                    )
                chunk = item.tensor_data.chunk
                n = _write_chunk(
                    fd, tensor, at, tuple(chunk.offsets), tuple(chunk.sizes), self.buffer_size,
                    self.map_small_writes,
                )  # fmt: skip
                results.append(WriteResult(item.index, n, _Written(at.file, n)))
            for fd in fds.values():
                os.fsync(fd)
        finally:
            for fd in fds.values():
                os.close(fd)
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        layout, staging = self._layout, self._staging
        if layout is None or staging is None:
            raise RuntimeError("SafetensorsWriter.finish ran without prepare_global_plan")
        written: dict[str, int] = {}
        values: dict[str, str] = {}
        skipped: dict[str, str] = {}
        for wr in (wr for rank in results for wr in rank):
            data = wr.storage_data
            if isinstance(data, _Value):
                if data.text is None:
                    skipped[wr.index.fqn] = data.reason
                else:
                    values[wr.index.fqn] = data.text
            else:
                written[wr.index.fqn] = written.get(wr.index.fqn, 0) + wr.size_in_bytes
        for f in layout.files:
            for t in f.tensors:
                if written.get(t.name, 0) != t.nbytes:
                    commit.abandon(staging)
                    raise RuntimeError(
                        f"tensor {t.name!r}: the ranks wrote {written.get(t.name, 0)} of its "
                        f"{t.nbytes} bytes; the checkpoint was not committed, save again"
                    )
        meta = file_metadata(values, skipped, list(layout.objects))
        for f in layout.files:
            fd = os.open(staging / f.name, os.O_RDWR)
            try:
                _pwrite_all(fd, memoryview(f.header(meta)), 0)
            finally:
                os.close(fd)

        def stale() -> list[str]:  # under the commit lock: what the last commit left
            names = (commit.final_name(p.name) or p.name for p in self.path.iterdir())
            return [*(n for n in names if _SHARD_NAME.fullmatch(n)), SINGLE_NAME]

        self._layout = self._staging = None
        commit.commit_files(
            self.path,
            {f.name: staging / f.name for f in layout.files},
            INDEX_NAME,
            layout.index(),
            stale=stale,
        )


def _open_staged(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path} was created by the coordinator but is not visible on this rank; every "
            "rank must see the same checkpoint directory (a shared filesystem)"
        ) from None


def _lookup(planner: SavePlanner, index: MetadataIndex) -> _Value:
    """A non-tensor entry's value, straight from the state dict (the planner's, unpickled)."""
    lookup = getattr(planner, "lookup_object", None)
    if lookup is None:
        return _Value(None, "the save planner hands out only pickled bytes, which are not stored")
    text, reason = simple_value(index.fqn, lookup(index))
    return _Value(text, reason)


def _write_chunk(
    fd: int,
    tensor: torch.Tensor,
    at: Placement,
    offsets: tuple[int, ...],
    sizes: tuple[int, ...],
    window: int,
    mapped: bool,
) -> int:
    """Write one chunk's bytes at their final places in the file; the number of bytes written."""
    t = tensor.detach()
    if t.dtype in PACKED_BY_TORCH:
        t = t.view(torch.uint8)
    if tuple(t.shape) != sizes:
        raise UnsupportedTensorError(
            f"a chunk of shape {tuple(t.shape)} was planned as {sizes}; the state dict changed "
            "during the save"
        )
    done = 0
    for blk in block_runs(at, offsets, sizes, window):
        if blk.whole:
            pos = blk.start
            for piece in _stream(t, window):
                _pwrite_all(fd, piece, pos)
                pos += len(piece)
            done += pos - blk.start
            continue
        part = t[blk.index][blk.lo : blk.hi]
        data = part.contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
        if mapped and blk.run < _SMALL_RUN:
            _map_write(fd, data, blk)
        else:
            view = data.data
            for i in range(blk.count):
                _pwrite_all(fd, view[i * blk.run : (i + 1) * blk.run], blk.start + i * blk.step)
        done += blk.count * blk.run
    return done


def _stream(t: torch.Tensor, window: int) -> Any:
    """``t``'s bytes in C order: views of its memory when it is a contiguous CPU tensor."""
    if t.device.type == "cpu" and t.is_contiguous():
        flat = t.reshape(-1).view(torch.uint8).numpy().data
        return (flat[i : i + window] for i in range(0, len(flat), window))
    return iter_bytes(t, None, window)


def _map_write(fd: int, data: np.ndarray, blk: Block) -> None:
    gran = mmap.ALLOCATIONGRANULARITY
    lo = blk.start // gran * gran
    end = blk.start + (blk.count - 1) * blk.step + blk.run
    mm = mmap.mmap(fd, end - lo, offset=lo)
    try:
        rows = np.ndarray(
            (blk.count, blk.run), np.uint8, buffer=mm, offset=blk.start - lo, strides=(blk.step, 1)
        )
        rows[...] = data.reshape(blk.count, blk.run)
        del rows
    finally:
        mm.close()


def _pwrite_all(fd: int, data: Any, offset: int) -> None:
    view = memoryview(data).cast("B")
    while len(view):
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


# --- reading ----------------------------------------------------------------------------------


class SafetensorsReader(StorageReader):
    """A DCP ``StorageReader`` for a Hugging Face safetensors checkpoint directory.

    ``dcp.load(state_dict, storage_reader=SafetensorsReader(dir))`` fills the state
    dict's tensors (plain or DTensor, any sharding) from the files, reading only each
    rank's slices of the memory-mapped files; non-tensor entries saved by
    :class:`SafetensorsWriter` come back with their types. It reads this writer's
    checkpoints, ``save_pretrained``'s sharded ones and a lone ``model.safetensors``.

    Raises (from ``dcp.load``):
        UncommittedCheckpointError: the directory holds a save that never committed.
        FormatError: a malformed header, or a shard the index names that is missing.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = Path(path)
        self._names: dict[str, str] = {}

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None:
            self.path = Path(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        p = Path(checkpoint_id)
        return (p / INDEX_NAME).is_file() or (p / SINGLE_NAME).is_file()

    def _open(self) -> Any:
        from ..io import safetensors as st

        if not (self.path / SINGLE_NAME).is_file():  # a lone file is another tool's commit
            commit.require_committed(self.path, INDEX_NAME, "safetensors checkpoint")
        return st.open(self.path)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        md: dict[str, Any] = {}
        storage: dict[MetadataIndex, str] = {}
        with self._open() as f:
            for name in f:
                row, shape = f.info(name)
                dtype, shape = _torch_view(row, shape)
                zeros = torch.Size([0] * len(shape))
                md[name] = TensorStorageMetadata(
                    TensorProperties(dtype=dtype),
                    torch.Size(shape),
                    [ChunkStorageMetadata(zeros, torch.Size(shape))],
                )
                storage[MetadataIndex(name, zeros)] = name
            objects = _json_field(f.metadata, OBJECTS_KEY, list)
            skipped = _json_field(f.metadata, SKIPPED_KEY, dict)
        for name in [*objects, *skipped]:
            md[name] = BytesStorageMetadata()
            storage[MetadataIndex(name)] = name
        return Metadata(state_dict_metadata=md, storage_data=storage, storage_meta=StorageMeta())

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        self._names = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        with self._open() as f:
            for req in plan.items:
                name = req.storage_index.fqn
                if req.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(req, _restore(f.metadata, name, self.path))
                    continue
                src = f.get(name, framework="torch")  # copy-on-write map: pages read on use
                box = tuple(
                    slice(o, o + n) for o, n in zip(req.storage_offsets, req.lengths, strict=True)
                )
                target = planner.resolve_tensor(req).detach()
                piece = src[box] if box else src
                if target.shape != piece.shape:
                    raise FormatError(
                        f"{self.path}: tensor {name!r}: the slice read is {tuple(piece.shape)}, "
                        f"the destination {tuple(target.shape)}; the checkpoint and the state "
                        "dict disagree on its shape"
                    )
                target.copy_(piece)
                planner.commit_tensor(req, target)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut


def _torch_view(row: Any, shape: tuple[int, ...]) -> tuple[torch.dtype, tuple[int, ...]]:
    """The torch dtype and shape a stored entry loads as (F4: packed, the last dim halved)."""
    packed = PACKED_ROWS.get(row)
    if packed is not None:
        return packed.torch, (*shape[:-1], shape[-1] // packed.per_byte)
    return row.torch, shape


def _json_field(meta: dict[str, str], key: str, kind: type) -> Any:
    text = meta.get(key)
    if text is None:
        return kind()
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, kind):
        raise FormatError(
            f"__metadata__[{key!r}] is not a JSON {kind.__name__}; the file is corrupt"
        )
    return value


def _restore(meta: dict[str, str], name: str, path: Path) -> io.BytesIO:
    """A saved non-tensor value as the ``torch.save`` bytes DCP's planner loads."""
    skipped = _json_field(meta, SKIPPED_KEY, dict)
    if name in skipped:
        raise FormatError(
            f"{path}: {name!r} was not saved ({skipped[name]}); drop it from the state dict "
            "you load into, or save it another way"
        )
    try:
        value = json.loads(meta[name])
    except (KeyError, ValueError):
        raise FormatError(f"{path}: the value of {name!r} is missing or not JSON") from None
    buf = io.BytesIO()
    torch.save(value, buf)
    buf.seek(0)
    return buf
