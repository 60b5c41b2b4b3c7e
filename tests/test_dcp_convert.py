"""DCP checkpoints (torch.distributed.checkpoint) read without a process group and
converted in flat memory: byte-for-byte against the unsharded reference.

Checkpoints are written by ``dcp.save`` on 2 and 4 spawned gloo ranks (tests/_dist.py)
with DTensors sharded ``Shard(0)`` (uneven, with empty shards), ``Shard(1)`` and
``Replicate``, every dtype with a safetensors code, 0-dim tensors, a ``step`` and an
optimizer-like nested dict; and by a plain single-process ``dcp.save``.

Each checkpoint is saved once for the module (the ``ckpt`` fixture); the everyday run
reads the 2-rank one, and the 4-rank one, like the memory bounds' 192 MiB saves, is
``slow``.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tensorbridge as tb
from _dist import run_ranks
from _peak_rss import run_child
from tensorbridge.dtypes import dtype_table
from tensorbridge.errors import DestinationExistsError, FormatError, UnsupportedDtypeError
from tensorbridge.io import assemble
from tensorbridge.io.dcp import Chunk

ROWS = [r for r in dtype_table() if r.safetensors is not None]


def _bits(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).view(dtype).reshape(shape)


def reference() -> dict[str, tuple[torch.Tensor, str]]:
    """The unsharded state dict: name -> (tensor, how the ranks hold it)."""
    ref: dict[str, tuple[torch.Tensor, str]] = {}
    for i, r in enumerate(ROWS):
        ref[f"rows.{r.name}"] = (_bits((5, 6), r.torch, i), "shard0")  # 2 ranks: 3+2; 4: 2+2+1+0
        ref[f"scalar.{r.name}"] = (_bits((), r.torch, 100 + i), "plain")
    ref["cols.f32"] = (_bits((4, 7), torch.float32, 200), "shard1")  # 4+3; 2+2+2+1
    ref["cols.bf16"] = (_bits((9, 10), torch.bfloat16, 201), "shard1")
    ref["cols.e4m3"] = (_bits((3, 5), torch.float8_e4m3fn, 202), "shard1")  # 3+2; 2+2+1+0
    ref["cols.3d"] = (_bits((3, 4, 6), torch.float16, 203), "shard1")
    ref["empty_shard"] = (_bits((1, 5), torch.int32, 204), "shard0")  # 1 + 0 (+0+0)
    ref["zero_size"] = (_bits((0, 4), torch.float32, 205), "shard0")
    ref["replicated"] = (_bits((3, 3), torch.float16, 206), "replicate")
    ref["optim.state.w.exp_avg"] = (_bits((6, 2), torch.float32, 207), "shard0")
    return ref


PLAIN = {"step": 1234, "optim.param_groups.0.lr": 0.01, "optim.param_groups.0.betas": (0.9, 0.95)}


def _state_dict(ref: dict[str, tuple[torch.Tensor, str]], rank: int, world: int) -> dict[str, Any]:
    from torch.distributed.tensor import DTensor, Replicate, Shard, init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    flat: dict[str, Any] = {}
    for name, (t, how) in ref.items():
        if how == "plain":
            flat[name] = t
            continue
        if how == "replicate":
            local, placement = t, Replicate()
        else:  # torch.chunk's split, as Shard(d) makes it: ceil(n / world) each, the rest empty
            d = 0 if how == "shard0" else 1
            size = -(-t.shape[d] // world)
            lo = min(rank * size, t.shape[d])
            local, placement = t.narrow(d, lo, min(size, t.shape[d] - lo)).contiguous(), Shard(d)
        flat[name] = DTensor.from_local(
            local, mesh, [placement], run_check=False, shape=t.shape, stride=t.stride()
        )
    exp = flat.pop("optim.state.w.exp_avg")
    return {
        "model": {k: v for k, v in flat.items()},
        "step": PLAIN["step"],
        "optim": {
            "state": {"w": {"exp_avg": exp}},
            "param_groups": [{"lr": 0.01, "betas": (0.9, 0.95), "params": ["w"]}],
        },
    }


def _save_on_ranks(rank: int, world: int, ckpt: str) -> int:
    import torch.distributed.checkpoint as dcp

    dcp.save(_state_dict(reference(), rank, world), checkpoint_id=ckpt)
    return rank


def _expected() -> dict[str, torch.Tensor]:
    """The reference under the names DCP gives it (nested keys joined with '.')."""
    out = {}
    for name, (t, _) in reference().items():
        out[name if name.startswith("optim.") else f"model.{name}"] = t
    return out


@pytest.fixture(
    scope="module",
    params=[2, pytest.param(4, marks=pytest.mark.slow)],  # a second process group
    ids=lambda w: f"{w}ranks",
)
def ckpt(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp(f"dcp{request.param}")
    path = base / "ckpt"
    run_ranks(_save_on_ranks, request.param, base, str(path))
    assert (path / ".metadata").is_file()
    return path


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


# --- reading --------------------------------------------------------------------------------


def test_open_reads_every_tensor_bit_exact(ckpt: Path) -> None:
    expected = _expected()
    with tb.open(ckpt) as f:
        assert type(f).__name__ == "DcpFile"
        assert sorted(f.keys()) == sorted(expected)
        assert f.unsupported() == {}
        for name, t in expected.items():
            row, shape = f.info(name)
            assert (row.torch, shape) == (t.dtype, tuple(t.shape)), name
            a = f[name]
            assert not a.flags.writeable
            assert _raw(tb.to_torch(a)) == _raw(t), name
        assert f.plain_values()["step"] == 1234
        assert f.metadata["optim.param_groups.0.betas"] == "(0.9, 0.95)"
        assert f.plain_values()["optim.param_groups.0.params"] == ["w"]


def test_sharded_tensors_have_their_chunks(ckpt: Path) -> None:
    world = len(list(ckpt.glob("*.distcp")))  # one file a rank
    with tb.open(ckpt) as f:
        cols = f.chunks("model.cols.f32")
        assert sorted(c.offsets[1] for c in cols) == list(range(0, 7, -(-7 // world)))
        assert sum(math.prod(c.shape) for c in cols) == 28
        assert len(f.chunks("model.replicated")) == 1  # written once


def test_single_chunk_tensor_is_a_view_of_the_mapped_file(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    dcp.save({"w": t, "step": 3}, checkpoint_id=tmp_path / "c", no_dist=True)
    with tb.open(tmp_path / "c") as f:
        a = f["w"]
        assert a.base is not None and not a.flags.owndata and not a.flags.writeable
        assert a.tolist() == t.tolist()
        assert f.metadata == {"step": "3"}
        assert tb.load(tmp_path / "c" / "__0_0.distcp", keys="w")["w"].tolist() == t.tolist()


def test_unrecognised_layouts_go_through_dcps_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An item this module cannot map (compressed, transformed) is read by DCP's reader."""
    import torch.distributed.checkpoint as dcp

    from tensorbridge.io.dcp import items, reader

    t = _bits((33, 5), torch.bfloat16, 9)
    dcp.save({"w": t}, checkpoint_id=tmp_path / "c", no_dist=True)

    def unrecognised(*args: Any) -> Any:
        raise items.Unrecognised("as if compressed")

    monkeypatch.setattr(reader, "locate", unrecognised)
    with tb.open(tmp_path / "c") as f:
        a = f["w"]
        assert a.flags.owndata or a.base is not None
        assert _raw(tb.to_torch(a)) == _raw(t)
    tb.save(tb.open(tmp_path / "c"), tmp_path / "m.safetensors")
    assert _raw(tb.load(tmp_path / "m.safetensors", framework="torch")["w"]) == _raw(t)


