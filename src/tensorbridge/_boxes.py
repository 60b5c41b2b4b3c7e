"""Whether boxes of a tensor overlap: the check behind "the chunks tile the tensor".

A DCP checkpoint stores a tensor as boxes (``offsets``, ``sizes``) of its global
shape; its reader and both of tensorbridge's DCP writers refuse boxes that overlap
(with the element count, disjoint boxes inside the shape tile it exactly). The
metadata is untrusted, so the check must stay fast for any box count: comparing every
box with every box it shares a row with took a minute for a (1, 8000) tensor in 8,000
column chunks.

:func:`first_overlap` first drops the dimensions in which every box has the same
extent (they separate no two boxes), then:

* one dimension left: sort, and compare each box with the furthest-reaching one before
  it: O(N log N);
* two: sweep along the first, keeping the open boxes' extents along the second in a
  sorted list (they are disjoint, so a new box meets one of them only if it meets its
  neighbours there): O(N log N);
* more: mark a grid of the boxes' own boundaries (each cell at most once, so the work
  is the number of cells, which is N for the grid layouts sharding makes), or, where
  that grid would pass ``MAX_WORK // 4`` cells, the plain sweep, which raises
  :class:`TooIrregular` past ``MAX_WORK`` comparisons rather than run on.

>>> first_overlap([((0, 0), (1, 2)), ((0, 2), (1, 2))]) is None
True
>>> first_overlap([((0, 0), (1, 3)), ((0, 2), (1, 2))])
(0, 1)
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence

import numpy as np

__all__ = ["MAX_WORK", "Box", "TooIrregular", "first_overlap"]

Box = tuple[Sequence[int], Sequence[int]]  # (offsets, sizes), neither empty of elements

MAX_WORK = 1 << 24  # grid cells or box comparisons for three or more split dimensions


class TooIrregular(Exception):
    """Boxes split along three or more dimensions in no grid: too costly to check."""


def first_overlap(boxes: Sequence[Box]) -> tuple[int, int] | None:
    """Indices ``(i, j)`` of two overlapping boxes (``i`` first in offset order), or None.

    Every box must hold at least one element; all have the same number of dimensions.

    Raises:
        TooIrregular: three or more dimensions split irregularly, past ``MAX_WORK``.
    """
    if len(boxes) < 2:
        return None
    ndim = len(boxes[0][0])
    split = [d for d in range(ndim) if len({(int(b[0][d]), int(b[1][d])) for b in boxes}) > 1]
    if not split:  # every box is the same box
        return _ordered(boxes, 0, 1)
    spans = [
        [(int(b[0][d]), int(b[0][d]) + int(b[1][d])) for d in split] for b in boxes
    ]  # per box, (start, end) along each split dimension
    if len(split) == 1:
        found = _overlap_1d([s[0] for s in spans])
    elif len(split) == 2:
        found = _overlap_2d(spans)
    else:
        found = _overlap_nd(spans)
    return None if found is None else _ordered(boxes, *found)


def _ordered(boxes: Sequence[Box], i: int, j: int) -> tuple[int, int]:
    return (i, j) if tuple(boxes[i][0]) <= tuple(boxes[j][0]) else (j, i)


def _overlap_1d(spans: list[tuple[int, int]]) -> tuple[int, int] | None:
    order = sorted(range(len(spans)), key=spans.__getitem__)
    reach = order[0]  # the box reaching furthest so far
    for i in order[1:]:
        if spans[i][0] < spans[reach][1]:
            return reach, i
        if spans[i][1] > spans[reach][1]:
            reach = i
    return None


def _overlap_2d(spans: list[list[tuple[int, int]]]) -> tuple[int, int] | None:
    order = sorted(range(len(spans)), key=lambda i: spans[i][0])
    starts: list[int] = []  # the open boxes' starts along dimension 2, sorted (disjoint)
    open_: list[int] = []  # their indices, in the same order
    closing: list[tuple[int, int]] = []  # (end along dimension 1, index): a heap
    for i in order:
        (a0, _), (b0, b1) = spans[i]
        while closing and closing[0][0] <= a0:
            _, j = heapq.heappop(closing)
            at = bisect.bisect_left(starts, spans[j][1][0])
            del starts[at], open_[at]
        at = bisect.bisect_left(starts, b0)
        if at < len(starts) and starts[at] < b1:
            return open_[at], i
        if at > 0 and spans[open_[at - 1]][1][1] > b0:
            return open_[at - 1], i
        starts.insert(at, b0)
        open_.insert(at, i)
        heapq.heappush(closing, (spans[i][0][1], i))
    return None


def _overlap_nd(spans: list[list[tuple[int, int]]]) -> tuple[int, int] | None:
    cuts = [sorted({x for s in spans for x in s[d]}) for d in range(len(spans[0]))]
    cells = math.prod(len(c) - 1 for c in cuts)
    if cells <= MAX_WORK // 4:  # 16 MiB of cell owners at most
        return _overlap_grid(spans, cuts)
    return _overlap_sweep(spans)


def _overlap_grid(
    spans: list[list[tuple[int, int]]], cuts: list[list[int]]
) -> tuple[int, int] | None:
    """Each box marks its cells of the grid of all boundaries; a marked cell is an overlap."""
    owner = np.full([len(c) - 1 for c in cuts], -1, np.int32)
    index = [{x: k for k, x in enumerate(c)} for c in cuts]
    for i, s in enumerate(spans):
        region = owner[tuple(slice(index[d][lo], index[d][hi]) for d, (lo, hi) in enumerate(s))]
        taken = region[region >= 0]
        if taken.size:
            return int(taken[0]), i
        region[...] = i
    return None


def _overlap_sweep(spans: list[list[tuple[int, int]]]) -> tuple[int, int] | None:
    """Along dimension 1, each box against the boxes still open there, up to ``MAX_WORK``."""
    order = sorted(range(len(spans)), key=lambda i: spans[i][0])
    active: list[int] = []
    work = 0
    for i in order:
        active = [j for j in active if spans[j][0][1] > spans[i][0][0]]
        work += len(active) + 1
        if work > MAX_WORK:
            raise TooIrregular(
                f"{len(spans)} boxes split along {len(spans[0])} dimensions in no grid"
            )
        for j in active:
            if all(
                a0 < b1 and b0 < a1
                for (a0, a1), (b0, b1) in zip(spans[j][1:], spans[i][1:], strict=True)
            ):
                return j, i
        active.append(i)
    return None
