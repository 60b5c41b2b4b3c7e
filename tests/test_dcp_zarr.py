"""``tb.ZarrWriter`` / ``tb.ZarrReader`` on spawned gloo ranks, judged byte for byte.

Every dtype of the table is saved as DTensors sharded ``Shard(0)`` (uneven), ``Shard(1)``
(uneven, with an empty shard on 4 ranks) and ``Replicate``, next to a 0-dim tensor with
a NaN payload and a plain ``step``. The store must hold exactly the unsharded reference;
it is then loaded into another sharding (2 ranks -> 4) and into one process; a rank
killed mid-save must leave no store that looks complete.

The ranks save each world size's store once for the module (the ``stores`` fixture); the
everyday run starts one process group, of 2 ranks, and the tests that start more (4 ranks,
a killed rank, the memory bound) are ``slow``.
"""

from __future__ import annotations

import os
import shutil
import signal
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tensorbridge as tb
from _dist import run_ranks
from conftest import ROWS as TABLE_ROWS
from conftest import make_patterns

zarr = pytest.importorskip("zarr", reason="zarr is an extra: pip install tensorbridge[zarr]")

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Replicate, Shard  # noqa: E402

import tensorbridge.zarr_dtypes  # noqa: E402 - zarr 3.1 reads bfloat16 after this import
from tensorbridge.errors import UncommittedCheckpointError  # noqa: E402

ROWS, COLS = 13, 10  # uneven on 2 and 4 ranks; 10 columns on 4 ranks leave one empty
PLACEMENTS = {"s0": Shard(0), "s1": Shard(1), "rep": Replicate()}
OTHER = {"s0": Shard(1), "s1": Shard(0), "rep": Shard(0)}  # the sharding a reload asks for


def reference() -> dict[str, Any]:
    """The unsharded state dict: every dtype DCP plans, its bit patterns under each placement
    (torch's sub-byte integers DCP's planner cannot size: see the refusal's test)."""
    sd: dict[str, Any] = {}
    for row in (r for r in TABLE_ROWS if r.kernels):
        a = np.resize(make_patterns(row), ROWS * COLS).reshape(ROWS, COLS)
        for tag in PLACEMENTS:
            sd[f"{row.name}.{tag}"] = tb.to_torch(a.copy())
    sd["scalar"] = torch.tensor([0x7FC1], dtype=torch.int16).view(torch.bfloat16)[0]
    sd["step"] = 7
    return sd


def bits(t: torch.Tensor) -> bytes:
    return bytes(tb.to_numpy(t.detach().contiguous().reshape(-1)).view(np.uint8).tobytes())


def local_block(full: torch.Tensor, placement: Any, rank: int, world: int) -> torch.Tensor:
    """This rank's block, as DTensor's Shard splits (torch.chunk, empty shards padded)."""
    if isinstance(placement, Replicate):
        return full
    d = placement.dim
    pieces = list(torch.chunk(full, world, dim=d))
    while len(pieces) < world:
        shape = list(full.shape)
        shape[d] = 0
        pieces.append(full.new_empty(shape))
    return pieces[rank]


def sharded(
    sd: dict[str, Any], rank: int, world: int, layout: dict[str, Any], zero: bool
) -> dict[str, Any]:
    """``sd`` as DTensors on a 1-D mesh (``zero``: empty targets for a load)."""
    mesh = init_device_mesh("cpu", (world,))
    out: dict[str, Any] = {}
    for name, value in sd.items():
        tag = name.rsplit(".", 1)[-1]
        if not isinstance(value, torch.Tensor):
            out[name] = 0 if zero else value
            continue
        if tag not in layout:
            out[name] = torch.zeros_like(value) if zero else value
            continue
        placement = layout[tag]
        local = local_block(value, placement, rank, world).contiguous()
        if zero:
            local = torch.zeros_like(local)
        out[name] = DTensor.from_local(
            local, mesh, [placement], run_check=False, shape=value.shape, stride=value.stride()
        )
    return out


def _save(rank: int, world: int, path: str) -> str:
    dcp.save(
        sharded(reference(), rank, world, PLACEMENTS, zero=False),
        storage_writer=tb.ZarrWriter(path),
    )
    return "saved"


def _load(rank: int, world: int, path: str) -> dict[str, bool]:
    ref = reference()
    sd = sharded(ref, rank, world, OTHER, zero=True)
    dcp.load(sd, storage_reader=tb.ZarrReader(path))
    got: dict[str, bool] = {}
    for name, value in sd.items():
        tag = name.rsplit(".", 1)[-1]
        if isinstance(value, DTensor):
            want = local_block(ref[name], OTHER[tag], rank, world)
            got[name] = bits(value.to_local()) == bits(want) and value.dtype is ref[name].dtype
        elif isinstance(value, torch.Tensor):
            got[name] = bits(value) == bits(ref[name])
        else:
            got[name] = value == ref[name]
    return got


