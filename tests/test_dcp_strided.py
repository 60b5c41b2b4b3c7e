"""FSDP2 x TP (``_StridedShard``) and 2-D mesh state dicts through every DCP writer.

One spawn of 4 gloo ranks on a 2x2 mesh ``dcp.save``s the same state dict three times:
with :class:`tensorbridge.SafetensorsWriter`, :class:`tensorbridge.ZarrWriter` and
DCP's own ``FileSystemWriter``. The parent then reads each result with an independent
reader (the ``safetensors`` library; ``tb.load`` of the Zarr store; ``tb.save`` of the
opened DCP directory, read back by ``safetensors``) and compares bytes with the
unsharded reference, which every process builds from the same seeds.

The writers see only DCP's chunks (offset + size). An interleaved placement gives
chunks that overlap; DCP's default planner refuses those, and both writers refuse
them too (for planners that do not check), tested on hand-made plans.

The tests of the 4-rank spawn are ``slow`` (CI runs them); the hand-made plans run every
day.
"""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex
from torch.distributed.checkpoint.planner import (
    SavePlan,
    TensorProperties,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.tensor import Shard
from torch.distributed.tensor.placement_types import _StridedShard

import tensorbridge as tb
from _dist import run_ranks
from tensorbridge.errors import UnsupportedTensorError

safetensors = pytest.importorskip("safetensors", reason="the safetensors oracle is not installed")
from safetensors import safe_open  # noqa: E402

HAVE_ZARR = importlib.util.find_spec("zarr") is not None
needs_zarr = pytest.mark.skipif(not HAVE_ZARR, reason="the zarr extra is not installed")

STRIDED = (_StridedShard(0, split_factor=2), Shard(0))
GRID = (Shard(0), Shard(1))


def _bits(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).view(dtype).reshape(shape)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 7), torch.nn.ReLU(), torch.nn.Linear(7, 5))


def _extras() -> dict[str, tuple[torch.Tensor, tuple[Any, ...]]]:
    """Tensors beside the model's: name -> (unsharded reference, placements on the 2x2 mesh)."""
    return {
        "grid.f32": (_bits((5, 7), torch.float32, 1), GRID),  # uneven both ways
        "strided.bf16": (_bits((9, 4), torch.bfloat16, 2), STRIDED),
        "grid.bf16": (_bits((6, 3), torch.bfloat16, 3), GRID),
        "strided.e4m3": (_bits((7, 3), torch.float8_e4m3fn, 4), STRIDED),
        "grid.e5m2": (_bits((3, 5), torch.float8_e5m2, 5), GRID),  # rank 3 holds nothing
    }


def reference() -> dict[str, torch.Tensor]:
    ref = {f"model.{k}": v.detach().clone() for k, v in _model().state_dict().items()}
    ref.update({k: t for k, (t, _) in _extras().items()})
    return ref


