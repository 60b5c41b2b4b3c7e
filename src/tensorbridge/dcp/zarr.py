"""``tb.ZarrWriter`` / ``tb.ZarrReader``: ``torch.distributed.checkpoint`` to and from Zarr v3.

``dcp.save(state_dict, storage_writer=tb.ZarrWriter("ckpt.zarr"))`` on N ranks writes a
Zarr v3 store (the layout of :mod:`tensorbridge.io.zarr`): one array per tensor under
its fully qualified name, written in parallel, each rank writing the chunks of its own
shards and nothing else.

* **The chunk grid is aligned to the shards.** The coordinator sees every rank's
  blocks in DCP's global plan (``prepare_global_plan``); along each dimension the
  chunk length divides every block's offset and size (:func:`~tensorbridge.io.zarr.chunk_grid`),
  so no two ranks ever write one chunk (two writers of one chunk each rewrite all of
  it, and one loses). Chunks are at most ``max_chunk_bytes``.
* **Commit.** The coordinator creates the arrays in a staging directory beside the
  store before any rank writes (its path travels to the ranks in the plans); ranks
  write their chunks there; ``finish`` (which DCP calls only once every rank has
  reported success) writes the group's ``zarr.json`` into it and swaps it with the
  store atomically (:mod:`tensorbridge._commit`). A rank killed mid-save leaves
  the previous store, or none, in place.
* **Memory.** Each rank holds its local shards (DCP's ``resolve_data``) plus about
  ``buffer_bytes`` of chunks being encoded; reads go straight into the destination
  tensors.
* **Non-tensor entries** (``step``, hyper-parameters) are kept when they are JSON
  values, as group attributes; anything else is refused (a Zarr store holds no pickles).

``dcp.load(state_dict, storage_reader=tb.ZarrReader("ckpt.zarr"))`` reads the store into
any sharding (2 ranks -> 4, N -> 1 process); the reader describes each array as one
whole-tensor chunk and reads each rank's regions from the chunks that hold them, so it
also loads stores that zarr, dask or tensorstore wrote.

>>> import os, tempfile, torch, torch.distributed.checkpoint as dcp
>>> path = os.path.join(tempfile.mkdtemp(), "ckpt.zarr")
>>> sd = {"w": torch.arange(6.0).reshape(2, 3).bfloat16(), "step": 3}
>>> _ = dcp.save(sd, storage_writer=ZarrWriter(path), no_dist=True)
>>> back = {"w": torch.zeros(2, 3, dtype=torch.bfloat16), "step": 0}
>>> dcp.load(back, storage_reader=ZarrReader(path), no_dist=True)
>>> back["w"].tolist(), back["step"]
([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], 3)
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

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

from .._atomic import destination_errors
from .._chunks import DEFAULT_CHUNK
from ..convert import to_numpy, to_torch
from ..errors import InvalidArgumentError, UnsupportedTensorError
from ..io import zarr as zstore
from ._plannable import check_plannable
from ._tiling import check_tiles

__all__ = ["ZarrReader", "ZarrWriter"]

_VALUES = "values"  # in the reserved group attribute: which attributes are DCP entries


class ZarrWriter(StorageWriter):
    """A DCP ``StorageWriter`` that writes a Zarr v3 store, every rank its own chunks.

    Args:
        path: the store's directory (``NAME.zarr``); ``dcp.save(checkpoint_id=...)``
            replaces it.
        max_chunk_bytes: the largest chunk (chunks are also aligned to every shard).
        buffer_bytes: about how many bytes of a shard are encoded at a time.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_chunk_bytes: int = zstore.MAX_CHUNK_BYTES,
        buffer_bytes: int = DEFAULT_CHUNK,
    ) -> None:
        super().__init__()
        for label, value in (("max_chunk_bytes", max_chunk_bytes), ("buffer_bytes", buffer_bytes)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise InvalidArgumentError(
                    f"{label}={value!r} is not a positive number of bytes; pass an int such "
                    "as 16 << 20 (16 MiB)"
                )
        zstore.require_zarr()
        self.path = Path(path)
        self.max_chunk_bytes = max_chunk_bytes
        self.buffer_bytes = buffer_bytes
        self.is_coordinator = False
        self.store: zstore.StoreWriter | None = None
        self.order: list[str] = []  # the fully qualified names in state-dict order

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id:
            self.path = Path(checkpoint_id)
        if self.store is not None:  # a save that failed on some rank: never committed
            self.store.abandon()
        self.store = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """Record the state dict's order (DCP's metadata orders entries by rank)."""
        for item in plan.items:
            if item.tensor_data is not None:
                check_plannable(item.index.fqn, item.tensor_data.properties.dtype)
        order = list(dict.fromkeys(item.index.fqn for item in plan.items))
        return _with_storage(plan, {"order": order})

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Create every array, chunked to tile all ranks' blocks, in a fresh staging directory."""
        shapes: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        blocks: dict[str, list[tuple[tuple[int, ...], tuple[int, ...]]]] = {}
        for plan in plans:
            for item in plan.items:
                fqn = item.index.fqn
                if item.type == WriteItemType.BYTE_IO:
                    continue
                data = item.tensor_data
                assert data is not None  # DCP's planner fills it for every tensor item
                shape, dtype = tuple(data.size), data.properties.dtype
                if shapes.setdefault(fqn, (shape, dtype)) != (shape, dtype):
                    raise UnsupportedTensorError(
                        f"{fqn!r} is {shapes[fqn]} on one rank and {(shape, dtype)} on "
                        "another; every rank must save the same global tensor"
                    )
                blocks.setdefault(fqn, []).append(
                    (tuple(data.chunk.offsets), tuple(data.chunk.sizes))
                )
        self.order = list(
            dict.fromkeys(
                fqn for plan in plans for fqn in (plan.storage_data or {}).get("order", [])
            )
        )
        zstore.check_names(shapes, repr(str(self.path)))  # each tensor becomes a directory
        for fqn, (shape, _) in shapes.items():
            check_tiles(fqn, shape, blocks[fqn])
        store = zstore.StoreWriter(self.path, max_chunk_bytes=self.max_chunk_bytes)
        try:
            for fqn in sorted(shapes, key=_position(self.order)):
                shape, dtype = shapes[fqn]
                store.create(fqn, shape, dtype, blocks=blocks[fqn])
        except BaseException:
            store.abandon()
            raise
        self.store = store
        return [_with_storage(plan, {"staging": str(store.staging)}) for plan in plans]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        staging = Path(plan.storage_data["staging"])
        results = []
        arrays: dict[str, Any] = {}
        for item in plan.items:
            fqn = item.index.fqn
            if item.type == WriteItemType.BYTE_IO:
                value = _json_value(planner, item.index)
                results.append(WriteResult(item.index, 0, {"value": value}))
                continue
            data = item.tensor_data
            assert data is not None
            tensor = planner.resolve_data(item)
            assert isinstance(tensor, torch.Tensor)
            with destination_errors(self.path):  # a full disk, a file size limit
                if fqn not in arrays:
                    arrays[fqn] = zstore.open_region(staging / fqn)
                nbytes = zstore.write_region(
                    arrays[fqn],
                    tuple(data.chunk.offsets),
                    tensor.detach(),
                    buffer_bytes=self.buffer_bytes,
                )
            results.append(WriteResult(item.index, nbytes, {"array": fqn}))
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Commit: move the arrays into place, then write the group's ``zarr.json`` last."""
        store = self.store
        if store is None:
            raise RuntimeError("ZarrWriter.finish ran before prepare_global_plan")
        values: dict[str, Any] = {}
        for rank_results in results:
            for r in rank_results:
                if "value" in r.storage_data:
                    values[r.index.fqn] = r.storage_data["value"]
        store.metadata = dict(sorted(values.items(), key=lambda kv: _position(self.order)(kv[0])))
        store.saved[_VALUES] = list(store.metadata)
        try:
            store.commit()
        except BaseException:
            store.abandon()
            raise
        self.store = None

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=str(self.path))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return os.fspath(checkpoint_id).rstrip("/").endswith(".zarr")


