"""Chunked checkpoints written out in flat memory: each tensor assembled into its final place.

A DCP checkpoint stores each tensor as boxes (one per rank's shard). Converting it
(``tb.save(tb.open(dcp_dir), out)``, ``tensorbridge convert``) runs in three steps:

1. **Plan.** Every output file's layout is fixed from names, dtypes and shapes alone:
   safetensors headers and offsets exactly as :func:`tensorbridge.io.safetensors.save`
   lays them out (so the bytes are the same), or one ``.npy`` header per tensor.
2. **Fill.** The outputs are preallocated as temporary files beside their final
   names. Each tensor is then one independent task: it walks its output in windows
   of at most ``window`` bytes (64 MiB) in C order, copies the overlapping part of
   every stored chunk into the window with NumPy strided copies (the chunks are
   read-only views of the memory-mapped ``.distcp`` files, whose pages are dropped
   once copied), casts it when ``float_dtype`` asks, and writes it with one
   positioned write at its offset. Peak memory is the window (twice it when
   casting), whatever the size of a tensor, a shard or the model.
3. **Commit.** Each file is fsynced by whoever wrote it, renamed into place, and the
   shard index written last (temporary file, fsync, rename): an interrupted
   conversion leaves temporary files, never a checkpoint that looks complete.

Tasks run serially by default. Any :class:`concurrent.futures.Executor` runs them
instead (a ``ProcessPoolExecutor``, or a ``dask.distributed`` client's
``get_executor()`` with the source and destination on a shared filesystem): a task
names the checkpoint by path and reopens it in its own process, and writes only its
own byte ranges, so the output is byte-identical to a serial run.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .. import _memory as mem
from .._atomic import destination_errors, fsync_dir, fsync_file, remove_temps
from .._chunks import DEFAULT_CHUNK, releaser
from .._commit import commit_files
from .._locks import Claim, commit_lock
from .._progress import progress_bar
from .._tensorfile import cast_target
from ..dtypes import DTypeLike, DTypeRow, resolve_dtype
from ..errors import FormatError
from ._formats import FORMATS, Format, Layout, PlannedFile, StoreLayout, by_name
from .dcp import Chunk, DcpFile

__all__ = ["WINDOW", "Placement", "Task", "run", "save", "windows"]

WINDOW = DEFAULT_CHUNK  # 64 MiB: the most bytes of one tensor held at once
SLAB = 8 << 20  # mapped source bytes copied between two page releases
TASK_BYTES = 256 << 20  # small tensors are batched into tasks of about this many bytes


@dataclass(frozen=True)
class Placement:
    """Where one tensor's bytes go: a (temporary) file and the offset of its first byte."""

    name: str
    file: str
    offset: int
    dtype: str  # the stored dtype row's name (after float_dtype)
    nbytes: int
    # the module whose ``open_region`` opens ``file`` as an array (written by box), a
    # store format's (``StoreLayout``); empty: ``file`` is a byte file
    region: str = ""


@dataclass(frozen=True)
class Task:
    """Tensors to write, independent of every other task: what an executor runs."""

    source: str  # the checkpoint, reopened by path in the task's process
    items: tuple[Placement, ...]
    window: int = WINDOW
    versions: tuple[tuple[str, tuple[int, ...]], ...] = ()  # its data files when opened


# --- one tensor, window by window -------------------------------------------------------------


class Window(NamedTuple):
    """One window of a tensor: a box of it that is contiguous in C order, and its values."""

    start: tuple[int, ...]  # the box's first index
    size: tuple[int, ...]  # the box's shape
    offset: int  # of its first byte in the tensor's C-order bytes
    values: np.ndarray  # flat, the stored dtype (a reused buffer)

    @property
    def data(self) -> memoryview:
        """The values' bytes, as written to a file."""
        return self.values.view(np.uint8).data


