"""DTensors: this rank's block, or the whole tensor through one collective; never the storage.

A DTensor (``torch.distributed.tensor``) is one logical tensor split across the ranks of
a device mesh. It reports the *global* shape while its storage on a rank holds only that
rank's local tensor, so reading it as if it were whole (``np.from_dlpack(x)``) silently
returns memory that is not the tensor. The rules:

* **Refuse by default.** ``to_numpy`` / ``to_torch`` of a DTensor raise
  :class:`~tensorbridge.ShardedTensorError` naming the two honest options:
* **This rank's block** (:func:`local_block`, behind ``tb.local_shard``): the local
  tensor itself, its offset in the global tensor (torch's
  ``compute_local_shape_and_global_offset``), the global shape, and whether this rank
  holds the primary copy (coordinate 0 on every ``Replicate`` mesh dimension), so a
  writer can write each replicated block once. A local tensor that is not one block
  (a ``_StridedShard`` that interleaves pieces) is refused.
* **The whole tensor** (:func:`gather`, behind ``gather=True``): a collective every rank
  of the mesh calls. The global indices each mesh coordinate holds come from torch's own
  splitting rules (``Shard.local_shard_size_and_offset`` and ``_StridedShard``'s
  ``_split_tensor``, the ones ``distribute_tensor`` scatters with), per tensor dimension;
  they must tile the tensor exactly (every element once, replicated copies counted once).
  Each rank's bytes then travel as ``uint8`` (gloo has no float8, e8m0 or bool, and
  torch's ``full_tensor`` fails there with "Invalid scalar type"), one ``all_gather`` per
  mesh dimension that is not replicated, and are placed by those indices. Where the
  blocks do not tile, torch's own redistribution (``full_tensor``) does the work on the
  same ``uint8`` bits instead of assembling overlapping blocks.
* **Partial** placements hold per-rank values that only a reduction can combine: refused.

Nothing here imports ``torch.distributed`` before a DTensor exists: :func:`is_dtensor`
looks for the class in ``sys.modules``.

>>> import torch
>>> is_dtensor(torch.ones(2))
False
"""

from __future__ import annotations

import functools
import itertools
import math
import sys
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .errors import ShardedTensorError

__all__ = [
    "Block",
    "Layout",
    "gather",
    "is_dtensor",
    "layout",
    "local_block",
    "note",
    "redistributed",
    "refusal",
    "signature",
    "stand_in",
    "tiles",
]

Index = range | np.ndarray  # the global indices a block holds along one tensor dimension


def is_dtensor(x: Any) -> bool:
    """Whether ``x`` is a DTensor (without importing ``torch.distributed``)."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(x, module.DTensor)


def signature(x: Any) -> Hashable:
    """What a DTensor's plan depends on: its type, dtype, device and placements."""
    return (type(x), x.dtype, x.device, tuple(x.placements))


def stand_in(x: Any) -> torch.Tensor:
    """An empty host tensor of ``x``'s dtype: what the gathered tensor is planned as."""
    return torch.empty(0, dtype=torch.uint8).view(x.dtype)  # no allocation, no warning


def _where(x: Any) -> str:
    placements = ", ".join(repr(p) for p in x.placements)
    mesh = tuple(x.device_mesh.shape)
    return f"global shape {tuple(x.shape)}, placements ({placements}) on a mesh of shape {mesh}"


def note(x: Any) -> str:
    """What ``describe`` says about a DTensor: where it lives and the two ways to read it."""
    return (
        f"a DTensor ({_where(x)}): this rank's storage holds only its local tensor of shape "
        f"{tuple(x.to_local().shape)}; tb.local_shard(x) gives that block, gather=True the "
        "whole tensor"
    )


def refusal(x: Any, what: str) -> ShardedTensorError:
    """The error for converting a DTensor as if it were whole (``what``: the converter)."""
    if what == "to_torch":
        fix = (
            "pass tb.to_torch(x, gather=True) for the whole tensor on every rank (a collective "
            "every rank must call), or x.to_local() for this rank's block"
        )
    else:
        fix = (
            "pass tb.local_shard(x) for this rank's block (zero-copy), or "
            f"tb.{what}(x, gather=True) for the whole array on every rank (a collective every "
            "rank must call)"
        )
    return ShardedTensorError(
        f"a DTensor ({_where(x)}) keeps only this rank's part in its storage; {fix}"
    )


def _strided_type() -> type | None:
    from torch.distributed.tensor import placement_types

    found: type | None = getattr(placement_types, "_StridedShard", None)
    return found


