"""dcp.save with tb.SafetensorsWriter on spawned gloo ranks: the final HF checkpoint, byte for byte.

Each spawn runs many cases at once (every dtype, every placement, objects), and the
parent judges the files the ranks left: read with the ``safetensors`` library itself
(and ``transformers`` for a tiny GPT-2), compared as bytes with the unsharded
reference. Reloads into other shardings run on ranks too, each rank comparing its
own slices with the reference it rebuilt from the same seed.

The everyday run starts one process group, the 2 ranks of ``saved_2``; the tests that
start more (4 ranks, reloads on ranks, a killed rank) are ``slow``.
"""

from __future__ import annotations

import gc
import inspect
import json
import os
import signal
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

import tensorbridge as tb
from _dist import run_ranks

safetensors = pytest.importorskip("safetensors", reason="the safetensors library is the oracle")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

# name -> (dtype, shape, placements on a 1-D mesh); every dtype with a safetensors code
CASES: dict[str, tuple[torch.dtype, tuple[int, ...], str]] = {
    "model.emb.weight": (torch.float32, (10, 6), "S0"),  # uneven rows: 3,3,3,1 on 4 ranks
    "model.tiny": (torch.bfloat16, (3, 5), "S0"),  # an empty shard on 4 ranks
    "model.col": (torch.bfloat16, (7, 8), "S1"),
    "model.col_int": (torch.int32, (5, 9), "S1"),
    "model.rep": (torch.float16, (4, 4), "R"),
    "model.scalar": (torch.float32, (), "R"),  # torch's consolidation writes 0.0
    "model.flag": (torch.bool, (6,), "S0"),
    "i8": (torch.int8, (4, 3), "S1"),
    "u8": (torch.uint8, (5,), "S0"),
    "i16": (torch.int16, (2, 5), "S1"),
    "u16": (torch.uint16, (6, 2), "S0"),
    "i64": (torch.int64, (8, 3), "S0"),  # torch's consolidation crashes on ints
    "u32": (torch.uint32, (3,), "R"),
    "u64": (torch.uint64, (4, 2), "S1"),
    "f64.cube": (torch.float64, (2, 3, 4), "S2"),
    "f8e4m3": (torch.float8_e4m3fn, (4, 8), "S1"),
    "f8e5m2": (torch.float8_e5m2, (6, 2), "S0"),
    "f8e4m3fnuz": (torch.float8_e4m3fnuz, (3, 3), "S1"),
    "f8e5m2fnuz": (torch.float8_e5m2fnuz, (5,), "S0"),
    "scales.e8m0": (torch.float8_e8m0fnu, (4, 4), "S0"),
    "c64": (torch.complex64, (3, 4), "S1"),
    "f4.packed": (torch.float4_e2m1fn_x2, (4, 2), "S0"),  # two values a byte
    "empty": (torch.float32, (0, 4), "R"),
    "int_scalar": (torch.int64, (), "R"),
}
OBJECTS = {"step": 7, "lr": 0.001, "name": "gpt", "betas": [0.9, 0.95], "flag": None}
SKIPPED = {"ids": {1, 2}}  # a set: no JSON for it, and never pickled


def _full(name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """The reference tensor: random bits, the same on every rank (seeded by the name)."""
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    n = int(torch.tensor(shape).prod()) if shape else 1
    width = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * width,), dtype=torch.uint8, generator=g)
    if dtype is torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def _placements(code: str, mesh_ndim: int) -> list[Any]:
    one: Any = Replicate() if code == "R" else Shard(int(code[1:]))
    if mesh_ndim == 1:
        return [one]
    if code in ("R", "S1"):  # replicated across the first mesh dim (HSDP): written once
        return [Replicate(), one]
    return [Shard(0), one]  # a 2-D block, or dim 0 split twice


def _dtensor(full: torch.Tensor, mesh: Any, placements: list[Any]) -> DTensor:
    # built from the local slice alone: no collective (gloo cannot move fp8)
    shape, offset = compute_local_shape_and_global_offset(full.shape, mesh, placements)
    box = tuple(slice(o, o + s) for o, s in zip(offset, shape, strict=True))
    local = full[box].clone() if full.ndim else full.clone()
    return DTensor.from_local(
        local, mesh, placements, run_check=False, shape=full.shape, stride=full.stride()
    )


