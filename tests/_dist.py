"""Run a function on N gloo ranks (CPU processes) and collect what each rank returned.

Tests judge what the ranks *produced* (their return values, the files they wrote),
never only exit codes: gloo's teardown can abort a process after a successful run, so
a rank's result is written to a file before the process group is destroyed, and a
missing result file is the failure.

>>> # in a test:  results = run_ranks(_body, 2, tmp_path, "arg")
>>> # _body(rank, world_size, *args) runs in each rank with the process group set up;
>>> # it must be a module-level function (it is pickled into the child).
"""

from __future__ import annotations

import os
import pickle
import socket
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

TIMEOUT_S = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child(
    rank: int,
    world_size: int,
    port: int,
    out: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size)
    )
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result: tuple[str, Any]
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        result = ("ok", fn(rank, world_size, *args))
    except BaseException as e:  # reported to the parent, which re-raises
        result = ("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    # the result is on disk before teardown, which may abort the process
    tmp = Path(out) / f".rank{rank}.tmp"
    tmp.write_bytes(pickle.dumps(result))
    tmp.rename(Path(out) / f"rank{rank}.result")
    try:
        dist.barrier()
        dist.destroy_process_group()
    except Exception:  # teardown errors after the result is written
        pass


def run_ranks(fn: Callable[..., Any], world_size: int, tmp_path: Path, *args: Any) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; their return values.

    A rank that raised fails the test with its traceback; a rank that wrote no result
    (killed, hung past ``TIMEOUT_S``) fails it too, whatever the exit codes say.
    """
    out = tmp_path / f"ranks-{_free_port()}"
    out.mkdir(parents=True)
    ctx = mp.start_processes(
        _child,
        args=(world_size, _free_port(), str(out), fn, args),
        nprocs=world_size,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + TIMEOUT_S
    for p in ctx.processes:  # exit codes are not judged: the result files are
        p.join(max(0.0, deadline - time.monotonic()))
    for p in ctx.processes:
        if p.is_alive():
            p.kill()
    results = []
    for rank in range(world_size):
        f = out / f"rank{rank}.result"
        if not f.exists():
            pytest.fail(f"rank {rank} of {world_size} wrote no result (killed or hung)")
        status, value = pickle.loads(f.read_bytes())  # written by our own child
        if status == "error":
            pytest.fail(f"rank {rank} of {world_size} raised:\n{value}")
        results.append(value)
    return results
