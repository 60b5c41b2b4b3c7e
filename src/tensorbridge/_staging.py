"""How the tree functions convert many leaves as few copies: tie planning and staging.

``tree_to_numpy`` / ``tree_to_torch`` hand over the leaves that need a copy, a cast
or a device transfer, each as a :class:`Leaf` with its :class:`Layout` (where its
bytes are). Planning groups the leaves whose bytes overlap in one memory, so that
each group converts once, as one span, and its members come back as views of it
with the same offsets and strides: ties survive a copy, a cast or a transfer.
Executing runs the groups: those that stay on their device convert there;
device -> host ones go through one pinned staging buffer, every copy
``non_blocking``, one wait per device; host -> device ones are staged likewise and
nothing waits. Shrinking casts run before a transfer and widening ones after, so
the fewest bytes cross the bus. A :class:`Cursor` follows the leaf being worked
on, so that an error can name its key path.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from . import _memory as mem
from .dtypes import BY_TORCH, DTypeRow

HOST = "host"  # the `where` of CPU memory: one address space shared by tensors and arrays
ALIGN = 64  # staging slots start on cache-line boundaries (and so suit every dtype)


# --- the leaves handed over, and the cursor that follows them ---------------------------------


class Cursor:
    """The index of the leaf being converted, for the key path of an error."""

    __slots__ = ("index",)

    def __init__(self) -> None:
        self.index: int | None = None


class Leaf(NamedTuple):
    """A leaf converted together with the leaves it shares memory with."""

    at: int  # its position among the tree's leaves
    value: Any  # a plain (detached) tensor or an ndarray
    src: DTypeRow
    dst: DTypeRow
    layout: Layout


# --- planning: which leaves share memory, and where staged bytes go ---------------------------


class Layout(NamedTuple):
    """Where a leaf's bytes are: ``where`` names the memory, the rest are in bytes."""

    where: Hashable  # HOST (absolute addresses) or (device, storage address)
    start: int  # the address of element 0 within ``where``
    stop: int  # one past the last byte (``start`` for an empty leaf)
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # non-negative
    itemsize: int
    dtype: str  # two leaves are alike only if their dtypes are too

    @staticmethod
    def of(
        where: Hashable, start: int, shape: tuple[int, ...], strides: tuple[int, ...], row: DTypeRow
    ) -> Layout:
        stop = start
        if 0 not in shape:
            reach = sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
            stop = start + reach + row.itemsize
        return Layout(where, start, stop, shape, strides, row.itemsize, row.name)


class Group(NamedTuple):
    """Leaves converted as one: ``shared`` means views into one converted span [lo, hi)."""

    members: tuple[int, ...]  # positions in the planned list, in tree order
    lo: int
    hi: int
    shared: bool  # False: every member has the same layout; convert the first one itself


def tensor_layout(t: torch.Tensor, row: DTypeRow, by_address: bool) -> Layout:
    size = row.itemsize
    strides = tuple(s * size for s in t.stride())
    if by_address:  # host memory: comparable with arrays' addresses
        return Layout.of(HOST, t.data_ptr(), tuple(t.shape), strides, row)
    where = (t.device, t.untyped_storage().data_ptr())
    return Layout.of(where, int(t.storage_offset()) * size, tuple(t.shape), strides, row)


def array_layout(a: np.ndarray, row: DTypeRow) -> Layout:
    return Layout.of(HOST, mem.address(a), tuple(a.shape), tuple(a.strides), row)


def plan_groups(entries: Sequence[tuple[Layout, Hashable]]) -> list[Group]:
    """Partition leaves into groups converted as one, so copies overlap as their sources did.

    ``entries[k]`` is a leaf's layout and its transform (``None`` for a plain copy, or
    what it is cast to). Leaves with the same memory and transform whose byte ranges
    overlap (transitively) form one group; leaves that overlap nothing are groups of one.
    A member whose offset in the span is not a whole number of its items is split off
    (it cannot be a view there); it loses the tie but still converts correctly.
    """
    by_key: dict[Hashable, list[int]] = defaultdict(list)
    groups: list[Group] = []
    for k, (layout, transform) in enumerate(entries):
        if layout.stop == layout.start:  # empty: no memory to share
            groups.append(Group((k,), layout.start, layout.start, False))
        else:
            by_key[(layout.where, transform)].append(k)
    for members in by_key.values():
        members.sort(key=lambda k: entries[k][0].start)
        component: list[int] = []
        hi = 0
        for k in members:
            layout = entries[k][0]
            if component and layout.start < hi:
                component.append(k)
                hi = max(hi, layout.stop)
            else:
                groups.extend(close_component(component, entries))
                component, hi = [k], layout.stop
        groups.extend(close_component(component, entries))
    groups.sort(key=lambda g: g.members[0])
    return groups