def _state_dict(mesh: Any, zeros: bool = False, flip: bool = False) -> dict[str, Any]:
    sd: dict[str, Any] = {}
    for name, (dtype, shape, code) in CASES.items():
        full = _full(name, dtype, shape)
        if zeros:
            full = torch.zeros(shape, dtype=torch.uint8 if dtype.itemsize == 1 else dtype)
            full = full.view(dtype)
        if flip and code.startswith("S") and len(shape) > 1:  # reload along another dim
            code = "S1" if code == "S0" else "S0"
        sd[name] = _dtensor(full, mesh, _placements(code, mesh.ndim))
    sd["plain"] = torch.arange(12, dtype=torch.float32).reshape(3, 4)  # a plain tensor, replicated
    return sd


def _save(rank: int, world: int, out: str, meshes: list[tuple[int, ...]], shard: Any) -> int:
    """Save the cases on each mesh (``out/<mesh>``), and on 2 ranks the extra checkpoints."""
    for mesh_shape in meshes:
        mesh = init_device_mesh("cpu", mesh_shape)
        sd = _state_dict(mesh)
        sd.update(OBJECTS)
        sd.update(SKIPPED)
        ckpt = Path(out) / _mesh_name(mesh_shape)
        dcp.save(sd, storage_writer=tb.SafetensorsWriter(ckpt, max_shard_size=shard))
    if world == 2:
        mesh = init_device_mesh("cpu", (2,))
        plain = {k: v for k, v in _state_dict(mesh).items() if _code(v) not in KNOWN}
        dcp.save(plain, storage_writer=tb.SafetensorsWriter(Path(out) / "plain"))
        _save_gpt2(mesh, Path(out) / "gpt2")
    return rank


def _mesh_name(mesh_shape: tuple[int, ...]) -> str:
    return "mesh-" + "x".join(map(str, mesh_shape))


def _code(t: torch.Tensor) -> str:
    if t.dtype == torch.float4_e2m1fn_x2:
        return "F4"
    return tb.resolve_dtype(t.dtype).safetensors or ""


def _gpt2() -> Any:
    transformers = pytest.importorskip("transformers", reason="transformers reads the result")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=96, n_positions=16, n_embd=32, n_layer=2, n_head=2, tie_word_embeddings=True
    )
    return transformers.GPT2LMHeadModel(config)


def _save_gpt2(mesh: Any, ckpt: Path) -> None:
    """FSDP-style: every parameter and buffer Shard(0) over the ranks (uneven, 96 / 2 ...)."""
    try:
        model = _gpt2()
    except pytest.skip.Exception:
        return
    sd = {
        k: _dtensor(v, mesh, [Shard(0)] if v.ndim else [Replicate()])
        for k, v in model.state_dict().items()
    }
    dcp.save(sd, storage_writer=tb.SafetensorsWriter(ckpt, max_shard_size="40KB"))
    if dist.get_rank() == 0:
        model.config.save_pretrained(ckpt)


def _reload(rank: int, world: int, ckpts: list[str], mesh_shape: tuple[int, ...]) -> dict[str, Any]:
    """Load each checkpoint into another sharding; report what differs from the reference."""
    mesh = init_device_mesh("cpu", mesh_shape)
    ref = _state_dict(mesh, flip=True)
    wrong, objects = [], []
    for ckpt in ckpts:
        sd = _state_dict(mesh, zeros=True, flip=True)
        sd.update(dict.fromkeys(OBJECTS, 0))
        dcp.load(sd, storage_reader=tb.SafetensorsReader(ckpt))
        for name, value in sd.items():
            if name in OBJECTS:
                continue
            got, want = value, ref[name]
            if isinstance(got, DTensor):
                got, want = got.to_local(), want.to_local()
            if not torch.equal(_bits(got), _bits(want)):
                wrong.append((ckpt, name))
        objects.append({k: sd[k] for k in OBJECTS})
    return {"wrong": wrong, "objects": objects}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _reference() -> dict[str, torch.Tensor]:
    ref = {name: _full(name, dtype, shape) for name, (dtype, shape, _) in CASES.items()}
    ref["plain"] = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    return ref


KNOWN = {"F8_E8M0", "F4"}  # codes safetensors 0.8's torch reader lacks; tensorbridge reads them