def _distribute(ref: torch.Tensor, mesh: Any, placements: tuple[Any, ...]) -> Any:
    """torch's own split of ``ref``'s bits (gloo lacks fp8), viewed back as ``ref``'s dtype."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    bits = ref.reshape(*ref.shape, 1).view(torch.uint8)
    local = distribute_tensor(bits, mesh, placements, src_data_rank=None).to_local()
    local = local.view(ref.dtype).reshape(local.shape[:-1])
    return DTensor.from_local(
        local, mesh, placements, run_check=False, shape=ref.shape, stride=ref.stride()
    )


def _save_all(rank: int, world: int, out: str) -> dict[str, str]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = _model()
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    sd: dict[str, Any] = {f"model.{k}": v for k, v in model.state_dict().items()}
    sd.update({k: _distribute(t, mesh, p) for k, (t, p) in _extras().items()})
    placements = {k: str(v.placements) for k, v in sd.items()}
    dcp.save(sd, storage_writer=tb.SafetensorsWriter(f"{out}/st"))
    if HAVE_ZARR:
        dcp.save(sd, storage_writer=tb.ZarrWriter(f"{out}/m.zarr"))
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(f"{out}/dcp"))
    return placements


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, str]]]:
    out: Path = tmp_path_factory.mktemp("strided")
    return out, run_ranks(_save_all, 4, out, str(out))


def _raw(t: Any) -> bytes:
    t = torch.as_tensor(t) if not isinstance(t, torch.Tensor) else t
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy())


def _safetensors_dir(path: Path) -> dict[str, torch.Tensor]:
    got: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not iterable
                got[name] = f.get_tensor(name)
    return got


def _assert_exact(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(ref)
    for name, want in ref.items():
        t = got[name]
        assert (t.dtype, tuple(t.shape)) == (want.dtype, tuple(want.shape)), name
        assert _raw(t) == _raw(want), name


@pytest.mark.slow  # saved: a process group of 4 ranks
def test_the_ranks_held_strided_and_2d_mesh_shards(saved: tuple[Path, list[Any]]) -> None:
    strided = "(_StridedShard(dim=0, sf=2), Shard(dim=0))"
    grid = "(Shard(dim=0), Shard(dim=1))"
    for placements in saved[1]:
        assert placements["model.0.weight"] == strided  # FSDP2 over TP's Colwise rows
        assert placements["model.0.bias"] == strided
        assert placements["model.2.weight"] == grid  # FSDP2 rows x TP's Rowwise columns
        assert placements["strided.e4m3"] == strided and placements["grid.e5m2"] == grid


@pytest.mark.slow  # saved: a process group of 4 ranks
def test_safetensors_writer_is_byte_exact(saved: tuple[Path, list[Any]]) -> None:
    _assert_exact(_safetensors_dir(saved[0] / "st"), reference())


@pytest.mark.slow  # saved: a process group of 4 ranks
@needs_zarr
def test_zarr_writer_is_byte_exact(saved: tuple[Path, list[Any]]) -> None:
    got = tb.load(saved[0] / "m.zarr", framework="torch")
    _assert_exact(got, reference())


@pytest.mark.slow  # saved: a process group of 4 ranks
def test_default_dcp_directory_converts_byte_exact(
    saved: tuple[Path, list[Any]], tmp_path: Path
) -> None:
    tb.save(tb.open(saved[0] / "dcp"), f"{tmp_path}/out/")
    _assert_exact(_safetensors_dir(tmp_path / "out"), reference())


# --- overlapping chunks, as an interleaved placement gives them -----------------------------


def _plan(rank_chunks: list[tuple[int, int]]) -> list[SavePlan]:
    """One plan per rank, each with one chunk (offset, size) of an 8-element float tensor."""
    props = TensorProperties(dtype=torch.float32)
    return [
        SavePlan(
            [
                WriteItem(
                    index=MetadataIndex("w", torch.Size([o])),
                    type=WriteItemType.SHARD,
                    tensor_data=TensorWriteData(
                        chunk=ChunkStorageMetadata(torch.Size([o]), torch.Size([n])),
                        properties=props,
                        size=torch.Size([8]),
                    ),
                )
            ]
        )
        for o, n in rank_chunks
    ]


# (Shard(0), _StridedShard(0, sf=2)) of 8 elements on 2x2: ranks hold [0, 2], [1, 3],
# [4, 6], [5, 7]; DCP describes each by its first index: blocks [0, 2), [1, 3), ...
INTERLEAVED = [(0, 2), (1, 2), (4, 2), (5, 2)]


@pytest.mark.parametrize("writer", ["safetensors", pytest.param("zarr", marks=needs_zarr)])
def test_overlapping_chunks_are_refused_before_anything_is_written(
    writer: str, tmp_path: Path
) -> None:
    out = tmp_path / "ckpt"
    w = tb.SafetensorsWriter(out) if writer == "safetensors" else tb.ZarrWriter(out)
    w.set_up_storage_writer(True)
    plans = [w.prepare_local_plan(p) for p in _plan(INTERLEAVED)]
    with pytest.raises(UnsupportedTensorError) as e:
        w.prepare_global_plan(plans)
    assert str(e.value) == (
        "tensor 'w': the ranks' chunks at offsets (0,) and (1,) overlap, so they do not "
        "tile it (an interleaved _StridedShard placement); redistribute the tensor to "
        "Shard/Replicate placements before saving"
    )
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize(
    ("shape", "boxes", "message"),
    [
        ((5, 7), [((0, 0), (3, 4)), ((0, 4), (3, 3)), ((3, 0), (2, 4)), ((3, 4), (2, 3))], ""),
        ((3,), [((0,), (2,)), ((2,), (1,)), ((3,), (0,)), ((3,), (0,))], ""),  # empty shards
        ((), [((), ())], ""),
        ((), [((), ()), ((), ())], "chunks at offsets () and () overlap"),
        ((4, 4), [((0, 0), (4, 2)), ((1, 1), (2, 2))], "offsets (0, 0) and (1, 1) overlap"),
        ((4,), [((0,), (2,)), ((3,), (1,))], "hold 3 of its 4 elements"),
        ((4,), [((0,), (2,)), ((3,), (2,))], "offsets (3,) of sizes (2,) lies outside"),
    ],
)
def test_check_tiles_accepts_exact_tilings_only(
    shape: tuple[int, ...], boxes: list[Any], message: str
) -> None:
    from tensorbridge.dcp import _tiling as tiling

    if not message:  # an exact tiling: accepted, nothing returned
        assert tiling.check_tiles("w", shape, boxes) is None
        return
    with pytest.raises(UnsupportedTensorError, match=re.escape(message)):
        tiling.check_tiles("w", shape, boxes)


def test_tiling_module_doctests() -> None:
    import doctest

    from tensorbridge.dcp import _tiling as tiling

    failures, tried = doctest.testmod(tiling)
    assert (failures, tried) == (0, 2)
