"""DTensors: refused by default, this rank's block zero-copy, the whole tensor by a collective.

The distributed cases run in spawned gloo process groups (``tests/_dist.py``), many
cases per spawn: each rank builds the unsharded reference from a seed, distributes it
with torch's own ``distribute_tensor`` (on ``uint8`` bits for the dtypes gloo lacks,
then ``DTensor.from_local``), converts it with tensorbridge and compares bytes. A rank
returns what it measured; the assertions run here, in the parent. Each world size
spawns once for the module (the ``two`` and ``four`` fixtures); the everyday run starts
the 2-rank group, and the tests of the 2x2 mesh (``four``) are ``slow``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import _StridedShard

import tensorbridge as tb
from _dist import run_ranks
from conftest import ROWS  # the rows torch has (NumPy-only ones: their own tests)
from tensorbridge import _dtensor as dtensor
from tensorbridge._versions import TORCH


def _ss(dim: int, split_factor: int) -> Any:
    return _StridedShard(dim, split_factor=split_factor)


# --- which indices each coordinate holds (pure: no process group) ----------------------------

LAYOUTS = [
    ((7, 3), (2, 2), (_ss(0, 2), Shard(0))),  # FSDP2 x TP, uneven: one block per rank
    ((9, 4), (2, 2), (_ss(0, 2), Shard(0))),
    ((5, 6), (2, 2), (_ss(1, 2), Shard(1))),
    ((8,), (2, 2), (Shard(0), _ss(0, 2))),  # interleaved: not blocks, still a tiling
    ((8,), (2,), (_ss(0, 2),)),
    ((3, 6), (2, 2), (Shard(0), _ss(1, 2))),
    ((2, 5), (4,), (Shard(0),)),  # empty shards
    ((1,), (4,), (Shard(0),)),
    ((3, 5), (2, 2), (Shard(1), Shard(0))),
    ((3, 5), (2, 2), (Replicate(), Shard(1))),
    ((5,), (2, 2), (Shard(0), Shard(0))),
    ((0, 3), (2,), (Shard(0),)),
    ((), (2,), (Replicate(),)),
]


def _torch_local(ref: torch.Tensor, mesh_shape: tuple[int, ...], placements: Any, at: Any) -> Any:
    """The local tensor distribute_tensor gives coordinate ``at``: torch's own splits."""
    t = ref
    for i, p in enumerate(placements):
        if not p.is_replicate():
            t = p._split_tensor(t, mesh_shape[i], with_padding=False)[0][at[i]]
    return t


@pytest.mark.parametrize("shape, mesh_shape, placements", LAYOUTS, ids=str)
def test_layout_holds_what_torch_distributes(
    shape: tuple[int, ...], mesh_shape: tuple[int, ...], placements: Any
) -> None:
    ref = torch.arange(math.prod(shape)).reshape(shape)
    lay = dtensor.layout(shape, mesh_shape, placements)

    assert lay.tiles
    for at in itertools.product(*(range(n) for n in mesh_shape)):
        block = lay.blocks[lay.position(at)]
        index = [np.arange(i.start, i.stop) if isinstance(i, range) else i for i in block]
        mine = ref.numpy()[np.ix_(*index)] if shape else ref.numpy()
        theirs = _torch_local(ref, mesh_shape, placements, at)
        shape_t, offset_t = _compute_local_shape_and_global_offset(
            shape, mesh_shape, list(at), list(placements)
        )
        assert mine.shape == tuple(theirs.shape) == tuple(shape_t)
        assert np.array_equal(mine, theirs.numpy())
        if all(len(i) for i in block):  # torch's offset is the first index held
            assert tuple(offset_t) == tuple(int(i[0]) for i in block)


def test_tiles_refuses_gaps_overlaps_and_repeats() -> None:
    whole = [(range(0, 2), range(0, 3)), (range(2, 4), range(0, 3))]
    overlap = [(range(0, 3), range(0, 3)), (range(1, 4), range(0, 1))]
    gap = [(range(0, 2), range(0, 3)), (range(3, 4), range(0, 3)), (range(2, 3), range(0, 2))]
    repeated = [(np.array([0, 0, 1, 2]), range(0, 3))]

    assert dtensor.tiles((4, 3), whole)
    assert not dtensor.tiles((4, 3), overlap)
    assert not dtensor.tiles((4, 3), gap)
    assert not dtensor.tiles((3, 3), repeated)
    assert not dtensor.tiles((2, 3), whole)  # out of bounds