def _check_checkpoint(ckpt: Path) -> dict[str, str]:
    """Every tensor, read by the safetensors library, equals the reference bit for bit."""
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    ref = _reference()
    assert set(index["weight_map"]) == set(ref)
    files = sorted(set(index["weight_map"].values()))
    assert files == [
        f"model-{i:05d}-of-{len(files):05d}.safetensors" for i in range(1, len(files) + 1)
    ]
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in ref.values())
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(
        [*files, "model.safetensors.index.json"]
    )
    mine = tb.open(ckpt)
    metas = []
    for file in files:
        raw = (ckpt / file).read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        assert n % 8 == 0
        header = json.loads(raw[8 : 8 + n])
        assert header["__metadata__"]["format"] == "pt"
        with safe_open(ckpt / file, framework="pt") as f:
            metas.append(f.metadata())
            for name in f.keys():  # noqa: SIM118 - safe_open is not iterable
                assert index["weight_map"][name] == file
                if header[name]["dtype"] in KNOWN:
                    got = mine.get(name, framework="torch")
                else:
                    got = f.get_tensor(name)
                assert got.dtype == ref[name].dtype and got.shape == ref[name].shape, name
                assert torch.equal(_bits(got), _bits(ref[name])), name
    assert all(m == metas[0] for m in metas)
    return metas[0]


@pytest.fixture(scope="module")
def saved_2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Checkpoints written by 2 ranks: every case in one file, plain dtypes, a GPT-2."""
    out = tmp_path_factory.mktemp("two")
    run_ranks(_save, 2, out, str(out), [(2,)], None)
    return out


@pytest.fixture(scope="module")
def saved_4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every case by 4 ranks, on a 1-D and a 2x2 mesh, in many small files."""
    out = tmp_path_factory.mktemp("four")
    run_ranks(_save, 4, out, str(out), [(4,), (2, 2)], 200)
    return out


def test_two_ranks_write_one_file_that_safetensors_reads_bit_for_bit(saved_2: Path) -> None:
    meta = _check_checkpoint(saved_2 / "mesh-2")

    assert json.loads(meta["step"]) == 7 and json.loads(meta["betas"]) == [0.9, 0.95]
    assert meta["name"] == '"gpt"' and meta["flag"] == "null"
    assert json.loads(meta["tensorbridge.objects"]) == sorted(OBJECTS)
    assert "a set is not a simple value" in json.loads(meta["tensorbridge.skipped"])["ids"]
    assert "ids" not in meta  # never pickled


@pytest.mark.slow  # saved_4: a process group of 4 ranks
@pytest.mark.parametrize("mesh", ["mesh-4", "mesh-2x2"])
def test_four_ranks_write_many_files(saved_4: Path, mesh: str) -> None:
    meta = _check_checkpoint(saved_4 / mesh)

    assert len(list((saved_4 / mesh).glob("*.safetensors"))) > 5
    assert json.loads(meta["lr"]) == 0.001


def test_without_objects_the_file_is_the_official_writers_byte_for_byte(saved_2: Path) -> None:
    ref = {k: v for k, v in _reference().items() if _code(v) not in KNOWN}
    official = saved_2 / "official.safetensors"
    save_file(ref, official, metadata={"format": "pt"})

    ours = saved_2 / "plain" / "model-00001-of-00001.safetensors"
    assert ours.read_bytes() == official.read_bytes()


def test_what_torchs_hf_writer_gets_wrong_is_right_here(saved_2: Path) -> None:
    ckpt = saved_2 / "mesh-2"
    ref = _reference()
    with safe_open(ckpt / "model-00001-of-00001.safetensors", framework="pt") as f:
        # torch's consolidation writes a 0-dim tensor as 0.0 (`if not tensor_shape: return`)
        assert f.get_tensor("model.scalar").shape == ()
        assert torch.equal(_bits(f.get_tensor("model.scalar")), _bits(ref["model.scalar"]))
        assert f.get_tensor("int_scalar").item() == ref["int_scalar"].item()
        # int and bool tensors crash its consolidation (torch.finfo on an int, #192485)
        for name in ("i64", "model.flag", "u16", "model.col_int"):
            assert torch.equal(f.get_tensor(name), ref[name]), name
        # save_distributed=False: both ranks write one file name, one rank's half survives
        assert torch.equal(f.get_tensor("model.emb.weight"), ref["model.emb.weight"])
        # its files have no __metadata__, which older transformers crash on
        assert f.metadata()["format"] == "pt"


