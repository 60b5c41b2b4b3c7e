"""Section: HDF5 files against h5py's own reads (issue 30's rows).

On one HDF5 file of 16 float32 datasets (1 GiB; ``--quick``: 64 MiB) written by h5py
(``f[name] = array``: contiguous, the layout Keras and most writers leave):

1. open + first dataset: ``tb.open(path)[first]`` vs ``h5py.File(path)[first][()]``,
   the page cache warm for both. Target: under 10 ms;
2. read every dataset, every page touched, each run in a fresh child process with its
   memory sampled: ``tb.load`` (memory-mapped views) and ``tb.load(mmap=False)`` vs
   ``{name: f[name][()]}``. Targets: at least 1x h5py's speed mapped, 0.9x owned, and
   the mapped read's anonymous memory growth under 64 MiB (h5py's is the file's size);
3. the same read of a chunked copy (read through h5py by both): at least 0.9x;
4. ``tb.save`` of the state dict vs h5py writing it (both fsynced), for reference.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

import tensorbridge as tb

from .child import ChildRun, Task, fsync, touch
from .core import MIB, Context, Section, fmt_mib, fmt_pair, fmt_ratio, speedup

TITLE = "HDF5: open, mapped reads and writes against h5py"

N_TENSORS = 16


def _best(runs: list[ChildRun]) -> ChildRun:
    return min(runs, key=lambda r: r.seconds)


# --- what the child processes run -------------------------------------------------------------


def ready(path: str) -> str:
    """Import h5py and the reader before the step, so neither import is timed."""
    import h5py  # noqa: F401

    import tensorbridge.io.hdf5  # noqa: F401

    return path


def arrays(per: int, path: str) -> tuple[dict[str, np.ndarray], str]:
    """The float32 state dict (``per`` elements a tensor) and where it goes."""
    import h5py  # noqa: F401 - imported before the step

    base = np.random.default_rng(0).standard_normal(per, dtype=np.float32)
    return {f"layers/{i}/weight": base.copy() for i in range(N_TENSORS)}, path


def tb_load_mapped(path: str) -> dict[str, int]:
    return {"touched": touch(tb.load(path).values())}


def tb_load_owned(path: str) -> dict[str, int]:
    return {"touched": touch(tb.load(path, mmap=False).values())}


def h5py_load(path: str) -> dict[str, int]:
    import h5py

    out: dict[str, Any] = {}

    def read(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset):
            out[name] = obj[()]

    with h5py.File(path, "r") as f:
        f.visititems(read)
    return {"touched": touch(out.values())}


def tb_save(inputs: tuple[dict[str, np.ndarray], str]) -> None:
    sd, path = inputs
    tb.save(sd, path, progress=False, overwrite=True)  # fsyncs: part of its atomic write


def h5py_save(inputs: tuple[dict[str, np.ndarray], str]) -> None:
    import h5py

    sd, path = inputs
    with h5py.File(path, "w") as f:
        for name, a in sd.items():
            f[name] = a
    fsync(path)


# --- the section -------------------------------------------------------------------------------


def _write(path: Path, per: int, chunks: bool) -> None:
    import h5py

    base = np.random.default_rng(0).standard_normal(per, dtype=np.float32)
    with h5py.File(path, "w") as f:
        for i in range(N_TENSORS):
            if chunks:
                f.create_dataset(f"layers/{i}/weight", data=base, chunks=(min(per, 1 << 18),))
            else:
                f[f"layers/{i}/weight"] = base


def _open_first(ctx: Context, sec: Section, path: Path, repeats: int) -> tuple[str, ...]:
    import h5py

    first = "layers/0/weight"

    def ours() -> Any:
        with tb.open(path) as f:
            return f[first]

    def theirs() -> Any:
        with h5py.File(path, "r") as f:
            return f[first][()]

    st = ctx.measure({"tb": ours, "h5py": theirs}, repeats=repeats)
    return (
        f"open + first dataset of a {fmt_mib(path.stat().st_size)} file, tb vs h5py ds[()]",
        f"{fmt_pair(st['tb'])} vs {fmt_pair(st['h5py'])} = "
        f"{fmt_ratio(speedup(st['h5py'], st['tb']))}x",
        "< 10 ms",
        ctx.check(sec, "HDF5 open + first dataset < 10 ms", st["tb"].min < 0.010),
    )


def run(ctx: Context, sec: Section) -> None:
    total = ctx.pick(1 << 30, 64 * MIB, 16 * MIB)
    repeats = ctx.pick(5, 1, 1)  # a fresh process's first touch of 1 GiB varies 2x here
    sec.intro(
        f"""{N_TENSORS} float32 datasets, {fmt_mib(total)} in all, written by h5py; reads
        and saves best of {repeats}, each in a fresh child process, every page of every
        array touched. Ratios are h5py's time / tensorbridge's (> 1: tensorbridge is
        faster)."""
    )
    if importlib.util.find_spec("h5py") is None:
        sec.text("*Skipped: h5py (`pip install tensorbridge[hdf5]`) is absent.*")
        return
    per = total // N_TENSORS // 4
    plain, chunked = ctx.scratch / "plain.h5", ctx.scratch / "chunked.h5"
    _write(plain, per, chunks=False)
    _write(chunked, per, chunks=True)
    rows: list[tuple[str, ...]] = [_open_first(ctx, sec, plain, ctx.pick(20, 5, 2))]
    gb = total / 1e9
    loads = ctx.rounds(
        {
            "tb.load (mmap)": Task(ready, tb_load_mapped, (str(plain),)),
            "tb.load (mmap=False)": Task(ready, tb_load_owned, (str(plain),)),
            "h5py ds[()]": Task(ready, h5py_load, (str(plain),)),
            "tb.load (chunked)": Task(ready, tb_load_mapped, (str(chunked),)),
            "h5py ds[()] (chunked)": Task(ready, h5py_load, (str(chunked),)),
        },
        repeats,
    )
    best = {k: _best(v) for k, v in loads.items()}
    for ours_k, theirs_k, target in (
        ("tb.load (mmap)", "h5py ds[()]", 1.0),
        ("tb.load (mmap=False)", "h5py ds[()]", 0.9),
        ("tb.load (chunked)", "h5py ds[()] (chunked)", 0.9),
    ):
        ratio = best[theirs_k].seconds / best[ours_k].seconds
        rows.append(
            (
                f"read all: {ours_k} vs {theirs_k}",
                f"{gb / best[ours_k].seconds:.2f} vs {gb / best[theirs_k].seconds:.2f} GB/s "
                f"= {ratio:.2f}x",
                f">= {target}x",
                ctx.check(sec, f"HDF5 read all: {ours_k} >= {target}x h5py", ratio >= target),
            )
        )
    mapped = best["tb.load (mmap)"].anon_growth
    rows.append(
        (
            "  anonymous-memory growth: tb.load (mmap) / (mmap=False) / h5py",
            f"{fmt_mib(mapped)} / {fmt_mib(best['tb.load (mmap=False)'].anon_growth)} / "
            f"{fmt_mib(best['h5py ds[()]'].anon_growth)}",
            "mapped <= 64 MiB",
            ctx.check(sec, "HDF5 mapped read growth <= 64 MiB", mapped <= 64 * MIB),
        )
    )
    chunked.unlink()
    ours, theirs = str(ctx.scratch / "ours.h5"), str(ctx.scratch / "theirs.h5")
    saves = ctx.rounds(
        {"tb": Task(arrays, tb_save, (per, ours)), "h5py": Task(arrays, h5py_save, (per, theirs))},
        repeats,
    )
    a, b = _best(saves["tb"]), _best(saves["h5py"])
    rows.append(
        (
            f"save {fmt_mib(total)} f32: tb.save vs h5py (both fsynced); anonymous growth",
            f"{gb / a.seconds:.2f} vs {gb / b.seconds:.2f} GB/s = {b.seconds / a.seconds:.2f}x; "
            f"{fmt_mib(a.anon_growth)} vs {fmt_mib(b.anon_growth)}",
            "",
            "",
        )
    )
    for p in (plain, Path(ours), Path(theirs)):
        p.unlink(missing_ok=True)
    sec.table(["measurement", "result", "target", "result"], rows)
    ratio = best["h5py ds[()]"].seconds / best["tb.load (mmap)"].seconds
    ctx.highlight(
        f"**HDF5**: a {fmt_mib(total)} file read whole, every page touched, at {ratio:.2f}x "
        f"h5py's `ds[()]` speed, mapped, with {fmt_mib(mapped)} of anonymous memory."
    )