def _shard_dim(p: Any, ndim: int) -> int | None:
    """The tensor dimension a placement splits (``None``: it does not split one)."""
    strided = _strided_type()
    if (strided is not None and isinstance(p, strided)) or p.is_shard():
        dim: int = p.dim
        return dim + ndim if dim < 0 else dim
    return None


def check_placements(x: Any) -> None:
    """Refuse the placements no byte copy can honour (``Partial``, unknown kinds)."""
    ndim = x.ndim
    for i, p in enumerate(x.placements):
        if p.is_partial():
            raise ShardedTensorError(
                f"a DTensor with placement {p!r} on mesh dimension {i} ({_where(x)}) holds "
                "per-rank partial values that only a reduction can combine; reduce it first "
                "(x.redistribute(placements=...) with Replicate() or Shard(d) in place of "
                f"{p!r}), then convert"
            )
        if not p.is_replicate() and _shard_dim(p, ndim) is None:
            raise ShardedTensorError(
                f"a DTensor with placement {p!r} on mesh dimension {i} ({_where(x)}): "
                "tensorbridge knows Shard, _StridedShard and Replicate only; redistribute it "
                "to those first"
            )


# --- which global indices each mesh coordinate holds ------------------------------------------


def _compact(indices: np.ndarray) -> Index:
    """A range where the indices are consecutive, else the array itself."""
    n = indices.size
    if n == 0:
        return range(0)
    first = int(indices[0])
    if int(indices[-1]) - first == n - 1 and (n == 1 or bool(np.all(np.diff(indices) == 1))):
        return range(first, first + n)
    return indices


def _split(index: Index, p: Any, num_chunks: int, rank: int, strided: Any) -> Index:
    """The part of ``index`` that mesh coordinate ``rank`` keeps under placement ``p``."""
    n = len(index)
    if strided is not None and isinstance(p, strided):
        # _StridedShard interleaves: split positions with the very function torch splits
        # data with (distribute_tensor, redistribute), then look the positions up
        positions = torch.arange(n).view([1] * p.dim + [n])
        parts, _ = p._split_tensor(positions, num_chunks, with_padding=False, contiguous=False)
        picked = parts[rank].reshape(-1).numpy() if rank < len(parts) else np.empty(0, np.int64)
        return _compact(np.asarray(index)[picked])
    from torch.distributed.tensor import Shard

    size, start = Shard.local_shard_size_and_offset(n, num_chunks, rank)
    part = index[int(start) : int(start) + int(size)]
    return part if isinstance(part, range) else _compact(part)


def _overlap(a: Index, b: Index) -> bool:
    if isinstance(a, range) and isinstance(b, range):
        return max(a.start, b.start) < min(a.stop, b.stop)
    return bool(np.intersect1d(np.asarray(a), np.asarray(b), assume_unique=True).size)


def tiles(shape: tuple[int, ...], blocks: Sequence[tuple[Index, ...]]) -> bool:
    """Whether the blocks hold every element of ``shape`` exactly once."""
    full = [b for b in blocks if all(len(i) for i in b)]
    for b in full:
        for i, n in zip(b, shape, strict=True):
            if isinstance(i, np.ndarray) and (
                np.unique(i).size != i.size or i.min() < 0 or i.max() >= n
            ):
                return False
            if isinstance(i, range) and (i.start < 0 or i.stop > n):
                return False
    if sum(math.prod(len(i) for i in b) for b in full) != math.prod(shape):
        return False
    return not any(
        all(_overlap(i, j) for i, j in zip(a, b, strict=True))
        for a, b in itertools.combinations(full, 2)
    )


def _selection(block: tuple[Index, ...]) -> Any:
    """The NumPy index that places a block (slices where it is contiguous)."""
    if sum(isinstance(i, np.ndarray) for i in block) <= 1:
        return tuple(slice(i.start, i.stop) if isinstance(i, range) else i for i in block)
    return np.ix_(*(np.arange(i.start, i.stop) if isinstance(i, range) else i for i in block))


@dataclass(frozen=True, eq=False)
class Layout:
    """Where every part of a DTensor lives: one block per coordinate of the splitting dims.

    Attributes:
        shape: the global shape.
        dims: the mesh dimensions whose coordinates hold different parts (Shard-like);
            the others replicate.
        sizes: the mesh's size along each of ``dims``.
        blocks: per coordinate over ``dims`` (row-major), the global indices held along
            each tensor dimension (a ``range`` where they are consecutive).
        tiles: whether the blocks hold every element exactly once.
    """

    shape: tuple[int, ...]
    dims: tuple[int, ...]
    sizes: tuple[int, ...]
    blocks: tuple[tuple[Index, ...], ...]
    tiles: bool

    def position(self, coordinate: Sequence[int]) -> int:
        """The block of a mesh coordinate (row-major over ``dims``)."""
        at = 0
        for d, n in zip(self.dims, self.sizes, strict=True):
            at = at * n + int(coordinate[d])
        return at

    def block_shape(self, at: int) -> tuple[int, ...]:
        return tuple(len(i) for i in self.blocks[at])

    def coordinate(self, at: int) -> tuple[int, ...]:
        """The coordinate over ``dims`` of block ``at``."""
        out = []
        for n in reversed(self.sizes):
            out.append(at % n)
            at //= n
        return tuple(reversed(out))