@pytest.mark.slow  # transformers imported and a GPT-2 loaded
def test_transformers_loads_a_gpt2_saved_by_two_fsdp_ranks(saved_2: Path) -> None:
    reference = _gpt2()
    transformers = pytest.importorskip("transformers")
    ckpt = saved_2 / "gpt2"
    assert len(json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]) > 10

    loaded = transformers.GPT2LMHeadModel.from_pretrained(ckpt)

    want = reference.state_dict()
    got = loaded.state_dict()
    assert set(got) == set(want)
    for name, value in want.items():
        assert torch.equal(got[name], value), name
    assert len(list(ckpt.glob("model-*.safetensors"))) > 1


@pytest.mark.slow  # a second process group, of 4 ranks
def test_two_to_four_ranks(saved_2: Path, tmp_path: Path) -> None:
    ckpt = saved_2 / "mesh-2"

    results = run_ranks(_reload, 4, tmp_path, [str(ckpt)], (4,))

    for r in results:
        assert r["wrong"] == [] and r["objects"] == [OBJECTS]


def test_two_ranks_back_to_one_process(saved_2: Path) -> None:
    ckpt = saved_2 / "mesh-2"

    sd = {name: torch.zeros_like(t) for name, t in _reference().items()}
    sd.update(dict.fromkeys(OBJECTS, 0))
    dcp.load(sd, storage_reader=tb.SafetensorsReader(ckpt))  # no process group

    for name, t in _reference().items():
        assert torch.equal(_bits(sd[name]), _bits(t)), name
    assert {k: sd[k] for k in OBJECTS} == OBJECTS


@pytest.mark.slow  # saved_4 (4 ranks), then a process group of 2
def test_four_ranks_to_two_in_other_shardings(saved_4: Path, tmp_path: Path) -> None:
    ckpts = [str(saved_4 / "mesh-2x2"), str(saved_4 / "mesh-4")]

    results = run_ranks(_reload, 2, tmp_path, ckpts, (2,))

    for r in results:
        assert r["wrong"] == [] and r["objects"] == [OBJECTS, OBJECTS]


class _DiesOnRank1(tb.SafetensorsWriter):
    """Writes rank 1's bytes, then SIGKILLs rank 1 before it can report them."""

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Any:
        fut = super().write_data(plan, planner)
        if dist.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return fut


def _save_and_die(rank: int, world: int, ckpt: str, report: str) -> str:
    mesh = init_device_mesh("cpu", (world,))
    try:
        dcp.save(_state_dict(mesh), storage_writer=_DiesOnRank1(ckpt))
        outcome = "committed"
    except (Exception, CheckpointException) as e:  # rank 0: gathering the results fails
        outcome = type(e).__name__
    Path(report).write_text(outcome)
    return outcome


@pytest.mark.slow  # a process group, one rank killed
def test_a_rank_killed_mid_save_leaves_no_committed_checkpoint(tmp_path: Path) -> None:
    ckpt, report = tmp_path / "ckpt", tmp_path / "rank0.txt"

    with pytest.raises(pytest.fail.Exception, match="rank 1 of 2 wrote no result"):
        run_ranks(_save_and_die, 2, tmp_path, str(ckpt), str(report))

    assert report.read_text() != "committed"
    assert not (ckpt / "model.safetensors.index.json").exists()
    assert not list(ckpt.glob("*.safetensors"))
    # the staging directory, and the killed coordinator's claim on it (_locks.py)
    left = sorted(p.name.split("-")[1] for p in ckpt.iterdir())
    assert left in (["tmp"], ["save", "tmp"])
    with pytest.raises(tb.UncommittedCheckpointError, match="died before writing"):
        tb.SafetensorsReader(ckpt).read_metadata()
    # torch 2.10's dcp.load drops read_metadata's error and says "metadata is None"
    reported = "global_metadata_exc" in inspect.getsource(dcp.state_dict_loader)
    message = "holds no committed safetensors checkpoint" if reported else "metadata is None"
    with pytest.raises(CheckpointException, match=message):
        dcp.load(
            {"u8": torch.zeros(5, dtype=torch.uint8)}, storage_reader=tb.SafetensorsReader(ckpt)
        )


