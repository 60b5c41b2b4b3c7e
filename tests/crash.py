"""Kill saves at random points and check that no checkpoint is ever lost or half-written.

Each trial puts a previous version of a checkpoint at a destination (or nothing),
then starts a child that saves a new version there and SIGKILLs it:

* at the k-th file-system call (``os.write``, ``pwrite``, ``fsync``, ``replace``,
  ``rename``, ``unlink``, ``mkdir``, ``ftruncate``, ... and every ``write`` of a
  file opened for writing), k drawn from 1 .. (calls of a clean run) + 1, which
  reaches every boundary of the write protocol deterministically; or
* after a random delay, drawn from 0 .. 1.2 x the clean run's duration, which
  also lands inside single large writes and inside C code (torch, zarr).

Afterwards the destination must hold the previous version bit-exact (every file
byte-identical), or the complete new one (every tensor read back fully and equal
to a clean save's, every file the index names byte-identical to the clean save's
file of that name), or, for a fresh destination, nothing. For a fresh
destination a multi-file checkpoint may also be *uncommitted* (files but no
index, which every reader refuses with ``UncommittedCheckpointError``: only the
fallback commit of filesystems without hard links or an atomic exchange leaves
that); where a previous version existed, that is a lost checkpoint. An index never
names a missing, partial or foreign shard. What a killed save may leave behind,
and readers ignore: hidden ``.NAME.<random>.tmp`` files (which an index committed
by the killed save may name, until its final names are linked),
``.tensorbridge-tmp-<id>`` staging directories, the lock files of ``_locks.py``
(``.tensorbridge.lock``, ``.tensorbridge-save-<token>.lock``), and the previous
save's shards once the new index is committed. A quarter of the killed trials then save the new
version again, unkilled: it must read as the new version and leave none of that
behind.

Kinds: ``tb.save`` to every writable format, a sharded save, ``tensorbridge
convert`` (plain, sharded, ``--dequantize``, from a DCP checkpoint), and the DCP
writers ``SafetensorsWriter`` / ``ZarrWriter`` on two gloo ranks (one rank killed,
the other then too). Run by hand::

    PYTHONPATH=src python tests/crash.py --trials 400 [--kinds npy,zarr] [--seed 1]

``--no-links`` runs every save as on a filesystem without hard links (``os.link``
fails with ``EPERM``), so the copying commit of ``_commit.py`` is the one killed.

``tests/test_crash_safety.py`` runs a bounded slice in CI.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import errno
import hashlib
import io
import multiprocessing as mp
import os
import random
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PRELOAD = [
    "numpy",
    "torch",
    "tensorbridge",
    "tensorbridge.io",
    "tensorbridge.cli",
    "zarr",
    "torch.distributed.checkpoint",
    "tensorbridge.dcp",
]
KINDS = (
    "safetensors",
    "npy",
    "npz",
    "pt",
    "gguf",
    "zarr",
    "sharded",
    "convert",
    "convert-sharded",
    "convert-dequantize",
    "convert-dcp",
    "dcp-safetensors",
    "dcp-zarr",
)
SIZES = {"s": 4_000, "m": 400_000, "l": 4_000_000}  # about this many bytes a tensor
MULTI_FILE = {"sharded", "zarr", "convert-sharded", "convert-dcp", "dcp-safetensors", "dcp-zarr"}
INDEXED = {"sharded", "convert-sharded", "convert-dcp", "dcp-safetensors"}  # a safetensors index
INDEX = "model.safetensors.index.json"
TEMP = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")  # atomic writes' temporaries
STAGING = ".tensorbridge-tmp-"
LOCK = re.compile(r"\.tensorbridge\.lock|\.tensorbridge-save-[0-9a-z_]+\.lock")  # _locks.py
HANG_S = 180  # a save not done after this long is killed and counted as a hang


# --- the checkpoints ------------------------------------------------------------------------


def state_dict(kind: str, size: str, version: int) -> dict[str, Any]:
    """Version ``version`` of a model: its tensors differ in values, number and shard count."""
    import torch

    g = torch.Generator().manual_seed(7919 * version + len(kind) * 31 + SIZES[size])
    n = 3 + version % 3
    dtypes = [torch.float32, torch.bfloat16, torch.int8, torch.float16]
    if kind in ("gguf", "convert-dequantize"):
        dtypes = [torch.float32, torch.float16]
    out: dict[str, Any] = {}
    for i in range(n):
        dt = dtypes[i % len(dtypes)]
        count = max(32, SIZES[size] // 4 * (1 + i % 2))
        shape = (count // 32, 32)
        if dt.is_floating_point:
            out[f"layer{i}.weight"] = torch.randn(shape, generator=g).to(dt)
        else:
            out[f"layer{i}.weight"] = torch.randint(-100, 100, shape, generator=g).to(dt)
    return out


def shard_size(kind: str, size: str, version: int) -> int:
    """A shard limit giving 2, 3 or 4 shards depending on the version."""
    return SIZES[size] * (2 + version % 2)


@dataclass
class Scenario:
    kind: str
    size: str
    work: Path  # sources and references live here
    no_links: bool = False  # the filesystem makes no hard links: the copying commit runs

    def dest(self, root: Path) -> Path:
        """The path the save writes; the directory to judge is ``root``."""
        single = {
            "safetensors": "model.safetensors",
            "npy": "x.npy",
            "npz": "x.npz",
            "pt": "model.pt",
            "gguf": "model.gguf",
            "convert": "model.safetensors",
            "convert-dequantize": "model.safetensors",
        }
        if self.kind in single:
            return root / single[self.kind]
        if self.kind in ("zarr", "dcp-zarr"):
            return root / "store.zarr"
        return root  # a directory of shards and their index

    def source(self, version: int) -> Path:
        return self.work / f"src-{self.kind}-{self.size}-v{version}"


def make_source(sc: Scenario, version: int) -> Path:
    """The file a ``convert`` kind converts (a .pt, a Q8_0 .gguf, a DCP directory)."""
    import tensorbridge as tb

    src = sc.source(version)
    sd = state_dict(sc.kind, sc.size, version)
    if sc.kind == "convert-dequantize":
        path = src / "model.gguf"
        tb.save(sd, path, metadata={"general.architecture": "llama"}, quantize="q8_0")
    elif sc.kind == "convert-dcp":
        import torch.distributed.checkpoint as dcp

        path = src / "dcp"
        with warnings_off():
            dcp.save(sd, checkpoint_id=str(path))
    else:
        path = src / "model.pt"
        tb.save(sd, path)
    return path


@contextlib.contextmanager
def warnings_off() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def operation(sc: Scenario, version: int, root: Path) -> Callable[[], None]:
    """The save the child runs (single-process kinds)."""
    import tensorbridge as tb

    dest = sc.dest(root)
    target = str(dest) + os.sep if dest == root else str(dest)  # a directory, maybe new
    if sc.kind.startswith("convert"):
        from tensorbridge.cli import main

        src = sc.source(version)
        src = next(p for p in src.iterdir() if not p.name.startswith("."))
        argv = ["convert", str(src), target, "--overwrite", "--no-progress"]
        if sc.kind in ("convert-sharded", "convert-dcp"):
            argv += ["--max-shard-size", str(shard_size(sc.kind, sc.size, version))]
        if sc.kind == "convert-dequantize":
            argv += ["--dequantize", "f32"]

        def run() -> None:
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()) as err,
            ):
                rc = main(argv)
            if rc != 0:
                raise RuntimeError(f"convert failed: {err.getvalue()}")

        return run
    sd = state_dict(sc.kind, sc.size, version)
    options: dict[str, Any] = {"overwrite": True}
    if sc.kind == "npy":
        obj: Any = next(iter(sd.values()))
    else:
        obj = sd
    if sc.kind == "gguf":
        options["metadata"] = {"general.architecture": "llama", "general.name": f"v{version}"}
    if sc.kind == "sharded":
        options["max_shard_size"] = shard_size(sc.kind, sc.size, version)
    return lambda: tb.save(obj, target, **options)


# --- killing at the k-th file-system call ---------------------------------------------------


class Tripwire:
    """Counts file-system calls; at the ``kill_at``-th it SIGKILLs its own process."""

    def __init__(self, kill_at: int) -> None:
        self.kill_at = kill_at
        self.calls = 0

    def hit(self) -> None:
        self.calls += 1
        if self.calls == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


class _Counted:
    """A file object whose writes pass the tripwire first."""

    def __init__(self, f: Any, wire: Tripwire) -> None:
        self._f = f
        self._wire = wire

    def write(self, data: Any) -> Any:
        self._wire.hit()
        return self._f.write(data)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)

    def __enter__(self) -> _Counted:
        self._f.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._f.__exit__(*exc)

    def __iter__(self) -> Any:
        return iter(self._f)


PATCHED_OS = (
    "write",
    "pwrite",
    "pwritev",
    "fsync",
    "fdatasync",
    "replace",
    "rename",
    "unlink",
    "remove",
    "rmdir",
    "mkdir",
    "ftruncate",
    "truncate",
    "link",
    "fchmod",
)


def arm(wire: Tripwire) -> None:
    """Route the file-system calls of this process through ``wire``."""
    for name in PATCHED_OS:
        real = getattr(os, name, None)
        if real is None:
            continue

        def counted(*a: Any, _real: Any = real, **k: Any) -> Any:
            wire.hit()
            return _real(*a, **k)

        setattr(os, name, counted)
    real_fdopen, real_open = os.fdopen, io.open

    def fdopen(fd: int, mode: str = "r", *a: Any, **k: Any) -> Any:
        f = real_fdopen(fd, mode, *a, **k)
        return _Counted(f, wire) if any(c in mode for c in "wa+") else f

    def open_(file: Any, mode: str = "r", *a: Any, **k: Any) -> Any:
        f = real_open(file, mode, *a, **k)
        if any(c in mode for c in "wax+"):
            wire.hit()
            return _Counted(f, wire)
        return f

    os.fdopen = fdopen  # type: ignore[assignment]
    io.open = builtins.open = open_  # type: ignore[assignment]


# --- the child ------------------------------------------------------------------------------


def child(
    sc: Scenario, version: int, root: str, kill_at: int, conn: Any, rank: int = -1, *dist: Any
) -> None:
    """Run one save; report the calls it made (``kill_at`` 0: never kill)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - a dying child's noise
    if rank >= 0:
        run = dcp_operation(sc, version, Path(root), rank, *dist)
    else:
        run = operation(sc, version, Path(root))
    if sc.no_links:

        def no_link(*a: Any, **k: Any) -> None:
            raise OSError(errno.EPERM, "no hard links here (crash.py --no-links)")

        os.link = no_link
    wire = Tripwire(kill_at)
    conn.send("go")
    arm(wire)
    t = time.perf_counter()
    try:
        run()
        result: Any = ("ok", wire.calls, time.perf_counter() - t)
    except BaseException as err:
        result = ("error", f"{type(err).__name__}: {err}", 0.0)
    wire.kill_at = -1
    conn.send(result)
    if rank >= 0:  # every rank stays until all have reported, then skips gloo's teardown
        conn.poll(120)
        os._exit(0)