def close_component(
    component: list[int], entries: Sequence[tuple[Layout, Hashable]]
) -> list[Group]:
    if len(component) < 2:
        return [Group((k,), entries[k][0].start, entries[k][0].stop, False) for k in component]
    layouts = [entries[k][0] for k in component]
    members = tuple(sorted(component))
    if all(layout == layouts[0] for layout in layouts):
        return [Group(members, layouts[0].start, layouts[0].stop, False)]
    lo = min(layout.start for layout in layouts)
    misaligned = [k for k in component if (entries[k][0].start - lo) % entries[k][0].itemsize]
    if misaligned:
        rest = [k for k in component if k not in misaligned]
        return close_component(rest, entries) + [
            g for k in misaligned for g in close_component([k], entries)
        ]
    hi = max(layout.stop for layout in layouts)
    return [Group(members, lo, hi, True)]


def plan_staging(nbytes: Sequence[int], align: int = ALIGN) -> tuple[list[int], int]:
    """Offsets of consecutive slots in one staging buffer, each ``align``-ed, and its size."""
    offsets = []
    total = 0
    for n in nbytes:
        offsets.append(total)
        total += -(-n // align) * align
    return offsets, total


# --- executing a plan -------------------------------------------------------------------------


class Job(NamedTuple):
    """One group's conversion: ``source`` is a tensor over its bytes, ``cast`` its new dtype."""

    group: Group
    source: torch.Tensor
    cast: torch.dtype | None
    at: int  # the tree position of the group's first leaf, for errors


def make_job(group: Group, planned: Sequence[Leaf]) -> Job:
    first = planned[group.members[0]]
    cast = None if first.dst is first.src else first.dst.torch
    if not group.shared:
        value = first.value
        if isinstance(value, np.ndarray):
            value = mem.reader(value, first.src)
        if not first.src.kernels:  # int4, ...: torch copies its carrier's bytes, not it
            value = value.view(first.src.carrier)
        return Job(group, value, cast, first.at)
    n = group.hi - group.lo
    if first.layout.where == HOST:
        owners = [planned[k].value for k in group.members]
        span = mem.host_view(group.lo, (n,), None, mem.BYTE, owners)
    else:
        t = first.value
        span = torch.empty(0, dtype=torch.uint8, device=t.device)
        span.set_(t.untyped_storage(), group.lo, (n,), (1,))
    return Job(group, span if cast is None else span.view(first.src.torch), cast, first.at)


def plan_jobs(planned: Sequence[Leaf], cursor: Cursor) -> list[Job]:
    """The plan for the planned leaves: one job for each group that shares memory."""
    entries = [
        (leaf.layout, None if leaf.dst is leaf.src else (leaf.src, leaf.dst)) for leaf in planned
    ]
    jobs = []
    for group in plan_groups(entries):
        cursor.index = planned[group.members[0]].at
        jobs.append(make_job(group, planned))
    return jobs


def convert_planned(
    planned: Sequence[Leaf], target: torch.device | None, cursor: Cursor
) -> dict[int, torch.Tensor]:
    """Convert planned leaves group by group; leaf index -> tensor (on the host for NumPy)."""
    cursor.index = None  # a target torch cannot reach is no one leaf's fault
    dest_all = None if target is None else mem.indexed(target)
    done: list[tuple[Job, torch.Tensor]] = []
    to_host: list[Job] = []
    to_device: list[Job] = []
    for job in plan_jobs(planned, cursor):
        here = job.source.device
        dest = here if dest_all is None else dest_all
        if dest == here:
            cursor.index = job.at
            done.append((job, copy_here(job.source, job.cast)))
        elif dest.type == "cpu":
            to_host.append(job)
        else:
            to_device.append(job)
    if to_host:
        done.extend(zip(to_host, gather(to_host, cursor), strict=True))
    if to_device:
        assert dest_all is not None  # only a target can be another device
        done.extend(zip(to_device, scatter(to_device, dest_all, cursor), strict=True))
    return rebuild(done, planned)


def copy_here(src: torch.Tensor, cast: torch.dtype | None) -> torch.Tensor:
    """A same-device copy (cast on the way); on the host, the faster allocation for its size."""
    row = BY_TORCH.get(cast or src.dtype)
    if src.device.type != "cpu" or row is None or not src.is_contiguous():
        return src.to(cast) if cast is not None else src.clone()
    return mem.host_copy(src, row)


def slot_view(
    staging: torch.Tensor, offset: int, dtype: torch.dtype, shape: torch.Size
) -> torch.Tensor:
    size = dtype.itemsize * shape.numel()
    return staging[offset : offset + size].view(dtype).view(shape)


def gather(jobs: Sequence[Job], cursor: Cursor) -> list[torch.Tensor]:
    """Device -> host for every job: one pinned buffer, non-blocking copies, one wait a device.

    Casts that shrink the data run on the device before the copy; casts that widen it
    run on the host after the wait, so the fewest bytes cross the bus.
    """
    sources = []
    for job in jobs:
        cursor.index = job.at
        src = job.source
        if job.cast is not None and job.cast.itemsize <= src.element_size():
            src = src.to(job.cast)
        sources.append(src)
    offsets, total = plan_staging([s.numel() * s.element_size() for s in sources])
    staging = mem.staging(total)
    slots = []
    for job, src, offset in zip(jobs, sources, offsets, strict=True):
        cursor.index = job.at
        slot = slot_view(staging, offset, src.dtype, src.shape)
        slot.copy_(src, non_blocking=True)
        slots.append(slot)
    cursor.index = None
    for device in {s.device for s in sources}:
        mem.wait(device)
    bufs = []
    for job, slot in zip(jobs, slots, strict=True):
        cursor.index = job.at
        bufs.append(slot if job.cast is None or slot.dtype is job.cast else slot.to(job.cast))
    return bufs


def scatter(jobs: Sequence[Job], device: torch.device, cursor: Cursor) -> list[torch.Tensor]:
    """Host -> device for every job through one pinned buffer, copies issued non-blocking.

    Nothing waits: the copies are ordered on the current stream, and torch's pinned
    allocator keeps the staging memory until they are done. Shrinking casts run on the
    host into the staging buffer; widening ones on the device after the copy.
    """
    dtypes = [
        j.cast
        if j.cast is not None and j.cast.itemsize < j.source.element_size()
        else j.source.dtype
        for j in jobs
    ]
    sizes = [j.source.numel() * d.itemsize for j, d in zip(jobs, dtypes, strict=True)]
    offsets, total = plan_staging(sizes)
    staging = mem.staging(total)
    bufs = []
    for job, dtype, offset in zip(jobs, dtypes, offsets, strict=True):
        cursor.index = job.at
        slot = slot_view(staging, offset, dtype, job.source.shape)
        slot.copy_(job.source)
        moved = slot.to(device, non_blocking=True)
        bufs.append(moved if job.cast is None or moved.dtype is job.cast else moved.to(job.cast))
    return bufs


def rebuild(
    done: Iterable[tuple[Job, torch.Tensor]], planned: Sequence[Leaf]
) -> dict[int, torch.Tensor]:
    """Leaf position -> its converted tensor, from each job and its converted buffer."""
    made: dict[int, torch.Tensor] = {}
    for job, buf in done:
        place_members(job.group, buf, planned, made)
    return made


def place_members(
    group: Group, buf: torch.Tensor, planned: Sequence[Leaf], made: dict[int, torch.Tensor]
) -> None:
    """Each member of a converted group, as a view of ``buf`` laid out like its source."""
    if not group.shared:
        first = planned[group.members[0]]
        if buf.dtype is not first.dst.torch:  # moved as its carrier's bytes (int4, ...)
            buf = buf.view(first.dst.torch)
        made[first.at] = buf
        for k in group.members[1:]:  # alike but distinct objects: distinct views of one copy
            made[planned[k].at] = buf.as_strided(buf.shape, buf.stride(), buf.storage_offset())
        return
    base = buf.storage_offset() * buf.element_size()  # bytes into buf's storage
    storage = buf.untyped_storage()
    for k in group.members:
        leaf = planned[k]
        layout = leaf.layout
        if leaf.dst is leaf.src:  # buf holds the span's bytes as they were
            row = leaf.src
            offset = (base + layout.start - group.lo) // row.itemsize
        else:  # buf holds the span cast element by element
            row = leaf.dst
            offset = base // row.itemsize + (layout.start - group.lo) // layout.itemsize
        strides = [s // layout.itemsize for s in layout.strides]
        view = torch.empty(0, dtype=row.torch, device=buf.device)
        view.set_(storage, offset, layout.shape, strides)
        made[leaf.at] = view
