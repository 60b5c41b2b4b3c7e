"""Section 11: converting a DCP checkpoint to sharded safetensors, peak memory against size.

A state dict of float32 matrices (``--quick``: 16 and 48 MiB; full run: 2 and 6 GiB)
is saved by ``dcp.save`` on 2 gloo ranks as FSDP does (each matrix ``Shard(0)``,
every rank its rows), and once more through torch's ``HuggingFaceStorageWriter``
(``save_distributed=True``, per-rank safetensors). Each conversion then runs in a
child process with its memory sampled from outside:

* ``tb.save(tb.open(dcp_dir), out/)`` (= ``tensorbridge convert``): each tensor
  assembled window by window (64 MiB) into its place in the sharded output;
* torch's ``dcp_to_torch_save`` (the whole model in memory, then ``torch.save``);
* torch's consolidation ``_consolidate_hf_safetensors`` of the HF-writer checkpoint
  (private API, the one torch's own writer calls);
* a raw sequential write of the same bytes (64 MiB blocks, fsync): the disk's limit.

Then, on the larger checkpoint, ``tb.save`` with 1 and 2 local worker processes
(``executor=ProcessPoolExecutor``); and the column-sharded case of issue 12: one
1,048,576 x 16 bfloat16 tensor ``Shard(1)`` over 2 ranks, ours against torch's
consolidation and a raw write. Targets: our peak RSS growth within 1.2x between the
two sizes and under 64 MiB + 64 MiB of slack; the column merge at least 0.5x the raw
write. Scratch space is checked first and removed after.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .child import ChildRun, Task, fsync, raw_buffer, raw_write
from .core import GIB, MIB, Context, Section, fmt_bytes, fmt_mib, fmt_time

TITLE = "DCP checkpoints to sharded safetensors: peak memory against size"

ROUTES = {
    "tb": "`tb.save(tb.open(dcp_dir), out/)`",
    "to_torch_save": "torch `dcp_to_torch_save`",
    "consolidate": "torch `_consolidate_hf_safetensors` (HF-writer checkpoint)",
    "raw": "raw sequential write of the same bytes",
}

WORKERS_ROUTES = {
    "tb1": "`tensorbridge convert --workers 1` (serial)",
    "tb2": "`tensorbridge convert --workers 2`",
}


# --- writing the checkpoints on 2 gloo ranks --------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_save(rank: int, world: int, port: int, spec: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict_saver import save
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ["OMP_NUM_THREADS"] = "1"
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        sd = {}
        for name, (rows, cols, dim, dtype) in spec["tensors"].items():
            dt = getattr(torch, dtype)
            shape = [rows, cols]
            size = -(-shape[dim] // world)
            lo = min(rank * size, shape[dim])
            local_shape = list(shape)
            local_shape[dim] = min(size, shape[dim] - lo)
            local = torch.arange(local_shape[0] * local_shape[1], dtype=torch.int32)
            local = (local % 251 + rank).to(dt).reshape(local_shape)
            sd[name] = DTensor.from_local(
                local, mesh, [Shard(dim)], run_check=False, shape=torch.Size(shape),
                stride=(cols, 1),
            )  # fmt: skip
        save(sd, checkpoint_id=spec["dcp"])
        if spec.get("hf"):
            from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter

            writer = HuggingFaceStorageWriter(  # each rank builds a file in memory: 1 GiB files
                spec["hf"],
                fqn_to_index_mapping=_shards(spec),
                save_distributed=True,
                enable_consolidation=False,
            )
            save(sd, storage_writer=writer)
        dist.barrier()
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def write_checkpoints(spec: dict[str, Any], world: int = 2) -> None:
    """``dcp.save`` (and the HF writer, when ``spec['hf']``) on ``world`` gloo ranks."""
    from torch.multiprocessing.spawn import start_processes

    start_processes(  # type: ignore[no-untyped-call]
        _rank_save, args=(world, _free_port(), spec), nprocs=world, start_method="spawn"
    )
    if not (Path(spec["dcp"]) / ".metadata").is_file():
        raise RuntimeError(f"dcp.save on {world} ranks wrote no checkpoint at {spec['dcp']}")


# --- what the child processes run --------------------------------------------------------------


def paths(src: str, dst: str, *rest: Any) -> tuple[str, str, tuple[Any, ...]]:
    """The inputs, with torch's DCP package imported (seconds; untimed for every route)."""
    import torch.distributed.checkpoint
    import torch.distributed.checkpoint._consolidate_hf_safetensors
    import torch.distributed.checkpoint.format_utils  # noqa: F401

    import tensorbridge.io.assemble  # noqa: F401

    return src, dst, rest


def tb_convert(inputs: tuple[str, str, tuple[Any, ...]]) -> None:
    import tensorbridge as tb

    src, dst, _ = inputs
    tb.save(tb.open(src), dst + "/", progress=False, overwrite=True)


def cli_convert(inputs: tuple[str, str, tuple[Any, ...]]) -> None:
    """``tensorbridge convert --workers N`` in a process of its own (a benchmark child is
    daemonic and may not start a process pool itself)."""
    import subprocess
    import sys

    src, dst, (workers,) = inputs
    cmd = [sys.executable, "-m", "tensorbridge", "convert", src, dst + "/", "--overwrite",
           "--no-progress", "--workers", str(workers)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)