class _DiesMidSave(tb.ZarrWriter):
    """Rank 1 writes its chunks, then is SIGKILLed before reporting success."""

    def write_data(self, plan: Any, planner: Any) -> Any:
        fut = super().write_data(plan, planner)
        if int(os.environ["RANK"]) == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return fut


def _killed(rank: int, world: int, path: str) -> str:
    sd = sharded(reference(), rank, world, PLACEMENTS, zero=False)
    dcp.save(sd, storage_writer=_DiesMidSave(path))
    return "finished"  # never: rank 1 dies, and rank 0 waits for it in vain


def check_store(path: Path) -> None:
    """The committed store holds exactly the unsharded reference, bit for bit."""
    ref = reference()
    with tb.open(path) as f:
        tensors = [k for k, v in ref.items() if isinstance(v, torch.Tensor)]
        assert f.keys() == tensors
        assert f.plain_values() == {"step": 7}
        for name in tensors:
            a = f[name]
            assert a.shape == tuple(ref[name].shape) and bits(tb.to_torch(a)) == bits(ref[name]), (
                name
            )
            assert f.info(name)[0].torch is ref[name].dtype


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], Path]:
    """The store ``world`` ranks saved: one process group per world size for the module."""
    made: dict[int, Path] = {}

    def store(world: int) -> Path:
        if world not in made:
            base = tmp_path_factory.mktemp(f"ranks{world}")
            path = base / "ckpt.zarr"
            assert run_ranks(_save, world, base, str(path)) == ["saved"] * world
            made[world] = path
        return made[world]

    return store


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_ranks_write_the_unsharded_bytes(world: int, stores: Callable[[int], Path]) -> None:
    path = stores(world)
    check_store(path)
    assert [p.name for p in path.iterdir() if p.name.startswith(".")] == []  # no staging left
    # the chunk grid tiles every rank's block: Shard(1) of 10 columns on 4 ranks (3, 3, 3, 1)
    chunks = zarr.open_array(str(path / "bfloat16.s1")).chunks
    assert chunks == ((ROWS, 1) if world == 4 else (ROWS, 5))
    assert zarr.open_array(str(path / "float32.s0")).chunks == (1, COLS)  # 7+6 or 4+4+4+1 rows


@pytest.mark.slow  # a second process group, of 4 ranks
def test_a_store_reloads_into_another_sharding(
    stores: Callable[[int], Path], tmp_path: Path
) -> None:
    results = run_ranks(_load, 4, tmp_path, str(stores(2)))
    for rank, got in enumerate(results):
        assert got and all(got.values()), (rank, [k for k, ok in got.items() if not ok])


def test_a_store_reloads_into_one_process(stores: Callable[[int], Path]) -> None:
    path = stores(2)
    ref = reference()
    sd = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0 for k, v in ref.items()}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(sd, storage_reader=tb.ZarrReader(path), no_dist=True)
    for name, value in ref.items():
        if isinstance(value, torch.Tensor):
            assert bits(sd[name]) == bits(value), name
        else:
            assert sd[name] == value


def test_one_process_save_matches_tb_save(tmp_path: Path) -> None:
    ref = reference()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(ref, storage_writer=tb.ZarrWriter(tmp_path / "one.zarr"), no_dist=True)
    check_store(tmp_path / "one.zarr")


@pytest.mark.slow  # two process groups, a rank of each killed
def test_a_rank_killed_mid_save_leaves_no_committed_store(
    stores: Callable[[int], Path], tmp_path: Path
) -> None:
    fresh = tmp_path / "fresh.zarr"
    with pytest.raises(pytest.fail.Exception):
        run_ranks(_killed, 2, tmp_path, str(fresh))
    assert not (fresh / "zarr.json").exists()
    with pytest.raises(UncommittedCheckpointError, match=r"died before its commit"):
        tb.open(fresh)
    with (
        warnings.catch_warnings(),
        pytest.raises(CheckpointException, match=r"died before writing zarr.json"),
    ):  # DCP wraps the reader's UncommittedCheckpointError
        warnings.simplefilter("ignore", UserWarning)
        dcp.load({"step": 0}, storage_reader=tb.ZarrReader(fresh), no_dist=True)
    # over a committed store, the killed save leaves the previous checkpoint whole
    kept = tmp_path / "kept.zarr"
    shutil.copytree(stores(2), kept)  # the store 2 ranks saved
    with pytest.raises(pytest.fail.Exception):
        run_ranks(_killed, 2, tmp_path, str(kept))
    check_store(kept)


