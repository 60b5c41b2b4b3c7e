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

import math
from collections.abc import Sequence

from .._boxes import Box, TooIrregular, first_overlap
from ..errors import UnsupportedTensorError


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
    """Raise at the first two boxes that overlap (O(N log N): see :mod:`tensorbridge._boxes`)."""
    try:
        found = first_overlap(boxes)
    except TooIrregular as err:
        raise UnsupportedTensorError(
            f"tensor {name!r}: {err}, too many to check that they tile it; redistribute "
            "the tensor to fewer Shard placements before saving"
        ) from None
    if found is not None:
        _overlap(name, boxes[found[0]], boxes[found[1]])


def _overlap(name: str, a: Box, b: Box) -> None:
    raise UnsupportedTensorError(
        f"tensor {name!r}: the ranks' chunks at offsets {tuple(a[0])} and {tuple(b[0])} "
        "overlap, so they do not tile it (an interleaved _StridedShard placement); "
        "redistribute the tensor to Shard/Replicate placements before saving"
    )