@functools.lru_cache(maxsize=256)
def layout(
    shape: tuple[int, ...], mesh_shape: tuple[int, ...], placements: tuple[Any, ...]
) -> Layout:
    """The :class:`Layout` of a tensor of ``shape`` split by ``placements`` on a mesh.

    Placements apply left to right, each splitting what the previous ones left of its
    tensor dimension, as torch's ``compute_local_shape_and_global_offset`` does.
    """
    strided: Any = _strided_type()
    ndim = len(shape)
    dims = tuple(i for i, p in enumerate(placements) if _shard_dim(p, ndim) is not None)
    sizes = tuple(mesh_shape[i] for i in dims)
    blocks = []
    for coordinate in itertools.product(*(range(n) for n in sizes)):
        index: list[Index] = [range(n) for n in shape]
        for i, c in zip(dims, coordinate, strict=True):
            p = placements[i]
            d = _shard_dim(p, ndim)
            assert d is not None
            index[d] = _split(index[d], p, mesh_shape[i], c, strided)
        blocks.append(tuple(index))
    return Layout(shape, dims, sizes, tuple(blocks), tiles(shape, blocks))


# --- this rank's block ------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """This rank's local tensor and where it sits in the global tensor."""

    local: torch.Tensor
    offset: tuple[int, ...]
    global_shape: tuple[int, ...]
    primary: bool


def local_block(x: Any) -> Block:
    """This rank's block of DTensor ``x`` (no communication); refuses what is not one block."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    check_placements(x)
    mesh = x.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise ShardedTensorError(
            f"this rank is not part of the DTensor's device mesh ({_where(x)}), so it holds "
            "no block; call local_shard on the mesh's ranks"
        )
    placements = tuple(x.placements)
    shape = tuple(x.shape)
    lay = layout(shape, tuple(mesh.shape), placements)
    at = lay.position(coordinate)
    for d, index in enumerate(lay.blocks[at]):
        if not isinstance(index, range):
            shown = ", ".join(str(int(v)) for v in index[:6]) + (", ..." if len(index) > 6 else "")
            raise ShardedTensorError(
                f"this rank's local tensor is not one block of the DTensor ({_where(x)}): it "
                f"holds indices [{shown}] of dimension {d}, interleaved by the _StridedShard "
                "placement; pass gather=True for the whole array, or redistribute x to "
                "Shard / Replicate placements first"
            )
    local = x.to_local()
    local_shape, offset = compute_local_shape_and_global_offset(shape, mesh, placements)
    if not tuple(local.shape) == tuple(local_shape) == lay.block_shape(at):
        raise _mismatch(x, tuple(local.shape), lay.block_shape(at))
    primary = all(coordinate[i] == 0 for i, p in enumerate(placements) if p.is_replicate())
    return Block(local, tuple(int(o) for o in offset), shape, primary)


def _mismatch(x: Any, got: tuple[int, ...], expected: tuple[int, ...]) -> ShardedTensorError:
    return ShardedTensorError(
        f"a local tensor of the DTensor ({_where(x)}) has shape {got} where its placements "
        f"give {expected}; build uneven DTensors with DTensor.from_local(..., shape=, "
        "stride=) so every rank agrees on the global shape"
    )


# --- the whole tensor, on every rank ----------------------------------------------------------


def _bytes(t: torch.Tensor) -> np.ndarray:
    """A contiguous host tensor's memory as uint8 of shape ``(*t.shape, itemsize)``."""
    return t.reshape(*t.shape, 1).view(torch.uint8).numpy()