def test_plain_tensors_ignore_gather_and_are_no_dtensor() -> None:
    t = torch.arange(6.0, dtype=torch.bfloat16)

    assert np.shares_memory(tb.to_numpy(t, gather=True), tb.to_numpy(t))
    assert tb.to_torch(tb.to_numpy(t), gather=True).dtype == torch.bfloat16
    with pytest.raises(tb.UnsupportedTensorError, match="local_shard expects a DTensor"):
        tb.local_shard(t)


# --- the distributed runs ---------------------------------------------------------------------


def _reference(row: tb.DTypeRow, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Random bits of ``row``'s dtype (bool: 0 or 1), the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    if row.torch is torch.bool:
        bits = torch.randint(0, 2, (n,), generator=g, dtype=torch.uint8)
    else:
        bits = torch.randint(0, 256, (n * row.itemsize,), generator=g, dtype=torch.uint8)
    return bits.view(row.torch).reshape(shape)


def _bytes(t: torch.Tensor) -> bytes:
    if t.element_size() == 1:  # int4 and its kin have no copy kernel: copy their bytes
        t = t.view(torch.uint8)
    return bytes(t.contiguous().reshape(*t.shape, 1).view(torch.uint8).reshape(-1).numpy())


def _distribute(ref: torch.Tensor, mesh: Any, placements: Any) -> Any:
    """``distribute_tensor(ref, ...)`` for every dtype: torch splits the uint8 bits.

    Every rank holds ``ref``, so torch splits locally (``src_data_rank=None``), which
    also allows uneven ``_StridedShard`` splits that its scatter refuses.
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    bits = ref.reshape(*ref.shape, 1).view(torch.uint8)
    local = distribute_tensor(bits, mesh, placements, src_data_rank=None).to_local()
    local = local.view(ref.dtype).reshape(local.shape[:-1])
    return DTensor.from_local(
        local, mesh, placements, run_check=False, shape=ref.shape, stride=ref.stride()
    )


def _check(ref: torch.Tensor, x: Any, blocks: bool, fallback: bool = False) -> dict[str, Any]:
    """What tensorbridge gives for DTensor ``x`` of reference ``ref``, judged by bytes."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    row = tb.resolve_dtype(ref.dtype)
    want = _bytes(ref)
    got: dict[str, Any] = {}
    a = tb.to_numpy(x, gather=True)
    got["numpy"] = (a.dtype == row.numpy, a.shape == tuple(ref.shape), a.tobytes() == want)
    t = tb.to_torch(x, gather=True)
    got["torch"] = (type(t) is torch.Tensor, t.dtype == ref.dtype, _bytes(t) == want)
    if fallback:
        try:
            got["redistributed"] = _bytes(dtensor.redistributed(x)) == want
        except tb.ShardedTensorError as e:  # torch 2.10 cannot order a lone _StridedShard
            got["redistributed"] = (
                TORCH < (2, 13)
                and "cannot redistribute" in str(e)
                and any(type(p) is _StridedShard for p in x.placements)
            )
    if blocks:
        s = tb.local_shard(x)
        local = x.to_local()
        shape, offset = compute_local_shape_and_global_offset(
            tuple(ref.shape), x.device_mesh, x.placements
        )
        index = tuple(slice(o, o + n) for o, n in zip(s.offset, s.array.shape, strict=True))
        shared = s.array.size == 0 or (
            s.array.__array_interface__["data"][0] == local.data_ptr()
            and np.shares_memory(s.array, tb.to_numpy(local))
        )
        got["local"] = (
            shared,
            s.array.dtype == row.numpy,
            s.array.shape == tuple(shape),
            s.offset == tuple(offset),
            s.global_shape == tuple(ref.shape),
            s.array.tobytes() == _bytes(ref[index]),
        )
    return got


def _cases(
    mesh: Any, shapes_and_placements: list[tuple[tuple[int, ...], tuple[Any, ...], bool]], rank: int
) -> dict[str, Any]:
    """Every dtype of the table through every (shape, placements, one block per rank) case."""
    out: dict[str, Any] = {}
    for k, (shape, placements, blocks) in enumerate(shapes_and_placements):
        for r, row in enumerate(ROWS):
            ref = _reference(row, shape, seed=1000 * k + r)
            x = _distribute(ref, mesh, placements)
            name = f"{row.name} {shape} {placements}"
            out[name] = _check(ref, x, blocks, fallback=r % 5 == 0)
    return out


def _messages(fn: Callable[[], Any]) -> tuple[str, str]:
    try:
        fn()
    except Exception as e:
        return type(e).__name__, str(e)
    return "", "no error"


def _two_ranks(rank: int, world_size: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import DTensor, distribute_tensor

    mesh = init_device_mesh("cpu", (2,))
    out = _cases(
        mesh,
        [
            ((5, 3), (Shard(0),), True),  # uneven
            ((3, 5), (Shard(1),), True),
            ((1, 3), (Shard(0),), True),  # rank 1 holds nothing
            ((2, 3), (Replicate(),), True),
            ((), (Replicate(),), True),  # 0-dim
            ((9,), (_ss(0, 2),), False),  # interleaved pieces
        ],
        rank,
    )
    # a mesh whose coordinate order differs from its process group's rank order
    reversed_mesh = DeviceMesh("cpu", torch.tensor([1, 0]))
    ref = _reference(tb.resolve_dtype("float8_e4m3fn"), (5, 4), seed=7)
    out["reversed mesh"] = _check(ref, _distribute(ref, reversed_mesh, (Shard(0),)), True)

    plain = distribute_tensor(torch.arange(10.0), mesh, [Shard(0)])
    rep = distribute_tensor(torch.arange(4), mesh, [Replicate()])
    out["default to_numpy"] = _messages(lambda: tb.to_numpy(plain))
    out["default to_torch"] = _messages(lambda: tb.to_torch(plain))
    out["default tree"] = _messages(lambda: tb.tree_to_numpy({"w": plain}))
    d = tb.describe(plain)
    out["describe"] = (d.to_numpy.verdict, d.to_numpy.reason, d.to_torch.verdict, d.notes[0])
    out["describe shape"] = (d.shape, d.storage_nbytes, d.storage_offset)
    out["copy=False"] = _messages(lambda: tb.to_numpy(plain, gather=True, copy=False))
    partial = DTensor.from_local(torch.ones(3), mesh, [Partial()])
    out["partial gather"] = _messages(lambda: tb.to_numpy(partial, gather=True))
    out["partial local"] = _messages(lambda: tb.local_shard(partial))
    wrong = DTensor.from_local(
        torch.ones(3), mesh, [Shard(0)], run_check=False, shape=(5,), stride=(1,)
    )  # rank 1 should hold 2 elements, not 3
    out["wrong local shape"] = _messages(lambda: tb.to_numpy(wrong, gather=True))
    strided = distribute_tensor(torch.arange(8.0), mesh, [_ss(0, 2)])
    out["strided local"] = _messages(lambda: tb.local_shard(strided))

    tree = tb.tree_to_numpy({"w": plain, "r": rep, "t": torch.ones(2)}, gather=True)
    out["tree"] = (tree["w"].tolist(), tree["r"].tolist(), tree["t"].tolist())
    back = tb.tree_to_torch({"w": plain, "t": torch.ones(2)}, gather=True)
    out["tree torch"] = (type(back["w"]) is torch.Tensor, back["w"].tolist(), back["t"].tolist())
    cast = tb.to_numpy(plain.to(torch.bfloat16), gather=True, dtype="float32")
    out["cast"] = (str(cast.dtype), cast.tolist())
    out["plan steps"] = repr(tb.describe(plain).to_torch.steps)
    grad = distribute_tensor(torch.arange(4.0, requires_grad=True), mesh, [Shard(0)])
    out["requires grad"] = tb.to_numpy(grad, gather=True).tolist()

    s = tb.local_shard(plain)
    s.array[0] = -1.0  # a zero-copy view: the write reaches the DTensor
    out["write through"] = float(plain.to_local()[0])
    out["primary"] = (tb.local_shard(plain).primary, tb.local_shard(rep).primary)

    # blocks that do not tile are gathered by torch's redistribution, never assembled
    layout = dtensor.layout
    try:
        dtensor.layout = lambda *a: dataclasses.replace(layout(*a), tiles=False)  # type: ignore[assignment]
        ref = _reference(tb.resolve_dtype("float8_e8m0fnu"), (5, 3), seed=3)
        x = _distribute(ref, mesh, (Shard(0),))
        out["forced redistribution"] = tb.to_numpy(x, gather=True).tobytes() == _bytes(ref)
    finally:
        dtensor.layout = layout  # type: ignore[assignment]
    return out


def _model_checks(model: torch.nn.Module, ref: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Every state-dict entry of a sharded model: gathered and local bytes vs ``ref``."""
    out: dict[str, Any] = {}
    for k, v in model.state_dict().items():
        s = tb.local_shard(v)
        index = tuple(slice(o, o + n) for o, n in zip(s.offset, s.array.shape, strict=True))
        out[k] = (
            str(v.placements),
            tb.to_numpy(v, gather=True).tobytes() == _bytes(ref[k]),
            s.array.tobytes() == _bytes(ref[k][index]),
        )
    return out


def _four_ranks(rank: int, world_size: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2))
    out = _cases(
        mesh,
        [
            ((5, 7), (Shard(0), Shard(1)), True),
            ((7, 3), (_ss(0, 2), Shard(0)), True),  # FSDP2 x TP, uneven
            ((6, 5), (Replicate(), Shard(0)), True),
            ((3, 2), (Shard(1), Replicate()), True),
            ((3,), (Shard(0), Shard(0)), True),  # rank 3 holds nothing
            ((9,), (Shard(0), _ss(0, 2)), False),  # interleaved pieces
            ((), (Replicate(), Replicate()), True),
        ],
        rank,
    )
    line = init_device_mesh("cpu", (4,))
    ref = _reference(tb.resolve_dtype("bool"), (2, 3), seed=11)
    out["1-D, empty shards"] = _check(ref, _distribute(ref, line, (Shard(0),)), True)
    shuffled = DeviceMesh("cpu", torch.tensor([[3, 2], [1, 0]]))
    ref = _reference(tb.resolve_dtype("bfloat16"), (7, 5), seed=12)
    out["shuffled mesh"] = _check(ref, _distribute(ref, shuffled, (Shard(1), Shard(0))), True)
    x = _distribute(ref, mesh, (Replicate(), Shard(0)))
    y = _distribute(ref, mesh, (Shard(1), Replicate()))
    out["primary"] = (tb.local_shard(x).primary, tb.local_shard(y).primary)

    # real FSDP2 (uneven, empty shards) and FSDP2 x TP (_StridedShard) state dicts
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 7), torch.nn.Linear(7, 3)).bfloat16()
    ref = {k: v.detach().clone() for k, v in model.state_dict().items()}
    fully_shard(model, mesh=line)
    out["fsdp2"] = _model_checks(model, ref)
    named = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = torch.nn.Sequential(torch.nn.Linear(6, 7), torch.nn.ReLU(), torch.nn.Linear(7, 5))
    ref = {k: v.detach().clone() for k, v in model.state_dict().items()}
    parallelize_module(model, named["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=named["dp"])
    out["fsdp2 x tp"] = _model_checks(model, ref)
    return out


def _assert_all_hold(results: list[dict[str, Any]]) -> None:
    for rank, res in enumerate(results):
        for name, got in res.items():
            if isinstance(got, dict) and not name.startswith("fsdp2"):
                for what, flags in got.items():
                    ok = all(flags) if isinstance(flags, tuple) else flags
                    assert ok, f"rank {rank}: {name}: {what}: {flags}"


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    path: Path = tmp_path_factory.mktemp("dtensor2")
    return run_ranks(_two_ranks, 2, path)


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    path: Path = tmp_path_factory.mktemp("dtensor4")
    return run_ranks(_four_ranks, 4, path)


def test_every_dtype_and_placement_gathers_bit_exact_on_two_ranks(two: list[Any]) -> None:
    _assert_all_hold(two)
    checked = [k for k in two[0] if isinstance(two[0][k], dict)]
    assert len(checked) == 6 * len(ROWS) + 1


@pytest.mark.slow  # four: a second process group, of 4 ranks
def test_every_dtype_and_placement_gathers_bit_exact_on_a_2x2_mesh(four: list[Any]) -> None:
    _assert_all_hold(four)
    assert len([k for k in four[0] if isinstance(four[0][k], dict)]) == 7 * len(ROWS) + 4


@pytest.mark.slow  # four: a second process group, of 4 ranks
def test_fsdp2_and_fsdp2_x_tp_state_dicts_gather_and_split_exactly(four: list[Any]) -> None:
    strided = "(_StridedShard(dim=0, sf=2), Shard(dim=0))"
    for res in four:
        assert res["fsdp2"] == {
            "0.weight": ("(Shard(dim=0),)", True, True),  # 7 rows on 4 ranks
            "0.bias": ("(Shard(dim=0),)", True, True),
            "1.weight": ("(Shard(dim=0),)", True, True),  # 3 rows: rank 3 holds none
            "1.bias": ("(Shard(dim=0),)", True, True),
        }
        assert res["fsdp2 x tp"] == {
            "0.weight": (strided, True, True),
            "0.bias": (strided, True, True),
            "2.weight": ("(Shard(dim=0), Shard(dim=1))", True, True),
            "2.bias": ("(Shard(dim=0), Replicate())", True, True),
        }


def test_default_is_a_refusal_that_names_both_options(two: list[Any]) -> None:
    cls, msg = two[0]["default to_numpy"]

    assert cls == "ShardedTensorError"
    assert msg == (
        "a DTensor (global shape (10,), placements (Shard(dim=0)) on a mesh of shape (2,)) "
        "keeps only this rank's part in its storage; pass tb.local_shard(x) for this rank's "
        "block (zero-copy), or tb.to_numpy(x, gather=True) for the whole array on every rank "
        "(a collective every rank must call)"
    )
    cls, msg = two[0]["default to_torch"]
    assert cls == "ShardedTensorError" and "tb.to_torch(x, gather=True)" in msg
    assert "x.to_local()" in msg
    cls, msg = two[1]["default tree"]
    assert cls == "ShardedTensorError" and msg.startswith("at ['w']: a DTensor")
    verdict, reason, to_torch, note = two[0]["describe"]
    assert (verdict, reason, to_torch) == ("error", two[0]["default to_numpy"][1], "error")
    assert note == (
        "a DTensor (global shape (10,), placements (Shard(dim=0)) on a mesh of shape (2,)): "
        "this rank's storage holds only its local tensor of shape (5,); tb.local_shard(x) "
        "gives that block, gather=True the whole tensor"
    )
    assert two[1]["describe shape"] == ((10,), None, None)  # no storage facts of one rank
    assert issubclass(tb.ShardedTensorError, tb.UnsupportedTensorError)


def test_partial_and_interleaved_blocks_are_refused(two: list[Any]) -> None:
    for key in ("partial gather", "partial local"):
        cls, msg = two[0][key]
        assert cls == "ShardedTensorError"
        assert "placement Partial(sum) on mesh dimension 0" in msg
        assert "holds per-rank partial values that only a reduction can combine" in msg
    cls, msg = two[1]["strided local"]
    assert cls == "ShardedTensorError"
    assert "holds indices [2, 3, 6, 7] of dimension 0, interleaved by the _StridedShard" in msg
    assert "pass gather=True" in msg


def test_a_local_shape_the_placements_do_not_give_is_refused_on_every_rank(
    two: list[Any],
) -> None:
    for res in two:  # rank 0 is right, yet it refuses too: every rank saw rank 1's status
        cls, msg = res["wrong local shape"]
        assert cls == "ShardedTensorError"
        assert msg.startswith(
            "the local tensor at mesh coordinate (1,) (mesh dimensions (0,)) of the DTensor "
            "(global shape (5,), placements (Shard(dim=0)) on a mesh of shape (2,)) does not "
            "have the shape (2,) its placements give"
        )


def test_gather_follows_the_copy_contract(two: list[Any]) -> None:
    cls, msg = two[0]["copy=False"]

    assert cls == "CopyRequiredError"
    assert "the input is a DTensor split across ranks (gathering it makes new memory)" in msg
    assert two[0]["cast"] == ("float32", [float(i) for i in range(10)])
    assert two[1]["plan steps"] == "()"  # describe's to_torch plan is the refusal
    assert two[0]["requires grad"] == two[1]["requires grad"] == [0.0, 1.0, 2.0, 3.0]


def test_tree_gathers_dtensor_leaves_and_keeps_plain_ones(two: list[Any]) -> None:
    for res in two:
        assert res["tree"] == ([float(i) for i in range(10)], [0, 1, 2, 3], [1.0, 1.0])
        assert res["tree torch"] == (True, [float(i) for i in range(10)], [1.0, 1.0])


def test_local_shard_is_a_view_and_primary_marks_one_copy(two: list[Any]) -> None:
    assert two[0]["write through"] == -1.0 and two[1]["write through"] == -1.0
    assert [r["primary"] for r in two] == [(True, True), (True, False)]
    assert two[0]["forced redistribution"] and two[1]["forced redistribution"]


@pytest.mark.slow  # four: a second process group, of 4 ranks
def test_primary_marks_one_copy_on_a_2x2_mesh(four: list[Any]) -> None:
    # (Replicate, Shard(0)): mesh rows replicate; (Shard(1), Replicate): columns do
    assert [r["primary"] for r in four] == [
        (True, True),
        (True, False),
        (False, True),
        (False, False),
    ]