def windows(
    shape: tuple[int, ...],
    src: DTypeRow,
    dst: DTypeRow,
    chunks: Sequence[tuple[Chunk, np.ndarray]],
    window: int = WINDOW,
) -> Iterator[Window]:
    """The tensor's values as ``dst``, in C order, one :class:`Window` at a time.

    A window is a box of the global tensor that is contiguous in C order: a run of
    indices along one dimension with every later dimension whole (the first
    dimension from the left whose trailing block fits). Each stored chunk that
    overlaps it is copied in with one strided ``np.copyto``. A window's values are
    valid until the next one is asked for (the buffers are reused).

    >>> import numpy as np, tensorbridge as tb
    >>> from tensorbridge.io.dcp import Chunk
    >>> f32 = tb.resolve_dtype("f32")
    >>> a, b = np.arange(4.0, dtype=np.float32).reshape(2, 2), np.zeros((2, 1), np.float32)
    >>> parts = [(Chunk((0, 0), (2, 2), "", 0, 0), a), (Chunk((0, 2), (2, 1), "", 0, 0), b)]
    >>> [(w.offset, w.values.tolist()) for w in windows((2, 3), f32, f32, parts)]
    [(0, [0.0, 1.0, 0.0, 2.0, 3.0, 0.0])]
    """
    total = math.prod(shape)
    if total == 0:
        return
    cast = dst is not src
    per = src.itemsize + (dst.itemsize if cast else 0)
    cap = max(1, window // per)  # elements in one window
    tail = [1] * (len(shape) + 1)  # tail[k]: elements of one index of dims [0, k)
    for k in range(len(shape) - 1, -1, -1):
        tail[k] = tail[k + 1] * shape[k]
    k = next(k for k in range(len(shape) + 1) if tail[k] <= cap)
    buf = np.empty(min(total, cap if k else total), src.numpy)
    out = np.empty(buf.size, dst.numpy) if cast else None
    frees = [(c, a, releaser(a)) for c, a in chunks if a.size]
    if k == 0:
        boxes: Iterator[tuple[tuple[int, ...], tuple[int, ...]]] = iter(
            [((0,) * len(shape), shape)]
        )
    else:
        d, rows = k - 1, max(1, cap // tail[k])
        boxes = (
            ((*prefix, r), (*(1,) * d, min(rows, shape[d] - r), *shape[k:]))
            for prefix in np.ndindex(*shape[:d])
            for r in range(0, shape[d], rows)
        )
    for start, size in boxes:
        start = start + (0,) * (len(shape) - len(start))
        count = math.prod(size)
        box = buf[:count].reshape(size)
        for c, a, release in frees:
            lo = [max(s, o) for s, o in zip(start, c.offsets, strict=True)]
            hi = [
                min(s + n, o + m)
                for s, n, o, m in zip(start, size, c.offsets, c.shape, strict=True)
            ]
            if any(h <= low for low, h in zip(lo, hi, strict=True)):
                continue
            take = tuple(slice(x - o, y - o) for x, y, o in zip(lo, hi, c.offsets, strict=True))
            into = tuple(slice(x - s, y - s) for x, y, s in zip(lo, hi, start, strict=True))
            piece = a[take] if take else a  # a 0-d chunk: the array itself, not a scalar
            part = box[into] if into else box
            if piece.ndim == 0:
                np.copyto(part, piece)
                continue
            # in slabs, each slab's mapped pages dropped once copied: a window's worth
            # of mapped source never sits in memory beside the window
            step = max(1, SLAB // max(1, piece[0].nbytes))
            for r in range(0, piece.shape[0], step):
                np.copyto(part[r : r + step], piece[r : r + step])
                release(piece[r : r + step])
        if out is None:
            data = box.reshape(-1)
        else:
            data = out[:count]
            mem.as_tensor(data, dst).copy_(mem.reader(box.reshape(-1), src))
        flat = sum(i * tail[j + 1] for j, i in enumerate(start))
        yield Window(start, size, flat * dst.itemsize, data)


def write_tensor(f: DcpFile, p: Placement, window: int = WINDOW, bar: Any = None) -> int:
    """Fill ``p.file`` at ``p.offset`` with tensor ``p.name`` of ``f``; the bytes written."""
    src, shape = f.info(p.name)
    dst = resolve_dtype(p.dtype)
    chunks = [(c, f.chunk_array(p.name, c)) for c in f.chunks(p.name)]
    written = 0
    if p.region:  # one task owns the whole array: no other writer shares its chunks
        array = importlib.import_module(p.region).open_region(p.file)
        for w in windows(shape, src, dst, chunks, window):
            box = tuple(slice(s, s + n) for s, n in zip(w.start, w.size, strict=True))
            array[box] = w.values.reshape(w.size)
            written += w.values.nbytes
            if bar is not None:
                bar.update(w.values.nbytes)
        return written
    fd = os.open(p.file, os.O_WRONLY | getattr(os, "O_BINARY", 0))
    try:
        for w in windows(shape, src, dst, chunks, window):
            data = w.data
            _pwrite(fd, data, p.offset + w.offset)
            written += len(data)
            if bar is not None:
                bar.update(len(data))
    finally:
        os.close(fd)
    if written != p.nbytes:
        raise FormatError(f"tensor {p.name!r}: wrote {written} bytes where {p.nbytes} were planned")
    return written


def _pwrite(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], offset + done)


# a worker process keeps its checkpoints open between tasks, one handle a version
_OPEN: dict[tuple[str, tuple[tuple[str, tuple[int, ...]], ...]], DcpFile] = {}


def run(task: Task) -> int:
    """Run one task (in whatever process an executor chose); the bytes written.

    Each file it wrote to is fsynced before it returns, so the coordinator may
    commit once every task has reported.
    """
    key = (task.source, task.versions)
    f = _OPEN.get(key)
    if f is None:
        f = DcpFile(task.source)
        if task.versions and f.file_versions() != dict(task.versions):
            f.close()  # the checkpoint the coordinator opened was replaced since
            raise FormatError(
                f"{task.source} was replaced since it was opened (another save committed a "
                "new version); open it again and convert again"
            )
        _OPEN[key] = f
    total = 0
    for p in task.items:
        total += write_tensor(f, p, task.window)
    for file in sorted({p.file for p in task.items if not p.region}):
        fsync_file(file)  # a store's arrays are fsynced by its commit
    return total


# --- planning and committing -----------------------------------------------------------------


def save(
    f: DcpFile,
    path: str | os.PathLike[str],
    *,
    fmt: str | Format = "safetensors",
    keys: Sequence[str] | None = None,
    float_dtype: DTypeLike | None = None,
    metadata: Mapping[str, Any] | None = None,
    max_shard_size: int | str | None = None,
    index: bool = True,
    executor: Executor | None = None,
    progress: bool | None = None,
    window: int = WINDOW,
) -> list[Path]:
    """Write ``f``'s tensors (or ``keys``) to ``path`` in flat memory; the files written.

    ``fmt`` is a format (a row or its name) that ``assembles``; its module's
    ``assembly`` lays the output out. ``fmt="safetensors"``: ``path`` is the
    ``.safetensors`` file whose stem names the shards (``model.safetensors`` ->
    ``model-00001-of-0000N.safetensors`` and ``model.safetensors.index.json``, the
    Hugging Face layout; ``index=False`` writes one file when everything fits).
    ``fmt="npy"``: ``path`` is a directory that gets ``NAME.npy`` per tensor. Replaces
    existing files of the same names (``tb.save`` asks first). ``fmt="zarr"``: ``path``
    is a Zarr v3 store, one uncompressed array per tensor, committed by the group's
    ``zarr.json`` (plain values become its attributes).

    Raises:
        UnsupportedDtypeError: a dtype the format cannot hold.
        FormatError: a tensor whose chunks do not tile it, or a truncated ``.distcp``;
            a format that is no target of a chunked checkpoint.
    """
    row = target_format(fmt)
    skipped = f.unsupported()
    names = [n for n in f if n not in skipped] if keys is None else list(keys)
    for n in names:
        f.chunks(n)  # every chunk list checked before a byte is written
    rows = {n: cast_target(f.info(n)[0], float_dtype) for n in names}
    target = Path(path).absolute()  # tasks may run in processes with another working dir
    plan = row.assembly(
        [(n, rows[n], f.info(n)[1]) for n in names],
        target,
        metadata=metadata,
        max_shard_size=max_shard_size,
        index=index,
    )
    if isinstance(plan, StoreLayout):
        return _save_store(f, plan, rows, target, executor, progress, window)
    return _save_files(f, plan, rows, target, executor, progress, window)


def _save_files(
    f: DcpFile,
    plan: Layout,
    rows: Mapping[str, DTypeRow],
    target: Path,
    executor: Executor | None,
    progress: bool | None,
    window: int,
) -> list[Path]:
    """A layout of byte files (safetensors shards and their index, ``.npy`` files):
    each preallocated beside its destination, filled window by window, then committed
    (with the index, as one) or renamed into place; a failed save removes what it made.
    Returns the files written."""
    temps: dict[Path, str] = {}
    made = plan.creates  # the directory this save creates
    claims: dict[Path, Claim] = {}  # this save's claims on its temporaries' directories
    try:
        for out in plan.files:
            with destination_errors(out.path, only_destination=True):
                out.path.parent.mkdir(parents=True, exist_ok=True)
                claim = claims.get(out.path.parent) or Claim(out.path.parent)
                claims[out.path.parent] = claim
                temps[out.path] = _preallocate(out, claim)
        items = [
            Placement(n, temps[final], off, rows[n].name, nbytes)
            for n, final, off, nbytes in plan.placements
        ]
        with destination_errors(target):
            _fill(f, items, executor, window, progress, target.name)
        if plan.index is not None:  # the files and their index, committed together
            files = {final.name: Path(tmp) for final, tmp in temps.items()}
            temps.clear()  # the commit owns them now
            index_name, index_bytes = plan.index
            with destination_errors(plan.directory):
                commit_files(plan.directory, files, index_name, index_bytes, plan.replaces or ())
        plan.directory.mkdir(parents=True, exist_ok=True)
        with commit_lock(plan.directory):
            for final, tmp in temps.items():  # every file of one save, or of the other
                with destination_errors(final, tmp):
                    os.replace(tmp, final)
                remove_temps(final)
            temps.clear()
            if plan.after is not None:
                plan.after()
            fsync_dir(plan.directory)
    except BaseException:
        if made:  # a failed save leaves no empty directory behind
            for tmp in temps.values():
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            temps.clear()
            for claim in claims.values():  # its lock file goes too
                claim.release()
            with contextlib.suppress(OSError):
                target.rmdir()
        raise
    finally:
        for tmp in temps.values():
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        for claim in claims.values():
            claim.release()
    written = [out.path for out in plan.files]
    if plan.index is not None:
        written.append(plan.directory / plan.index[0])
    fsync_dir(plan.directory)
    return written


def target_format(fmt: str | Format) -> Format:
    """The row ``fmt`` names, which must be a target of a chunked checkpoint's conversion.

    Raises:
        FormatError: no such format, or one that is no target.
    """
    try:
        row = fmt if isinstance(fmt, Format) else by_name(fmt)
    except KeyError:
        row = None
    if row is None or not row.assembles:
        targets = " or ".join(f.name for f in FORMATS if f.assembles)
        raise FormatError(f"a chunked checkpoint converts to {targets}, not {fmt}")
    return row


def _fill(
    f: DcpFile,
    items: list[Placement],
    executor: Executor | None,
    window: int,
    progress: bool | None,
    label: str,
) -> None:
    """Write every placement: here, one after the other, or as tasks on ``executor``."""
    bar = progress_bar(
        sum(p.nbytes for p in items), f"saving {label}", progress, tensors=len(items)
    )
    try:
        if executor is None:
            for p in items:
                write_tensor(f, p, window, bar)
            for file in sorted({p.file for p in items if not p.region}):
                fsync_file(file)
        else:
            versions = tuple(sorted(f.file_versions().items()))
            tasks = _batch(str(f.path.absolute()), items, window, versions)
            for done in executor.map(run, tasks):
                bar.update(done)
    finally:
        bar.close()


def _save_store(
    f: DcpFile,
    plan: StoreLayout,
    rows: dict[str, DTypeRow],
    target: Path,
    executor: Executor | None,
    progress: bool | None,
    window: int,
) -> list[Path]:
    """Fill a staged store's arrays, then publish it (abandoned if anything fails)."""
    try:
        with destination_errors(target):  # a full disk, a file size limit
            items = [
                Placement(n, file, 0, rows[n].name, nbytes, region=plan.region_module)
                for n, file, nbytes in plan.placements
            ]
            _fill(f, items, executor, window, progress, target.name)
        plan.publish()
    except BaseException:
        plan.abandon()
        raise
    return list(plan.written)


_SAFE_NAME = re.compile(r"[^/\\\x00]+")


def _preallocate(out: PlannedFile, claim: Claim) -> str:
    """A temporary file beside ``out.path`` holding its header, extended to its size;
    its name carries the token of this save's ``claim``."""
    tmp = str(claim.temp(out.path))
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        _pwrite(fd, memoryview(out.header), 0)
        os.ftruncate(fd, out.size)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


def _batch(
    source: str,
    items: list[Placement],
    window: int,
    versions: tuple[tuple[str, tuple[int, ...]], ...] = (),
) -> list[Task]:
    """One task per large tensor; small ones grouped to about ``TASK_BYTES``."""
    tasks: list[Task] = []
    group: list[Placement] = []
    size = 0
    for p in items:
        if group and size + p.nbytes > TASK_BYTES:
            tasks.append(Task(source, tuple(group), window, versions))
            group, size = [], 0
        group.append(p)
        size += p.nbytes
    if group:
        tasks.append(Task(source, tuple(group), window, versions))
    return tasks