# --- one process, no process group ----------------------------------------------------------


class _FailsToWrite(tb.SafetensorsWriter):
    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Any:
        super().write_data(plan, planner)
        raise OSError(28, "No space left on device")


def test_a_failed_save_leaves_the_previous_checkpoint_whole(tmp_path: Path) -> None:
    old = {"w": torch.arange(4.0), "b": torch.ones(2, dtype=torch.int64)}
    dcp.save(old, storage_writer=tb.SafetensorsWriter(tmp_path))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    with pytest.raises(CheckpointException, match="No space left on device"):
        dcp.save({"w": torch.zeros(4), "b": torch.zeros(2)}, storage_writer=_FailsToWrite(tmp_path))

    staged = [p for p in tmp_path.iterdir() if p.name not in before]
    claims = [p for p in staged if p.name.startswith(".tensorbridge-save-")]  # _locks.py
    staged = [p for p in staged if p not in claims]
    assert len(staged) == 1 and staged[0].name.startswith(".tensorbridge-tmp-")
    assert {p: (tmp_path / p).read_bytes() for p in before} == before
    back = {"w": torch.zeros(4), "b": torch.zeros(2, dtype=torch.int64)}
    dcp.load(back, storage_reader=tb.SafetensorsReader(tmp_path))
    assert torch.equal(back["w"], old["w"]) and torch.equal(back["b"], old["b"])

    # the failed writer, once collected, releases its claim (io/_commit.py's begin); the
    # exception's traceback holds it in a cycle, so when depends on the collector
    gc.collect()
    dcp.save({"w": torch.full((8,), 2.0)}, storage_writer=tb.SafetensorsWriter(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "model-00001-of-00001.safetensors",
        "model.safetensors.index.json",
    ]


def test_a_dtype_without_a_safetensors_code_is_refused_before_writing(tmp_path: Path) -> None:
    sd = {"ok": torch.ones(2), "z": torch.ones(2, dtype=torch.complex128)}

    with pytest.raises(CheckpointException) as info:
        dcp.save(sd, storage_writer=tb.SafetensorsWriter(tmp_path / "c"))

    (error, _), *_ = info.value.failures.values()
    assert isinstance(error, tb.UnsupportedDtypeError)
    assert "tensor 'z': complex128 has no safetensors dtype code; pass torch.view_as_real" in str(
        error
    )
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())


def test_a_sub_byte_integer_is_refused_naming_a_format_that_keeps_it(tmp_path: Path) -> None:
    """DCP's planner cannot size torch.int4 (torch.iinfo refuses it): the writer says so
    first, naming the tensor and .npy/.npz (safetensors has no code for int4 either)."""
    sd = {"ok": torch.ones(2), "q": torch.arange(4, dtype=torch.uint8).view(torch.int4)}
    with pytest.raises(CheckpointException) as info:
        dcp.save(sd, storage_writer=tb.SafetensorsWriter(tmp_path / "c"))
    (error, _), *_ = info.value.failures.values()
    assert isinstance(error, tb.UnsupportedDtypeError)
    assert "tensor 'q' is torch.int4, which torch.distributed.checkpoint cannot plan" in str(error)
    assert str(error).endswith("save it to .npy or .npz, which keep int4 as it is")
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())


def test_reads_a_sharded_checkpoint_written_by_save_pretrained(tmp_path: Path) -> None:
    model = _gpt2()
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    want = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    sd = {k: torch.zeros_like(v) for k, v in want.items()}

    dcp.load(sd, storage_reader=tb.SafetensorsReader(tmp_path))

    for name, value in want.items():
        assert torch.equal(sd[name], value), name