def _position(order: list[str]) -> Any:
    """A sort key: a name's place in ``order`` (names not in it go last, in name order)."""
    where = {name: i for i, name in enumerate(order)}
    return lambda name: (where.get(name, len(where)), name)


def _with_storage(plan: SavePlan, storage: dict[str, Any]) -> SavePlan:
    import dataclasses

    return dataclasses.replace(plan, storage_data=storage)


def _json_value(planner: SavePlanner, index: MetadataIndex) -> Any:
    """A non-tensor entry as a JSON value, or a clear refusal (a store holds no pickles)."""
    lookup = getattr(planner, "lookup_object", None)
    if lookup is None:
        raise UnsupportedTensorError(
            f"{index.fqn!r} is not a tensor and {type(planner).__name__} cannot hand out the "
            "value itself; use DCP's DefaultSavePlanner, or leave non-tensor entries out"
        )
    value = lookup(index)
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        raise UnsupportedTensorError(
            f"{index.fqn!r} is a {type(value).__qualname__}: a Zarr store keeps tensors and "
            "JSON values (str, number, bool, None, list, dict), never pickles; convert it "
            "or leave it out of the state dict"
        ) from None
    return value


class ZarrReader(StorageReader):
    """A DCP ``StorageReader`` for Zarr v3 stores: any sharding, straight into the targets.

    Refuses a store whose save never committed
    (:class:`~tensorbridge.errors.UncommittedCheckpointError`).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        zstore.require_zarr()
        self.path = Path(path)
        self.file: zstore.ZarrFile | None = None

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id:
            self.path = Path(checkpoint_id)
        self.file = None

    def _open(self) -> zstore.ZarrFile:
        if self.file is None:
            self.file = zstore.ZarrFile(self.path)
        return self.file

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """Each array as one whole-tensor chunk, each DCP value as a bytes entry."""
        f = self._open()
        entries: dict[str, Any] = {}
        for name in f:
            row, shape = f.info(name)
            size = torch.Size(shape)
            entries[name] = TensorStorageMetadata(
                TensorProperties(dtype=row.torch),
                size,
                [ChunkStorageMetadata(torch.Size([0] * len(shape)), size)],
            )
        for name in self._values():
            entries[name] = BytesStorageMetadata()
        return Metadata(state_dict_metadata=entries, storage_meta=StorageMeta())

    def _values(self) -> dict[str, Any]:
        f = self._open()
        values = f.plain_values()
        saved = f.saved_attributes().get(_VALUES, [])
        return {k: values[k] for k in saved if k in values}

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        self._open()

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        f = self._open()
        values = self._values()
        for req in plan.items:
            fqn = req.storage_index.fqn
            if req.type == LoadItemType.BYTE_IO:
                buf = io.BytesIO()
                torch.save(values[fqn], buf)  # a JSON value: the planner unpickles our own bytes
                buf.seek(0)
                planner.load_bytes(req, buf)
                continue
            where = tuple(
                slice(o, o + n) for o, n in zip(req.storage_offsets, req.lengths, strict=True)
            )
            target = planner.resolve_tensor(req).detach()
            _read_into(f.array(fqn), where, target, f.info(fqn)[0].torch)
            planner.commit_tensor(req, target)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return os.fspath(checkpoint_id).rstrip("/").endswith(".zarr")


def _read_into(
    array: Any, where: tuple[slice, ...], target: torch.Tensor, stored: torch.dtype
) -> None:
    """Read a region of ``array`` into ``target``: decoded chunks go straight into its memory."""
    from zarr.core.buffer import default_buffer_prototype

    if target.device.type == "cpu" and target.dtype is stored and target.numel():
        view = to_numpy(target)  # shares the target's memory (a bit-cast view for bf16/fp8)
        out = default_buffer_prototype().nd_buffer.from_numpy_array(view)
        array.get_basic_selection(where, out=out)
        return
    if not target.numel():
        return
    target.copy_(to_torch(array.get_basic_selection(where)))  # another device or dtype
