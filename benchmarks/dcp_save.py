"""Section: ``dcp.save`` straight to a Hugging Face checkpoint, per-rank memory and time.

Two gloo ranks (spawned processes, CPU) save the same sharded state dict twice, side
by side in one run: with ``tb.SafetensorsWriter`` (every rank writes its own bytes of
the final files) and with torch's ``HuggingFaceStorageWriter(save_distributed=True,
enable_consolidation=True)`` (each rank writes its own files, then the coordinator
merges them into the final ones). Each rank builds only its own shards, then resets
its kernel high-water mark (``VmHWM``) and reports how far ``dcp.save`` raised it,
and the time from a barrier before the save to one after it: the time to a loadable
HF checkpoint. Workloads:

1. an FSDP-style state dict, 8 float32 tensors ``Shard(0)`` (512 MiB; ``--quick``: 32 MiB);
2. one 1,048,576 x 16 bfloat16 tensor ``Shard(1)`` (a column shard is a run of 16
   bytes a row; ``--quick``: 65,536 rows), with torch's consolidation step timed on
   its own, next to a raw sequential write (and fsync) of the same bytes.

The order of the writers alternates between repeats; each figure is the median of
the repeats (3 in the full run).
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import shutil
import socket
import statistics
import time
from pathlib import Path
from typing import Any

from .child import own_peak, reset_peak
from .core import MIB, Context, Section, fmt_bytes, fmt_mib, fmt_time

TITLE = "Distributed checkpoints: dcp.save to Hugging Face safetensors on 2 ranks"

WORLD = 2
ROUTES = {
    "tb": "`tb.SafetensorsWriter`",
    "torch": "torch `HuggingFaceStorageWriter` + consolidation",
}


# --- what each rank runs ------------------------------------------------------------------


def _local_state_dict(job: dict[str, Any]) -> dict[str, Any]:
    """This rank's shards as DTensors, built without ever holding a whole tensor."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    mesh = init_device_mesh("cpu", (WORLD,))
    dtype = getattr(torch, job["dtype"])
    sd: dict[str, Any] = {}
    for i in range(job["count"]):
        shape = tuple(job["shape"])
        placements = [Shard(job["dim"])]
        local_shape, _ = compute_local_shape_and_global_offset(shape, mesh, placements)
        local = torch.randn(local_shape, generator=torch.Generator().manual_seed(i)).to(dtype)
        stride = torch.empty(shape, device="meta").stride()
        sd[f"layers.{i}.weight"] = DTensor.from_local(
            local, mesh, placements, run_check=False, shape=torch.Size(shape), stride=stride
        )
    return sd


def _writer(route: str, path: str) -> Any:
    import tensorbridge as tb

    if route == "tb":
        return tb.SafetensorsWriter(path)
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter

    class Timed(HuggingFaceStorageWriter):
        finish_s = 0.0

        def finish(self, metadata: Any, results: Any) -> None:
            t0 = time.perf_counter()
            super().finish(metadata, results)
            Timed.finish_s = time.perf_counter() - t0

    return Timed(path, save_distributed=True, enable_consolidation=True)


def _rank(rank: int, port: int, job: dict[str, Any], route: str, path: str, out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD)
    )
    import warnings

    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict_saver import save

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    sd = _local_state_dict(job)
    writer = _writer(route, path)
    gc.collect()
    dist.barrier()
    reset_peak()
    base = own_peak()
    t0 = time.perf_counter()
    save(sd, storage_writer=writer)
    dist.barrier()
    seconds = time.perf_counter() - t0
    report = {
        "seconds": seconds,
        "growth": own_peak() - base,
        "finish_s": getattr(type(writer), "finish_s", 0.0),
    }
    tmp = Path(out) / f".rank{rank}"
    tmp.write_text(json.dumps(report))
    tmp.rename(Path(out) / f"rank{rank}.json")  # before teardown, which gloo may abort
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def save_on_ranks(job: dict[str, Any], route: str, scratch: Path) -> list[dict[str, float]]:
    """Run one ``dcp.save`` on 2 spawned gloo ranks; each rank's report."""
    out = scratch / f"dcp-{route}-reports"
    ckpt = scratch / f"dcp-{route}-ckpt"
    for d in (out, ckpt):
        shutil.rmtree(d, ignore_errors=True)
    out.mkdir(parents=True)
    ctx = multiprocessing.get_context("spawn")
    port = _free_port()
    procs = [
        ctx.Process(target=_rank, args=(r, port, job, route, str(ckpt), str(out)))
        for r in range(WORLD)
    ]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(1800)
        reports = []
        for r in range(WORLD):
            f = out / f"rank{r}.json"
            if not f.exists():
                raise RuntimeError(f"rank {r} of the {route} save reported nothing (it died)")
            reports.append(json.loads(f.read_text()))
        _check_loadable(ckpt)
        return reports
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(ckpt, ignore_errors=True)