def test_non_simple_objects_are_reported_never_pickled(tmp_path: Path) -> None:
    sd = {"w": torch.ones(1), "step": 3, "opt": (0.9, 0.99), "format": "x", "nan": float("nan")}

    dcp.save(sd, storage_writer=tb.SafetensorsWriter(tmp_path))

    with safe_open(tmp_path / "model-00001-of-00001.safetensors", framework="pt") as f:
        meta = f.metadata()
    skipped = json.loads(meta["tensorbridge.skipped"])
    assert meta["step"] == "3" and meta["format"] == "pt"
    assert skipped["opt"].startswith("a tuple is not a simple value")
    assert skipped["format"] == "'format' is a reserved metadata key; rename the entry"
    assert skipped["nan"] == "it holds NaN or infinity, which JSON cannot hold"
    back = {"w": torch.zeros(1), "step": 0, "opt": None}
    with pytest.raises(
        CheckpointException, match=r"'opt' was not saved \(a tuple is not a simple value"
    ):
        dcp.load(back, storage_reader=tb.SafetensorsReader(tmp_path))


# --- the layout, without processes ---------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "offsets", "sizes"),
    [
        ((6, 4), (2, 0), (3, 4)),  # rows: one range
        ((6, 4), (0, 1), (6, 2)),  # columns: a range a row
        ((2, 3, 4), (1, 1, 2), (1, 2, 2)),  # a block of a cube
        ((2, 3, 4), (0, 0, 1), (2, 3, 3)),
        ((5,), (4,), (1,)),
        ((), (), ()),
        ((3, 0), (0, 0), (3, 0)),
    ],
)
def test_block_runs_cover_exactly_the_chunks_bytes(
    shape: tuple[int, ...], offsets: tuple[int, ...], sizes: tuple[int, ...]
) -> None:
    from tensorbridge.dcp._hf_layout import Placement, block_runs

    at = Placement("f", 40, shape, 2)
    full = torch.arange(int(torch.tensor(shape).prod()) if shape else 1).reshape(shape)
    box = tuple(slice(o, o + n) for o, n in zip(offsets, sizes, strict=True))
    want = sorted(
        40 + 2 * int(i) + b for i in (full[box] if box else full).reshape(-1) for b in (0, 1)
    )

    got = []
    for blk in block_runs(at, offsets, sizes, window=16):
        assert blk.count == 1 or blk.count * blk.step <= 16
        for r in range(blk.count):
            got += range(blk.start + r * blk.step, blk.start + r * blk.step + blk.run)

    assert sorted(got) == want and len(got) == len(set(got))


class Ünïcode:  # a non-ASCII type name in a skip reason
    pass


def test_the_headers_reserved_room_holds_the_largest_entries(tmp_path: Path) -> None:
    values = {
        "n" * 300: "é" * 240,  # 482 bytes of JSON: under the 512-byte limit
        'q"\\' * 40: '"\\' * 60,  # every character escaped, twice: 486 bytes
        "too.long": "x" * 600,
    }
    sd: dict[str, Any] = {"w": torch.arange(3), **values, "obj": Ünïcode()}

    dcp.save(sd, storage_writer=tb.SafetensorsWriter(tmp_path))

    with safe_open(tmp_path / "model-00001-of-00001.safetensors", framework="pt") as f:
        meta = f.metadata()
        assert torch.equal(f.get_tensor("w"), torch.arange(3))
    skipped = json.loads(meta["tensorbridge.skipped"])
    assert meta["n" * 300] == json.dumps("é" * 240, ensure_ascii=False)
    assert json.loads(meta['q"\\' * 40]) == '"\\' * 60
    assert skipped["too.long"] == "its JSON is over the 512-byte limit for header metadata"
    assert skipped["obj"].startswith("a \\xdcn\\xefcode is not a simple value")
    assert len(skipped["obj"]) <= 160 and skipped["obj"].isascii()


def test_a_partial_checkpoint_is_refused(tmp_path: Path) -> None:
    sd = {"a": torch.ones(64), "b": torch.zeros(64)}
    for d in ("truncated", "missing"):
        dcp.save(sd, storage_writer=tb.SafetensorsWriter(tmp_path / d, max_shard_size=256))
    first = tmp_path / "truncated" / "model-00001-of-00002.safetensors"
    with open(first, "r+b") as f:
        f.truncate(first.stat().st_size - 4)
    (tmp_path / "missing" / "model-00002-of-00002.safetensors").unlink()

    with pytest.raises(tb.FormatError, match="the file is truncated or corrupt"):
        tb.SafetensorsReader(tmp_path / "truncated").read_metadata()
    with pytest.raises(tb.FormatError, match="the download is incomplete"):
        tb.SafetensorsReader(tmp_path / "missing").read_metadata()
