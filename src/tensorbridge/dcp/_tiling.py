"""Check that the chunks DCP's ranks will write tile each tensor exactly.

A DTensor's chunk in DCP's plan is one box: its local shape at its first global
index. For ``_StridedShard`` placements that interleave (``(Shard(0),
_StridedShard(0, split_factor=2))``) a rank's elements are not one box, and the boxes
overlap; writing them would put some ranks' values at other ranks' indices. DCP's
default planner refuses such plans, but a writer must not rely on the planner, so
both writers check here, before anything is created.

>>> check_tiles("w", (4,), [((0,), (2,)), ((2,), (2,))])  # two halves: fine
>>> check_tiles("w", (4,), [((0,), (2,)), ((1,), (2,))])
Traceback (most recent call last):
...
tensorbridge.errors.UnsupportedTensorError: tensor 'w': the ranks' chunks at offsets (0,) \
and (1,) overlap, so they do not tile it (an interleaved _StridedShard placement); \
redistribute the tensor to Shard/Replicate placements before saving
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from ..errors import UnsupportedTensorError

Box = tuple[Sequence[int], Sequence[int]]  # (offsets, sizes)


def check_tiles(name: str, shape: Sequence[int], boxes: Sequence[Box]) -> None:
    """Raise unless ``boxes`` lie inside ``shape``, overlap nowhere and cover it all."""
    full = [b for b in boxes if math.prod(b[1]) > 0]
    for offsets, sizes in full:
        if len(offsets) != len(shape) or any(
            o < 0 or o + n > s for o, n, s in zip(offsets, sizes, shape, strict=True)
        ):
            raise UnsupportedTensorError(
                f"tensor {name!r}: a rank's chunk at offsets {tuple(offsets)} of sizes "
                f"{tuple(sizes)} lies outside its shape {tuple(shape)}; the state dict "
                "changed during the save, or the planner is wrong"
            )
    _check_disjoint(name, full)
    covered = sum(math.prod(b[1]) for b in full)
    if covered != math.prod(shape):
        raise UnsupportedTensorError(
            f"tensor {name!r}: the ranks' chunks hold {covered} of its "
            f"{math.prod(shape)} elements; DCP's planner must assign each element "
            "to exactly one rank (redistribute the tensor first)"
        )


def _check_disjoint(name: str, boxes: list[Box]) -> None:
    """A sweep along dimension 0: each box is compared only with those still open there."""
    if not boxes:
        return
    order = sorted(boxes, key=lambda b: tuple(b[0]))
    if len(order[0][0]) == 0:  # 0-dim: one element, so one writer at most
        if len(order) > 1:
            _overlap(name, order[0], order[1])
        return
    active: list[tuple[int, int]] = []  # (end along dim 0, index into order), sorted
    for i, box in enumerate(order):
        start = box[0][0]
        del active[: bisect.bisect_right(active, (start, len(order)))]
        for _, j in active:
            other = order[j]
            if all(
                o1 < o2 + n2 and o2 < o1 + n1
                for o1, n1, o2, n2 in zip(box[0], box[1], other[0], other[1], strict=True)
            ):
                _overlap(name, other, box)
        bisect.insort(active, (start + box[1][0], i))


def _overlap(name: str, a: Box, b: Box) -> None:
    raise UnsupportedTensorError(
        f"tensor {name!r}: the ranks' chunks at offsets {tuple(a[0])} and {tuple(b[0])} "
        "overlap, so they do not tile it (an interleaved _StridedShard placement); "
        "redistribute the tensor to Shard/Replicate placements before saving"
    )