def test_inspect_lists_a_dcp_directory(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tensorbridge.cli import main

    assert main(["inspect", str(ckpt), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)[0]
    names = {t["name"]: t for t in report["tensors"]}
    assert names["model.cols.bf16"]["shape"] == [9, 10]
    assert names["model.rows.float8_e8m0fnu"]["dtype"] == "float8_e8m0fnu"
    assert report["metadata"]["step"] == 1234  # typed, as the checkpoint keeps it


def test_unsupported_values_are_reported_not_unpickled(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save(
        {"w": torch.ones(2), "names": {"a", "b"}, "lr": 0.5},
        checkpoint_id=tmp_path / "c",
        no_dist=True,
    )
    with tb.open(tmp_path / "c") as f:
        assert f.keys() == ["w", "names"]
        assert "set" in f.unsupported()["names"]
        assert f.metadata == {"lr": "0.5"}
        with pytest.raises(UnsupportedDtypeError, match="names"):
            f.info("names")
        assert any("names" in n for n in f.notes)
    tb.save(tb.open(tmp_path / "c"), f"{tmp_path}/out/")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "out" / "model-00001-of-00001.safetensors"), "pt") as g:
        assert list(g.keys()) == ["w"]
        assert g.metadata() == {"format": "pt", "lr": "0.5"}


# --- safety ---------------------------------------------------------------------------------


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_malicious_metadata_is_refused_without_running(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save({"w": torch.ones(2)}, checkpoint_id=tmp_path / "c", no_dist=True)
    marker = tmp_path / "pwned"
    meta = tmp_path / "c" / ".metadata"
    # DCP's Metadata class named first, so detection calls it a DCP checkpoint
    from torch.distributed.checkpoint.metadata import Metadata

    meta.write_bytes(pickle.dumps([Metadata, _Evil(str(marker))], protocol=4))
    with pytest.raises(FormatError, match=r"(posix|os|nt)\.system"):
        tb.open(tmp_path / "c")
    assert not marker.exists()
    with pytest.raises(FormatError, match="refused to unpickle"):
        tb.io.dcp.read_metadata(tmp_path / "c")
    assert not marker.exists()


@pytest.mark.parametrize("framed", [False, True], ids=["unframed", "in-a-frame"])
def test_a_bytearray_longer_than_the_file_is_refused_unallocated(
    tmp_path: Path, framed: bool
) -> None:
    """BYTEARRAY8 claiming 4 GiB: the pure-Python unpickler allocated it before reading."""
    import tracemalloc

    claim = pickle.BYTEARRAY8 + (4 << 30).to_bytes(8, "little") + b"x" * 16 + pickle.STOP
    if framed:  # a frame as long as its bytes: the claim runs past the frame's end
        claim = pickle.FRAME + len(claim).to_bytes(8, "little") + claim
    (tmp_path / ".metadata").write_bytes(pickle.PROTO + b"\x05" + claim)
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match=r"refused to unpickle.*(claims 4,294,967,296|frame)"):
            tb.io.dcp.read_metadata(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def _one_file_ckpt(tmp_path: Path) -> Path:
    import torch.distributed.checkpoint as dcp

    d = tmp_path / "c"
    dcp.save({"w": torch.arange(4096, dtype=torch.float32)}, checkpoint_id=d, no_dist=True)
    return d


def test_truncated_distcp_is_a_format_error(tmp_path: Path) -> None:
    d = _one_file_ckpt(tmp_path)
    data = d / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    with pytest.raises(FormatError, match="truncated"):
        tb.load(d)
    with tb.open(d) as f, pytest.raises(FormatError):
        tb.save(f, f"{tmp_path}/out/")
    assert not (tmp_path / "out" / "model.safetensors.index.json").exists()


def test_corrupt_zip_in_distcp_is_a_format_error(tmp_path: Path) -> None:
    d = _one_file_ckpt(tmp_path)
    data = d / "__0_0.distcp"
    raw = bytearray(data.read_bytes())
    end = raw.rfind(b"PK\x05\x06")  # the end-of-central-directory record
    raw[end : end + 4] = b"XXXX"
    zip64 = raw.rfind(b"PK\x06\x06")
    if zip64 >= 0:
        raw[zip64 : zip64 + 4] = b"XXXX"
    data.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match=r"not a valid torch\.save zip"):
        tb.load(d)


def test_a_chunk_outside_its_tensor_is_a_format_error(tmp_path: Path) -> None:
    # one chunk moved by one element: the count still matches and nothing overlaps, so
    # only the metadata's bounds check stands between it and an uninitialised element
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

    d = _one_file_ckpt(tmp_path)
    meta_file = d / ".metadata"
    meta = pickle.loads(meta_file.read_bytes())  # written by dcp.save just above
    item = meta.state_dict_metadata["w"]
    item.chunks = [ChunkStorageMetadata(offsets=torch.Size([1]), sizes=torch.Size([4096]))]
    (key,) = [k for k in meta.storage_data if k.fqn == "w"]
    meta.storage_data[MetadataIndex("w", torch.Size([1]))] = meta.storage_data.pop(key)
    meta_file.write_bytes(pickle.dumps(meta))
    with pytest.raises(FormatError, match=r"a chunk of 'w' lies outside its shape \[4096\]"):
        tb.load(d)


def test_missing_distcp_is_a_format_error(tmp_path: Path) -> None:
    d = _one_file_ckpt(tmp_path)
    (d / "__0_0.distcp").unlink()
    with pytest.raises(FormatError, match="missing"):
        tb.load(d)


@pytest.mark.parametrize(
    "name", ["../outside.distcp", "/etc/hostname", "x" * 300 + ".distcp", "a\x00b", ".."]
)
def test_a_storage_file_outside_the_directory_is_a_format_error(tmp_path: Path, name: str) -> None:
    # the metadata is untrusted: its file names must never leave the checkpoint directory
    d = _one_file_ckpt(tmp_path / "ckpt")
    (tmp_path / "outside.distcp").write_bytes((d / "__0_0.distcp").read_bytes())
    meta_file = d / ".metadata"
    meta = pickle.loads(meta_file.read_bytes())  # written by dcp.save just above
    for info in meta.storage_data.values():
        info.relative_path = name
    meta_file.write_bytes(pickle.dumps(meta))
    with pytest.raises(FormatError, match="not one in the directory"):
        tb.load(d)


# --- conversion -----------------------------------------------------------------------------


def test_convert_to_sharded_safetensors_is_byte_exact(ckpt: Path, tmp_path: Path) -> None:
    from safetensors import safe_open

    expected = _expected()
    out = tmp_path / "hf"
    tb.save(tb.open(ckpt), str(out) + "/", max_shard_size=600)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(expected)
    assert index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for t in expected.values()
    )
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all(s.endswith(f"-of-{len(shards):05d}.safetensors") for s in shards)
    for shard in shards:
        with safe_open(str(out / shard), "pt") as g:
            assert g.metadata()["step"] == "1234" and g.metadata()["format"] == "pt"
            for name in g.keys():  # noqa: SIM118 - safe_open is no mapping
                assert _raw(g.get_tensor(name)) == _raw(expected[name]), name
    # the same files tb.save writes from the unsharded tensors
    ref = tmp_path / "ref"
    tb.io.safetensors.save(
        {k: expected[k] for k in tb.open(ckpt)},
        ref / "model.safetensors",
        metadata={k: str(v) for k, v in tb.open(ckpt).plain_values().items()},
        max_shard_size=600,
        index=True,
    )
    for p in sorted(ref.iterdir()):
        assert (out / p.name).read_bytes() == p.read_bytes(), p.name
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary left