def to_torch_save(inputs: tuple[str, str, tuple[Any, ...]]) -> None:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    src, dst, _ = inputs
    dcp_to_torch_save(src, dst)
    fsync(dst)


def consolidate(inputs: tuple[str, str, tuple[Any, ...]]) -> None:
    from torch.distributed.checkpoint._consolidate_hf_safetensors import (
        consolidate_safetensors_files,
    )

    src, dst, (mapping,) = inputs
    os.makedirs(dst, exist_ok=True)
    consolidate_safetensors_files(src, dst, mapping, num_threads=1)
    for p in Path(dst).iterdir():
        fsync(str(p))


# --- the section ------------------------------------------------------------------------------


def _spec(total: int, scratch: Path, tag: str, hf: bool) -> dict[str, Any]:
    """Float32 matrices of 4096 columns summing to ``total`` bytes, 8 to 24 of them."""
    cols = 4096 if total >= 256 * MIB else 512
    count = max(8, min(24, total // (256 * MIB)))
    rows = total // count // (cols * 4)
    tensors = {f"layers.{i}.weight": (rows, cols, 0, "float32") for i in range(count)}
    return {
        "tensors": tensors,
        "dcp": str(scratch / f"dcp-{tag}"),
        "hf": str(scratch / f"hf-{tag}") if hf else None,
        "bytes": rows * cols * 4 * count,
    }


def _mem_available() -> int:
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


@contextlib.contextmanager
def _scratch(*dirs: str | None) -> Iterator[None]:
    try:
        yield
    finally:
        for d in dirs:
            if d:
                shutil.rmtree(d, ignore_errors=True)


def _shards(spec: dict[str, Any], limit: int = GIB) -> dict[str, int]:
    """Tensor -> file index, filled greedily to ``limit`` bytes (torch's writer and its
    consolidation get the same files; the HF writer holds a rank's file in memory)."""
    out, index, size = {}, 1, 0
    for name, (rows, cols, _, dtype) in spec["tensors"].items():
        n = rows * cols * (2 if dtype == "bfloat16" else 4)
        if size and size + n > limit:
            index, size = index + 1, 0
        out[name] = index
        size += n
    return out


def _route(
    ctx: Context, route: str, src: str, dst: str, nbytes: int, spec: dict[str, Any]
) -> ChildRun:
    tasks: dict[str, Task[Any]] = {
        "tb": Task(paths, tb_convert, (src, dst)),
        "tb1": Task(paths, cli_convert, (src, dst, 1)),
        "tb2": Task(paths, cli_convert, (src, dst, 2)),
        "to_torch_save": Task(paths, to_torch_save, (src, dst)),
        "consolidate": Task(paths, consolidate, (src, dst, _shards(spec))),
        "raw": Task(raw_buffer, raw_write, (src, dst, nbytes)),
    }
    try:
        return ctx.child(tasks[route])
    finally:
        p = Path(dst)
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def run(ctx: Context, sec: Section) -> None:
    sizes = ctx.pick([2 * GIB, 6 * GIB], [16 * MIB, 48 * MIB], [4 * MIB, 12 * MIB])
    repeats = ctx.pick(3, 1, 1)
    sec.intro(
        f"""A state dict of float32 matrices saved by `dcp.save` on 2 gloo ranks, each
        matrix `Shard(0)` (FSDP-style), converted to a loadable sharded Hugging Face
        checkpoint. Each conversion in a child process; *peak RSS +* is its peak resident
        memory above the level just before (mapped file pages included), *anon +* the
        same for anonymous memory; median of {repeats} run(s), routes interleaved.
        Scratch free space at the start: {fmt_bytes(shutil.disk_usage(ctx.scratch).free)};
        memory available: {fmt_bytes(_mem_available())}."""
    )
    rows: list[list[str]] = []
    ours: dict[int, ChildRun] = {}
    workers: dict[str, ChildRun] = {}
    for size in sizes:
        free = shutil.disk_usage(ctx.scratch).free
        if free < 4 * size + GIB:
            rows.append([fmt_bytes(size), "all", f"skipped: needs {fmt_bytes(4 * size)} disk"]
                        + [""] * 5)  # fmt: skip
            continue
        spec = _spec(size, ctx.scratch, str(size), hf=True)
        out = str(ctx.scratch / "dcp-out")
        with _scratch(spec["dcp"], spec["hf"], out):
            ctx.say(f"dcp_convert: writing a {fmt_bytes(size)} checkpoint on 2 ranks")
            write_checkpoints(spec)
            runs: dict[str, list[ChildRun]] = {r: [] for r in ROUTES}
            names = list(ROUTES)
            for rep in range(repeats):
                for route in names[rep % 4 :] + names[: rep % 4]:
                    if route == "to_torch_save" and _mem_available() < 2 * spec["bytes"] + GIB:
                        continue
                    src = spec["hf"] if route == "consolidate" else spec["dcp"]
                    dst = out + (".pt" if route in ("to_torch_save", "raw") else "")
                    runs[route].append(_route(ctx, route, src, dst, spec["bytes"], spec))
            med = {r: _median(v) for r, v in runs.items() if v}
            ours[size] = med["tb"]
            rows += _rows(ctx, sec, size, med)
            if size == sizes[-1]:
                wr: dict[str, list[ChildRun]] = {"tb1": [], "tb2": []}
                for rep in range(repeats):
                    for route in ["tb1", "tb2"] if rep % 2 == 0 else ["tb2", "tb1"]:
                        wr[route].append(_route(ctx, route, spec["dcp"], out, spec["bytes"], spec))
                workers = {r: _median(v) for r, v in wr.items()}
    sec.table(
        ["checkpoint", "route", "time", "written GB/s", "vs raw", "peak RSS +", "anon +",
         "result"],
        rows,
    )  # fmt: skip
    if len(ours) == 2:
        lo, hi = sorted(ours)
        ratio = max(ours[hi].rss_growth, MIB) / max(ours[lo].rss_growth, MIB)
        ok = ratio <= 1.2 or ours[hi].rss_growth <= 80 * MIB
        sec.text(
            f"tensorbridge's peak RSS growth: {fmt_mib(ours[lo].rss_growth)} at "
            f"{fmt_bytes(lo)}, {fmt_mib(ours[hi].rss_growth)} at {fmt_bytes(hi)} (x{ratio:.2f}; "
            f"target: flat within 1.2x) — "
            + ctx.check(sec, "DCP conversion peak RSS flat (<= 1.2x) across sizes", ok)
        )
    if workers:
        t1, t2 = workers["tb1"].seconds, workers["tb2"].seconds
        sec.table(
            ["route", "time", "speed-up"],
            [
                [WORKERS_ROUTES["tb1"], fmt_time(t1), "1.00x"],
                [WORKERS_ROUTES["tb2"], fmt_time(t2), f"{t1 / t2:.2f}x"],
            ],
        )
    _columns(ctx, sec, repeats)


def _median(runs: list[ChildRun]) -> ChildRun:
    return sorted(runs, key=lambda r: r.seconds)[len(runs) // 2]


def _rows(ctx: Context, sec: Section, size: int, med: dict[str, ChildRun]) -> list[list[str]]:
    raw = med.get("raw")
    rows = []
    for route, label in ROUTES.items():
        r = med.get(route)
        if r is None:
            rows.append([fmt_bytes(size), label, "skipped: not enough memory"] + [""] * 5)
            continue
        result = ""
        if route == "tb":
            result = ctx.check(
                sec,
                f"DCP conversion of {fmt_bytes(size)}: peak RSS growth <= 128 MiB",
                r.rss_growth <= 128 * MIB,
            )
        rows.append(
            [
                fmt_bytes(size),
                label,
                fmt_time(r.seconds),
                f"{size / r.seconds / 1e9:.2f}",
                f"{raw.seconds / r.seconds:.2f}x" if raw else "—",
                fmt_mib(r.rss_growth),
                fmt_mib(r.anon_growth),
                result,
            ]
        )
    return rows


def _columns(ctx: Context, sec: Section, repeats: int) -> None:
    """The 1,048,576 x 16 bfloat16 Shard(1) tensor: a column-sharded merge."""
    rows_n = ctx.pick(1 << 20, 1 << 16, 1 << 14)
    spec: dict[str, Any] = {
        "tensors": {"embed.weight": (rows_n, 16, 1, "bfloat16")},
        "dcp": str(ctx.scratch / "dcp-cols"),
        "hf": str(ctx.scratch / "hf-cols"),
    }
    nbytes = rows_n * 16 * 2
    out = str(ctx.scratch / "dcp-cols-out")
    with _scratch(spec["dcp"], spec["hf"], out):
        write_checkpoints(spec)
        runs: dict[str, list[ChildRun]] = {"tb": [], "consolidate": [], "raw": []}
        for _ in range(repeats):
            for route in runs:
                src = spec["hf"] if route == "consolidate" else spec["dcp"]
                dst = out + (".bin" if route == "raw" else "")
                runs[route].append(_route(ctx, route, src, dst, nbytes, spec))
    med = {r: _median(v) for r, v in runs.items()}
    raw = med["raw"].seconds
    ratio = raw / med["tb"].seconds
    sec.table(
        ["1,048,576 x 16 bf16, Shard(1) on 2 ranks", "time", "vs raw write"],
        [
            [ROUTES["tb"], fmt_time(med["tb"].seconds), f"{ratio:.2f}x"],
            [ROUTES["consolidate"], fmt_time(med["consolidate"].seconds),
             f"{raw / med['consolidate'].seconds:.2f}x"],
            [ROUTES["raw"], fmt_time(raw), "1.00x"],
        ],
    )  # fmt: skip
    sec.text(
        f"Column-sharded merge at {ratio:.2f}x a raw write of the same bytes (target >= 0.5x): "
        + ctx.check(sec, "column-sharded merge >= 0.5x raw write", ratio >= 0.5)
    )