def test_non_json_entries_are_refused(tmp_path: Path) -> None:
    with warnings.catch_warnings(), pytest.raises(CheckpointException, match=r"never pickles"):
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(
            {"w": torch.ones(2), "rng": object()},
            storage_writer=tb.ZarrWriter(tmp_path / "x.zarr"),
            no_dist=True,
        )
    assert not (tmp_path / "x.zarr" / "zarr.json").exists()


@pytest.mark.parametrize("name", ["int1", "int2", "int4", "uint1", "uint2", "uint4"])
def test_sub_byte_integers_are_refused_naming_a_format_that_keeps_them(
    tmp_path: Path, name: str
) -> None:
    """DCP's own planner fails on them ("torch.iinfo() requires an integer input type");
    the writer refuses first, on every rank, naming the tensor and .npy/.npz."""
    if not hasattr(torch, name) or tb.resolve_dtype(name).kernels:
        pytest.skip(reason=f"torch.{name} is no row of this installation")
    t = torch.arange(16, dtype=torch.uint8).view(getattr(torch, name))
    with warnings.catch_warnings(), pytest.raises(CheckpointException) as info:
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"q": t}, storage_writer=tb.ZarrWriter(tmp_path / "x.zarr"), no_dist=True)
    (error, _), *_ = info.value.failures.values()
    assert isinstance(error, tb.UnsupportedDtypeError)
    assert str(error) == (
        f"tensor 'q' is torch.{name}, which torch.distributed.checkpoint cannot plan (its "
        "planner sizes items with torch.iinfo, which refuses sub-byte integers); save it to "
        f".npy or .npz, which keep {name} as it is"
    )
    assert not (tmp_path / "x.zarr").exists()


def test_a_shell_dtype_is_refused_naming_its_bytes(tmp_path: Path) -> None:
    """torch.int3 has no row; the refusal names the view of its bytes. Packed float4 is one
    byte to DCP's planner, so it is not refused here."""
    t = torch.arange(4, dtype=torch.uint8).view(torch.int3)
    with warnings.catch_warnings(), pytest.raises(CheckpointException) as info:
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"q": t}, storage_writer=tb.ZarrWriter(tmp_path / "x.zarr"), no_dist=True)
    (error, _), *_ = info.value.failures.values()
    assert isinstance(error, tb.UnsupportedDtypeError)
    assert str(error).endswith("save x.view(torch.int8), its bytes as torch holds them")


def _peak_growth(rank: int, world: int, path: str, rows: int, buffer: int) -> dict[str, int]:
    """Save a ``rows x 8192`` bf16 Shard(0) tensor; the RSS this rank grew by while saving."""
    mesh = init_device_mesh("cpu", (world,))
    local = torch.full((rows // world, 8192), rank + 1.0, dtype=torch.bfloat16)
    w = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = _status("VmRSS")
    dcp.save({"w": w}, storage_writer=tb.ZarrWriter(path, buffer_bytes=buffer))
    return {"growth": _status("VmHWM") - before, "shard": local.nbytes}


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith(key + ":"))


@pytest.mark.slow  # a process group saving 128 MiB
@pytest.mark.skipif(
    not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux /proc/self/clear_refs"
)
def test_a_rank_holds_its_shard_plus_a_fixed_buffer(tmp_path: Path) -> None:
    buffer = 16 << 20
    results = run_ranks(_peak_growth, 2, tmp_path, str(tmp_path / "m.zarr"), 8192, buffer)
    for r in results:  # a 64 MiB shard each: growth bounded by the buffer, not the shard
        assert r["shard"] == 64 << 20
        assert r["growth"] < buffer + (24 << 20), r
    z = zarr.open_array(str(tmp_path / "m.zarr" / "w"))
    assert z.chunks == (1024, 8192)  # 16 MiB chunks, aligned to the 4096-row shards
    assert z[4095, 0] == 1 and z[4096, 0] == 2


def test_docstring_example_runs() -> None:
    import doctest

    from tensorbridge.dcp import zarr as dcp_zarr

    with warnings.catch_warnings():  # DCP's "assuming ... a single process"
        warnings.simplefilter("ignore", UserWarning)
        failures, tried = doctest.testmod(dcp_zarr)
    assert tried > 0 and failures == 0