def test_convert_with_float_dtype_casts_floats_only(ckpt: Path, tmp_path: Path) -> None:
    expected = _expected()
    tb.save(tb.open(ckpt), tmp_path / "x.safetensors", float_dtype="bf16")
    got = tb.load(tmp_path / "x.safetensors", framework="torch")
    for name, t in expected.items():
        if t.dtype.is_floating_point and t.dtype is not torch.bfloat16:
            want = tb.to_torch(tb.to_numpy(t, dtype="bf16"))
        else:
            want = t
        assert got[name].dtype == want.dtype, name
        assert _raw(got[name]) == _raw(want), name


def test_convert_to_npy_directory(ckpt: Path, tmp_path: Path) -> None:
    expected = _expected()
    out = tmp_path / "arrays"
    tb.save(tb.open(ckpt), out, format="npy")
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{n}.npy" for n in expected)
    for name, t in expected.items():
        ref = tmp_path / "ref.npy"
        tb.save(t, ref, overwrite=True)
        assert (out / f"{name}.npy").read_bytes() == ref.read_bytes(), name
    with pytest.raises(DestinationExistsError):
        tb.save(tb.open(ckpt), out, format="npy")


@pytest.mark.slow  # subprocesses over the shared checkpoint; the reads stay fast
def test_convert_to_zarr_store(ckpt: Path, tmp_path: Path) -> None:
    zarr = pytest.importorskip("zarr", reason="Zarr stores are an extra (tensorbridge[zarr])")
    expected = _expected()
    out = tmp_path / "m.zarr"
    with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as ex:
        tb.save(tb.open(ckpt), out, float_dtype=None, executor=ex)
    with tb.open(out) as f:
        assert sorted(f.keys()) == sorted(expected)
        assert f.plain_values()["step"] == 1234
        assert f.plain_values()["optim.param_groups.0.betas"] == [0.9, 0.95]
        for name, t in expected.items():
            assert _raw(tb.to_torch(np.ascontiguousarray(f[name]))) == _raw(t), name
    assert zarr.open_array(str(out / "model.cols.bf16")).dtype == tb.numpy_dtype("bf16")
    assert not [p for p in out.iterdir() if p.name.startswith(".tensorbridge-tmp")]