def _check_loadable(ckpt: Path) -> None:
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    for file in set(index["weight_map"].values()):
        if not (ckpt / file).is_file():
            raise RuntimeError(f"{ckpt}: the index names {file}, which is missing")


def raw_write(nbytes: int, path: Path) -> float:
    """Seconds to write ``nbytes`` sequentially in 64 MiB blocks, then fsync."""
    buf = bytearray(min(nbytes, 64 << 20))
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            k = min(left, len(buf))
            f.write(memoryview(buf)[:k])
            left -= k
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - t0
    path.unlink()
    return seconds


# --- the section ----------------------------------------------------------------------------


def _median(runs: list[list[dict[str, float]]], key: str, rank: int) -> float:
    return statistics.median(run[rank][key] for run in runs)


def run(ctx: Context, sec: Section) -> None:
    total = ctx.pick(512 * MIB, 32 * MIB, 2 * MIB)
    rows_n = ctx.pick(1 << 20, 1 << 16, 1 << 10)
    repeats = ctx.pick(3, 1, 1)
    fsdp = {"count": 8, "shape": [total // 8 // 4 // 4096, 4096], "dtype": "float32", "dim": 0}
    cols = {"count": 1, "shape": [rows_n, 16], "dtype": "bfloat16", "dim": 1}
    sec.intro(
        f"""Two gloo ranks save the same sharded state dict with each writer. *Peak RSS +*
        is how far `dcp.save` raised the rank's kernel high-water mark (`VmHWM`) above
        its level with the shards already built; *time* runs from a barrier before the
        save to one after it, when the HF checkpoint is complete (for torch's writer,
        after its consolidation on rank 0). Median of {repeats} run(s), the writers'
        order alternating."""
    )
    table_rows = []
    workloads = [
        (f"FSDP {fmt_bytes(total)} f32, Shard(0)", fsdp, total),
        (f"{rows_n:,}x16 bf16, Shard(1)", cols, rows_n * 16 * 2),
    ]
    for label, job, nbytes in ctx.pick(workloads, workloads, workloads[1:]):
        runs: dict[str, list[list[dict[str, float]]]] = {r: [] for r in ROUTES}
        for rep in range(repeats):
            order = list(ROUTES) if rep % 2 == 0 else list(ROUTES)[::-1]
            for route in order:
                ctx.say(f"dcp_save: {label}, {route}, run {rep + 1}")
                runs[route].append(save_on_ranks(job, route, ctx.scratch))
        raw = raw_write(nbytes, ctx.scratch / "dcp-raw.bin") if job is cols else None
        shard = nbytes // WORLD
        for route, name in ROUTES.items():
            seconds = _median(runs[route], "seconds", 0)
            growth = [_median(runs[route], "growth", r) for r in range(WORLD)]
            note = ""
            if route == "torch":
                note = f"consolidation {fmt_time(_median(runs[route], 'finish_s', 0))}"
            elif raw is not None:
                note = f"raw write of the {fmt_bytes(nbytes)}: {fmt_time(raw)}"
            result = ""
            if route == "tb":
                result = ctx.check(
                    sec,
                    f"{label}: tb per-rank peak RSS growth <= its shard + 64 MiB",
                    max(growth) <= shard + 64 * MIB,
                )
            table_rows.append(
                [
                    label,
                    name,
                    fmt_time(seconds),
                    fmt_mib(growth[0]),
                    fmt_mib(growth[1]),
                    fmt_bytes(shard),
                    note,
                    result,
                ]
            )
        if job is fsdp:
            tb_s, th_s = _median(runs["tb"], "seconds", 0), _median(runs["torch"], "seconds", 0)
            tb_m = max(_median(runs["tb"], "growth", r) for r in range(WORLD))
            th_m = max(_median(runs["torch"], "growth", r) for r in range(WORLD))
            ctx.highlight(
                f"**`dcp.save` of a {fmt_bytes(total)} FSDP state dict on 2 ranks to a final "
                f"HF checkpoint**: `tb.SafetensorsWriter` {fmt_time(tb_s)} and "
                f"{fmt_mib(tb_m)} peak RSS growth a rank; torch's HF writer with "
                f"consolidation {fmt_time(th_s)} and {fmt_mib(th_m)}."
            )
    sec.table(
        [
            "state dict",
            "writer",
            "time",
            "rank 0 peak RSS +",
            "rank 1 peak RSS +",
            "shard a rank",
            "note",
            "target",
        ],
        table_rows,
    )