def _all_gather(buf: torch.Tensor, mesh: Any, dim: int, coordinate: Sequence[int]) -> torch.Tensor:
    """Every buffer along mesh dimension ``dim``, in coordinate order, end to end."""
    import torch.distributed as dist

    group = mesh.get_group(dim)
    n = int(mesh.shape[dim])
    out = torch.empty(n * buf.numel(), dtype=torch.uint8, device=buf.device)
    dist.all_gather(list(out.view(n, -1).unbind(0)), buf, group=group)
    index: list[Any] = list(coordinate)
    index[dim] = slice(None)
    along = mesh.mesh[tuple(index)].tolist()
    ranks = dist.get_process_group_ranks(group)
    order = [ranks.index(r) for r in along]  # a group's ranks need not follow the mesh
    if order != list(range(n)):
        out = out.view(n, -1)[order].reshape(-1)
    return out


def gather(x: Any) -> torch.Tensor:
    """The whole of DTensor ``x`` as a plain host tensor, on every rank of its mesh.

    A collective: every rank of the mesh must call it, in the same order as the other
    collectives. The result is new memory.
    """
    check_placements(x)
    if not torch.distributed.is_initialized():
        raise ShardedTensorError(
            f"gather=True is a collective, but no process group is running ({_where(x)}); "
            "call it before torch.distributed.destroy_process_group(), or pass "
            "tb.local_shard(x) for this rank's block"
        )
    mesh = x.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise ShardedTensorError(
            f"this rank is not part of the DTensor's device mesh ({_where(x)}); call gather "
            "on the mesh's ranks"
        )
    shape = tuple(x.shape)
    lay = layout(shape, tuple(mesh.shape), tuple(x.placements))
    if not lay.tiles:
        return redistributed(x)
    local = x.to_local().detach()
    itemsize = local.element_size()
    into = np.empty((*shape, itemsize), np.uint8)  # the result's bytes, filled block by block
    full = torch.from_numpy(into).view(local.dtype).reshape(shape)
    mine = lay.position(coordinate)
    fits = tuple(local.shape) == lay.block_shape(mine)
    if not lay.dims:  # every mesh dimension replicates: the local tensor is the tensor
        if not fits:
            raise _mismatch(x, tuple(local.shape), lay.block_shape(mine))
        into[...] = _bytes(local.contiguous().cpu())
        return full
    # one status byte (1: this rank's local tensor has its block's shape), then the bytes
    width = 1 + itemsize * max(math.prod(lay.block_shape(j)) for j in range(len(lay.blocks)))
    buf = torch.zeros(width, dtype=torch.uint8, device=local.device)
    if fits:
        buf[0] = 1
        n = local.numel() * itemsize
        if n:
            buf[1 : 1 + n].copy_(local.contiguous().reshape(-1).view(torch.uint8))
    for dim in reversed(lay.dims):
        buf = _all_gather(buf, mesh, dim, coordinate)
    parts = buf.cpu().numpy().reshape(len(lay.blocks), width)
    wrong = np.flatnonzero(parts[:, 0] != 1)
    if wrong.size:  # every rank raises alike: all of them saw every status byte
        at = int(wrong[0])
        raise ShardedTensorError(
            f"the local tensor at mesh coordinate {lay.coordinate(at)} (mesh dimensions "
            f"{lay.dims}) of the DTensor ({_where(x)}) does not have the shape "
            f"{lay.block_shape(at)} its placements give; build uneven DTensors with "
            "DTensor.from_local(..., shape=, stride=) so every rank agrees"
        )
    for j, block in enumerate(lay.blocks):
        bshape = lay.block_shape(j)
        n = math.prod(bshape) * itemsize
        if n:
            into[_selection(block)] = parts[j, 1 : 1 + n].reshape(*bshape, itemsize)
    return full


def redistributed(x: Any) -> torch.Tensor:
    """The whole of ``x`` by torch's own redistribution, moving its bits as ``uint8``.

    Each element becomes ``itemsize`` bytes along a new last dimension, so every
    placement keeps its meaning, and ``full_tensor`` never sees a dtype gloo lacks.
    """
    from torch.distributed.tensor import DTensor

    local = x.to_local().detach().contiguous()
    itemsize = local.element_size()
    bits = local.reshape(*local.shape, 1).view(torch.uint8)
    shape = (*x.shape, itemsize)
    stride = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
    carrier = DTensor.from_local(
        bits, x.device_mesh, x.placements, run_check=False, shape=torch.Size(shape), stride=stride
    )
    try:
        whole: torch.Tensor = carrier.full_tensor().cpu().contiguous()
    except AssertionError as error:  # torch 2.10 cannot order a lone _StridedShard
        raise ShardedTensorError(
            f"torch {torch.__version__} cannot redistribute the DTensor ({_where(x)}) with "
            f"placements {tuple(x.placements)}; redistribute it to Shard / Replicate "
            "placements first, or upgrade torch (2.13 gathers it)"
        ) from error
    return whole.view(x.dtype).reshape(x.shape)