def test_existing_destination_is_not_replaced_unasked(ckpt: Path, tmp_path: Path) -> None:
    tb.save(tb.open(ckpt), f"{tmp_path}/hf/")
    with pytest.raises(DestinationExistsError):
        tb.save(tb.open(ckpt), f"{tmp_path}/hf/")
    tb.save(tb.open(ckpt), f"{tmp_path}/hf/", overwrite=True)
    with pytest.raises(FormatError, match="converts to"):
        tb.save(tb.open(ckpt), tmp_path / "x.npz")


def test_plain_single_process_save_converts(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    sd = {"a": _bits((7, 3), torch.bfloat16, 1), "b": {"c": _bits((2,), torch.int8, 2)}, "n": 5}
    dcp.save(sd, checkpoint_id=tmp_path / "c", no_dist=True)
    tb.save(tb.open(tmp_path / "c"), tmp_path / "m.safetensors")
    from safetensors.torch import load_file

    got = load_file(tmp_path / "m.safetensors")
    assert _raw(got["a"]) == _raw(sd["a"]) and _raw(got["b.c"]) == _raw(sd["b"]["c"])


@pytest.mark.parametrize("window", [64, 200, 1 << 20])
def test_windows_cover_column_shards_exactly(window: int) -> None:
    """Small windows split a tensor along inner dimensions too; every byte lands once."""
    f32 = tb.resolve_dtype("f32")
    full = np.arange(4 * 6 * 5, dtype=np.float32).reshape(4, 6, 5)
    parts = [
        (Chunk((0, 0, 0), (4, 4, 5), "", 0, 0), full[:, :4]),
        (Chunk((0, 4, 0), (4, 2, 5), "", 0, 0), full[:, 4:]),
    ]
    out = bytearray(full.nbytes)
    for w in assemble.windows(full.shape, f32, f32, parts, window):
        assert len(w.data) <= max(window, 20)
        assert w.values.size == math.prod(w.size)
        out[w.offset : w.offset + len(w.data)] = w.data
    assert bytes(out) == full.tobytes()


# --- fan-out --------------------------------------------------------------------------------


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@pytest.mark.slow  # subprocesses over the shared checkpoint; the reads stay fast
def test_process_pool_output_is_byte_identical(ckpt: Path, tmp_path: Path) -> None:
    tb.save(tb.open(ckpt), f"{tmp_path}/serial/", max_shard_size=600)
    with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as ex:
        tb.save(tb.open(ckpt), f"{tmp_path}/pool/", max_shard_size=600, executor=ex)
    assert _files(tmp_path / "pool") == _files(tmp_path / "serial")


# the scheduler's HTTP server falls back to a free port when another process (a second test
# run, a developer's cluster) holds dask's default 8787, and warns; the fallback is harmless
@pytest.mark.filterwarnings("ignore:Port 8787 is already in use:UserWarning")
@pytest.mark.slow  # a dask cluster of worker processes (the process pool runs every day)
def test_dask_cluster_output_is_byte_identical(ckpt: Path, tmp_path: Path) -> None:
    distributed = pytest.importorskip("distributed", reason="dask.distributed is an extra")
    tb.save(tb.open(ckpt), f"{tmp_path}/serial/", max_shard_size=600)
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        tb.save(
            tb.open(ckpt), f"{tmp_path}/dask/", max_shard_size=600, executor=client.get_executor()
        )
        workers = client.run(os.getpid)
    assert len(set(workers.values())) == 2
    assert _files(tmp_path / "dask") == _files(tmp_path / "serial")


# --- memory ---------------------------------------------------------------------------------


def _big_on_ranks(rank: int, world: int, ckpt: str) -> int:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import DTensor, Shard, init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    rows, cols = 3 << 10, 8 << 10  # 96 MiB of float32 each
    g = torch.Generator().manual_seed(rank)
    a = torch.rand(rows // world, cols, generator=g)
    b = torch.rand(cols, rows // world, generator=g)
    sd = {
        "a": DTensor.from_local(a, mesh, [Shard(0)], run_check=False),
        "b": DTensor.from_local(b, mesh, [Shard(1)], run_check=False),
    }
    dcp.save(sd, checkpoint_id=ckpt)
    return rank


_PEAK = """
import sys, ml_dtypes, tensorbridge as tb  # code loaded before the measure, which is of data
f = tb.open(sys.argv[1])
for n in f.keys():
    f.chunks(n)
reset_peak()
base = status("VmRSS")
tb.save(f, sys.argv[2], float_dtype=sys.argv[3] if sys.argv[3] != "-" else None)
print(status("VmHWM") - base)
"""


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """192 MiB saved by 2 ranks, once for both casts."""
    base = tmp_path_factory.mktemp("big")
    run_ranks(_big_on_ranks, 2, base, str(base / "big"))
    return base / "big"


@pytest.mark.slow  # a process group saving 192 MiB, then a child converting it
@pytest.mark.parametrize("cast", ["-", "bf16"])
def test_peak_memory_is_bounded_by_the_window(big: Path, tmp_path: Path, cast: str) -> None:
    ckpt = big
    size = sum(p.stat().st_size for p in ckpt.iterdir())
    assert size > 3 * assemble.WINDOW  # 192 MiB stored
    grew = int(run_child(_PEAK, str(ckpt), str(tmp_path / "out") + "/", cast))
    assert grew < assemble.WINDOW + (24 << 20), f"peak grew {grew >> 20} MiB"
    with tb.open(tmp_path / "out") as out, tb.open(ckpt) as src:
        want = src["b"] if cast == "-" else tb.to_numpy(src["b"], dtype="bf16")
        assert np.array_equal(out["b"].view(np.uint8), want.view(np.uint8))


# --- the command line -----------------------------------------------------------------------


@pytest.mark.slow  # subprocesses over the shared checkpoint; the reads stay fast
def test_cli_convert_dcp(ckpt: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-m", "tensorbridge", "convert", str(ckpt), str(tmp_path / "o") + "/",
         "--max-shard-size", "600", "--workers", "2", "--verify", "--json"],
        capture_output=True, text=True, env=env, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["verified"] is True and summary["tensors"] == len(_expected())
    tb.save(tb.open(ckpt), f"{tmp_path}/serial/", max_shard_size=600)
    assert _files(tmp_path / "o") == _files(tmp_path / "serial")