def dcp_operation(
    sc: Scenario, version: int, root: Path, rank: int, world: int, port: int
) -> Callable[[], None]:
    """One rank of a 2-rank ``dcp.save`` of row-sharded DTensors through a tensorbridge writer."""
    from datetime import timedelta

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import tensorbridge as tb

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world)
    )
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    mesh = init_device_mesh("cpu", (world,))
    sd = {
        k: distribute_tensor(v, mesh, [Shard(0)])
        for k, v in state_dict(sc.kind, sc.size, version).items()
    }
    dest = sc.dest(root)
    if sc.kind == "dcp-zarr":
        writer: Any = tb.ZarrWriter(dest)
    else:
        writer = tb.SafetensorsWriter(dest, max_shard_size=shard_size(sc.kind, sc.size, version))

    def run() -> None:
        with warnings_off():
            dcp.save(sd, storage_writer=writer)

    return run


@dataclass
class Outcome:
    status: str  # ok / error / killed / hang
    calls: int = 0
    seconds: float = 0.0
    detail: str = ""


def run_child(
    ctx: Any, sc: Scenario, version: int, root: Path, kill_at: int, delay: float | None
) -> Outcome:
    """Start the save's process(es); kill at ``kill_at`` (in-process) or after ``delay``."""
    ranks = 2 if sc.kind.startswith("dcp-") else 0
    conns, procs = [], []
    if ranks:
        port = _free_port()
        victim = random.randrange(ranks)
        for r in range(ranks):
            here, there = ctx.Pipe()
            k = kill_at if r == victim else 0
            p = ctx.Process(target=child, args=(sc, version, str(root), k, there, r, ranks, port))
            p.start()
            there.close()  # the child's end: only the child may hold it, or EOF never comes
            conns.append(here)
            procs.append(p)
    else:
        victim = 0
        here, there = ctx.Pipe()
        p = ctx.Process(target=child, args=(sc, version, str(root), kill_at, there))
        p.start()
        there.close()
        conns, procs = [here], [p]
    try:
        for c in conns:
            if not c.poll(120):
                raise RuntimeError(f"{sc.kind}: the child never started")
            c.recv()
        if delay is not None:
            time.sleep(delay)
            procs[victim].kill()
        results = []
        for c in [conns[victim]] + [c for i, c in enumerate(conns) if i != victim]:
            if not c.poll(HANG_S):  # judged like a kill; counted apart
                for p in procs:
                    p.kill()
                return Outcome("hang")
            try:
                results.append(c.recv())
            except EOFError:  # the process died before reporting
                break
        if len(results) < len(conns):
            procs[victim].join(30)
            if procs[victim].exitcode != -signal.SIGKILL:
                raise RuntimeError(f"{sc.kind}: a child died with {procs[victim].exitcode}")
            for p in procs:  # the other rank cannot finish alone
                p.join(0.5)
                p.kill()
            return Outcome("killed")
        for c in conns if ranks else ():  # ranks wait for this before they exit
            with contextlib.suppress(OSError):
                c.send("bye")
        err = [r for r in results if r[0] != "ok"]
        if err:
            return Outcome("error", detail=str(err[0][1]))
        return Outcome("ok", calls=max(r[1] for r in results), seconds=max(r[2] for r in results))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
        for c in conns:
            c.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- judging a destination ------------------------------------------------------------------


def is_litter(rel: Path) -> bool:
    return any(
        TEMP.fullmatch(part) or part.startswith(STAGING) or LOCK.fullmatch(part)
        for part in rel.parts
    )


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` but litter: relative path -> sha256 of its bytes."""
    out = {}
    if not root.exists():
        return out
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and not is_litter(rel):
            out[str(rel)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def litter(root: Path) -> list[str]:
    if not root.exists():
        return []
    return sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if is_litter(p.relative_to(root))
    )


def fingerprint(path: Path) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """Every tensor read back fully from ``path``: name -> (dtype, shape, sha256 of its bytes)."""
    import numpy as np

    import tensorbridge as tb

    out = {}
    with tb.open(path) as f:
        for name in f:
            a = np.ascontiguousarray(f.get(name, mmap=False))
            out[name] = (str(a.dtype), a.shape, hashlib.sha256(a.tobytes()).hexdigest())
    return out


@dataclass
class Version:
    files: dict[str, str]  # snapshot of a clean save's destination
    content: dict[str, Any]
    calls: int
    seconds: float


def judge(sc: Scenario, root: Path, old: Version | None, new: Version) -> tuple[str, str]:
    """("old" | "new" | "none" | "uncommitted" | "LOST", detail) for the destination under root."""
    import tensorbridge as tb

    files = snapshot(root)
    if old is not None and all(files.get(k) == v for k, v in old.files.items()):
        extra = set(files) - set(old.files)
        try:
            content = fingerprint(sc.dest(root))
        except Exception as err:
            return "LOST", f"previous files intact but unreadable: {type(err).__name__}: {err}"
        if content != old.content:
            return "LOST", f"previous files intact but reads differently (extra files {extra})"
        return "old", ""
    try:
        content = fingerprint(sc.dest(root))
    except (tb.UncommittedCheckpointError, FileNotFoundError) as err:
        if not files:  # nothing under a final name: right only where nothing was before
            return ("none", "") if old is None else ("LOST", "the previous files are gone")
        if sc.kind in MULTI_FILE and old is None:  # the fallback commit's window, fresh
            return "uncommitted", type(err).__name__
        if sc.kind in MULTI_FILE:
            return "LOST", f"uncommitted where a previous version existed: {err}"
        return "LOST", f"{type(err).__name__}: {err}"
    except Exception as err:
        return "LOST", f"{type(err).__name__}: {err}"
    if content == new.content:
        deterministic = sc.kind not in ("npz", "pt", "zarr", "dcp-zarr")
        if sc.kind in INDEXED and any(k.endswith(".index.json") for k in new.files):
            differ = indexed_files_differ(root, new)
            if differ:
                return "LOST", f"reads as the new version but {differ}"
        elif deterministic and any(files.get(k) != v for k, v in new.files.items()):
            return "LOST", "reads as the new version but its files differ from a clean save's"
        return "new", ""
    if old is not None and content == old.content:
        return "LOST", "reads as the previous version but its files changed"
    return "LOST", "reads as neither version (a mix, or partial)"


def indexed_files_differ(root: Path, new: Version) -> str:
    """Why the files ``root``'s index names are not a clean save's shards (``""``: they are).

    The index may name hidden ``.NAME.<random>.tmp`` files (committed, final names
    not yet linked): each counts as the clean save's ``NAME``.
    """
    import json

    from tensorbridge._commit import final_name

    index = next(k for k in new.files if k.endswith(".index.json"))  # named after the source
    weight_map = json.loads((root / index).read_bytes())["weight_map"]
    named = set(weight_map.values())
    finals = {final_name(n) or n: n for n in named}
    shards = {k for k in new.files if k != index}
    if set(finals) != shards or len(finals) != len(named):
        return f"its index names {sorted(named)}, a clean save {sorted(shards)}"
    for final, on_disk in finals.items():
        if hashlib.sha256((root / on_disk).read_bytes()).hexdigest() != new.files[final]:
            return f"{on_disk} differs from a clean save's {final}"
    return ""


# --- the trials -----------------------------------------------------------------------------


@dataclass
class Tally:
    trials: Counter[str] = field(default_factory=Counter)
    states: Counter[tuple[str, str]] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)
    hangs: list[str] = field(default_factory=list)
    litter_kinds: set[str] = field(default_factory=set)
    resaves: int = 0  # killed trials saved again afterwards

    def report(self) -> str:
        lines = [f"{'kind':20} trials  old  new  none  uncommitted  LOST"]
        for kind in KINDS:
            if not self.trials[kind]:
                continue
            s = {
                st: self.states[(kind, st)] for st in ("old", "new", "none", "uncommitted", "LOST")
            }
            lines.append(
                f"{kind:20} {self.trials[kind]:6} {s['old']:4} {s['new']:4} {s['none']:5} "
                f"{s['uncommitted']:12} {s['LOST']:5}"
            )
        total = sum(self.trials.values())
        lines.append(
            f"total {total} trials, {len(self.lost)} lost, {len(self.hangs)} hangs, "
            f"{self.resaves} saved again after the kill"
        )
        lines.extend(self.hangs[:10])
        lines.extend(self.lost[:20])
        return "\n".join(lines)


class Harness:
    """References made once per scenario, then trials against them."""

    def __init__(self, work: Path, seed: int) -> None:
        self.work = work
        self.rng = random.Random(seed)
        self.ctx = mp.get_context("forkserver")
        self.ctx.set_forkserver_preload(PRELOAD)
        self.refs: dict[tuple[str, str, int], tuple[Path, Version]] = {}

    def reference(self, sc: Scenario, version: int) -> tuple[Path, Version]:
        """A clean save of ``version``: its files, content, calls and duration (cached)."""
        key = (sc.kind, sc.size, version)
        if key not in self.refs:
            if sc.kind.startswith("convert") and not sc.source(version).exists():
                make_source(sc, version)
            root = self.work / f"ref-{sc.kind}-{sc.size}-v{version}"
            out = run_child(self.ctx, sc, version, root, 0, None)
            if out.status != "ok":
                raise RuntimeError(f"clean {sc.kind} save failed: {out.status} {out.detail}")
            left = litter(root)
            if left:
                raise AssertionError(f"a clean {sc.kind} save left {left}")
            ver = Version(snapshot(root), fingerprint(sc.dest(root)), out.calls, out.seconds)
            self.refs[key] = (root, ver)
        return self.refs[key]

    def trial(self, sc: Scenario, tally: Tally) -> None:
        fresh = self.rng.random() < 0.2
        new_v = self.rng.choice((2, 3))
        _, new = self.reference(sc, new_v)
        root = Path(tempfile.mkdtemp(dir=self.work, prefix="t-"))
        old: Version | None = None
        if not fresh:
            old_root, old = self.reference(sc, 1)
            shutil.rmtree(root)
            shutil.copytree(old_root, root)
        if self.rng.random() < 0.6:
            kill_at, delay = self.rng.randint(1, new.calls + 1), None
        else:
            kill_at, delay = 0, self.rng.uniform(0, 1.2 * new.seconds)
        out = run_child(self.ctx, sc, new_v, root, kill_at, delay)
        if out.status == "error":
            raise RuntimeError(f"{sc.kind}: the save raised {out.detail}")
        state, detail = judge(sc, root, old, new)
        if out.status == "ok" and state != "new":
            state, detail = "LOST", f"a save that finished left {state} {detail}"
        how = f"k={kill_at}/{new.calls}" if delay is None else f"t={delay:.3f}s/{new.seconds:.3f}s"
        if out.status == "hang":
            tally.hangs.append(f"hang {sc.kind}/{sc.size} {how} fresh={fresh}")
        tally.trials[sc.kind] += 1
        tally.states[(sc.kind, state)] += 1
        if litter(root):
            tally.litter_kinds.add(sc.kind)
        if state != "LOST" and out.status != "ok" and self.rng.random() < 0.25:
            state, detail = self.save_again(sc, root, new_v, new)
            tally.resaves += 1
        if state == "LOST":
            tally.lost.append(f"LOST {sc.kind}/{sc.size} {how} fresh={fresh}: {detail}")
        shutil.rmtree(root, ignore_errors=True)

    def save_again(self, sc: Scenario, root: Path, version: int, new: Version) -> tuple[str, str]:
        """After a kill: a clean save must give the new version and leave no litter."""
        out = run_child(self.ctx, sc, version, root, 0, None)
        if out.status != "ok":
            return "LOST", f"the save after the kill: {out.status} {out.detail}"
        state, detail = judge(sc, root, None, new)
        left = litter(root)
        extra = sorted(set(snapshot(root)) - set(new.files))  # the previous version's files
        if state != "new" or left or extra:
            return "LOST", f"the save after the kill left {state} {detail} {left[:3]} {extra[:3]}"
        return state, ""


def run_trials(
    trials: int,
    kinds: tuple[str, ...] = KINDS,
    sizes: tuple[str, ...] = tuple(SIZES),
    seed: int = 0,
    work: Path | None = None,
    progress: bool = False,
    no_links: bool = False,
) -> Tally:
    """``trials`` kill-trials spread round-robin over ``kinds`` and random sizes."""
    own = work is None
    work = Path(tempfile.mkdtemp(prefix="tb-crash-")) if work is None else work
    h = Harness(work, seed)
    tally = Tally()
    lost = 0
    try:
        for i in range(trials):
            kind = kinds[i % len(kinds)]
            size = h.rng.choice(sizes if not kind.startswith("dcp-") else ("s", "m"))
            try:
                h.trial(Scenario(kind, size, work, no_links), tally)
            except KeyboardInterrupt:  # stopped by hand: report the trials finished
                if not progress:
                    raise
                break
            if progress and len(tally.lost) > lost:  # as it happens: a run cut short still tells
                print(tally.lost[-1], file=sys.stderr, flush=True)
            lost = len(tally.lost)
            if progress and (i + 1) % 10 == 0:
                print(
                    f"{i + 1} trials, {len(tally.lost)} lost, {len(tally.hangs)} hangs, "
                    f"{sum(tally.states[(k, 'uncommitted')] for k in KINDS)} uncommitted, "
                    f"{time.strftime('%H:%M:%S')}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)
    return tally


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=300)
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--sizes", default=",".join(SIZES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--no-links",
        action="store_true",
        help="saves run as on a filesystem without hard links (the copying commit)",
    )
    args = p.parse_args(argv)
    t = time.perf_counter()
    tally = run_trials(
        args.trials,
        tuple(args.kinds.split(",")),
        tuple(args.sizes.split(",")),
        args.seed,
        progress=True,
        no_links=args.no_links,
    )
    print(tally.report())
    print(f"litter left by killed runs in: {sorted(tally.litter_kinds)}")
    print(f"{time.perf_counter() - t:.0f} s")
    return 1 if tally.lost or tally.hangs else 0


if __name__ == "__main__":
    sys.exit(main())
