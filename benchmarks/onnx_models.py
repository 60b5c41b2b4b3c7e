"""Section: ONNX models' initializers against ``onnx.load`` + ``numpy_helper.to_array``.

Two models of the same 64 float32 initializers, one small (16 MiB; ``--quick``: 4 MiB)
and one large (2 GiB; ``--quick``: 128 MiB), their weights as external data in
``MODEL.onnx.data`` (written by ``tb.save``, read back by onnx itself):

1. open + first initializer, each model: ``tb.open(path)[first]`` vs ``onnx.load(path)``
   and ``to_array`` of the first (onnx loads every external tensor when it loads the
   model). Target: tensorbridge's time on the large model within 2x of the small one's
   (independent of size) and under 10 ms;
2. reading every initializer into memory of its own (``tb.load(path, mmap=False)``) vs
   ``onnx.load`` + ``to_array`` of each, GB/s on the large model. Target: >= 1x;
3. memory, each read in a fresh process (anonymous memory, the pages no page cache can
   give back): ``tb.load`` mapped (every page touched), ``tb.load(mmap=False)``, and
   onnx. Target: the mapped read a fraction of onnx's.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

import tensorbridge as tb

from .child import Task, touch
from .core import MIB, Context, Section, fmt_bytes, fmt_mib, fmt_pair, fmt_ratio, speedup

TITLE = "ONNX models: open, read-all and memory against onnx.load"

N_TENSORS = 64


def write_model(path: Path, total: int) -> Path:
    """A model of :data:`N_TENSORS` float32 initializers of ``total`` bytes, as external data."""
    rows = max(1, total // N_TENSORS // 4 // 1024)
    rng = np.random.default_rng(0)
    block = rng.standard_normal((rows, 1024), dtype=np.float32)
    tb.save({f"layers.{i}.weight": block for i in range(N_TENSORS)}, path, overwrite=True,
            progress=False)  # fmt: skip
    return path


def same(path: str) -> str:
    return path


def tb_first(path: str) -> float:
    with tb.open(path) as f:
        return float(f[f.keys()[0]].reshape(-1)[0])


def onnx_first(path: str) -> float:
    import onnx
    from onnx import numpy_helper

    m = onnx.load(path)
    return float(numpy_helper.to_array(m.graph.initializer[0], str(Path(path).parent))[0, 0])


def tb_read_all(path: str) -> dict[str, Any]:
    arrays = tb.load(path, mmap=False)
    return {"bytes": sum(a.nbytes for a in arrays.values()), "touched": touch(arrays.values())}


def tb_read_mapped(path: str) -> dict[str, Any]:
    arrays = tb.load(path)
    return {"bytes": sum(a.nbytes for a in arrays.values()), "touched": touch(arrays.values())}


def onnx_read_all(path: str) -> dict[str, Any]:
    import onnx
    from onnx import numpy_helper

    m = onnx.load(path)
    arrays = [numpy_helper.to_array(t, str(Path(path).parent)) for t in m.graph.initializer]
    return {"bytes": sum(a.nbytes for a in arrays), "touched": touch(arrays)}


def run(ctx: Context, sec: Section) -> None:
    small_bytes = ctx.pick(16 * MIB, 4 * MIB, 1 * MIB)
    large_bytes = ctx.pick(2048 * MIB, 128 * MIB, 4 * MIB)
    repeats = ctx.pick(5, 3, 1)
    sec.intro(
        f"""Two models of {N_TENSORS} float32 initializers as external data, written by
        `tb.save` ({fmt_mib(small_bytes)} and {fmt_mib(large_bytes)}), read by
        tensorbridge and by `onnx.load` + `numpy_helper.to_array` (onnx
        {_version()}). Times are min / median of {repeats} interleaved runs, the page
        cache warm; ratios are onnx's time / tensorbridge's (> 1: tensorbridge is
        faster). Memory rows run each read in a fresh process and report the growth of
        anonymous memory (what the page cache cannot give back) and of the resident set."""
    )
    if importlib.util.find_spec("onnx") is None:
        sec.text("*Skipped: the `onnx` package (`pip install tensorbridge[onnx]`) is absent.*")
        return
    small = write_model(ctx.scratch / "small.onnx", small_bytes)
    large = write_model(ctx.scratch / "large.onnx", large_bytes)
    try:
        _rows(ctx, sec, small, large, repeats)
    finally:
        for p in (small, large):
            p.unlink(missing_ok=True)
            p.with_name(p.name + ".data").unlink(missing_ok=True)


def _rows(ctx: Context, sec: Section, small: Path, large: Path, repeats: int) -> None:
    st = ctx.measure(
        {
            "tb small": lambda: tb_first(str(small)),
            "tb large": lambda: tb_first(str(large)),
            "onnx small": lambda: onnx_first(str(small)),
        },
        repeats=4 * repeats,
    )
    st |= ctx.measure({"onnx large": lambda: onnx_first(str(large))}, repeats=repeats)
    growth = st["tb large"].min / st["tb small"].min
    first = st["tb large"].min
    size = large.with_name(large.name + ".data").stat().st_size
    small_size = small.with_name(small.name + ".data").stat().st_size
    out: list[tuple[str, str, str, str]] = [
        (
            f"open + first initializer, {fmt_mib(small_size)} model, tb vs onnx",
            f"{fmt_pair(st['tb small'])} vs {fmt_pair(st['onnx small'])} = "
            f"{fmt_ratio(speedup(st['onnx small'], st['tb small']), 0)}x",
            "",
            "",
        ),
        (
            f"open + first initializer, {fmt_mib(size)} model, tb vs onnx",
            f"{fmt_pair(st['tb large'])} vs {fmt_pair(st['onnx large'])} = "
            f"{fmt_ratio(speedup(st['onnx large'], st['tb large']), 0)}x",
            "< 10 ms",
            ctx.check(sec, "ONNX open + first initializer < 10 ms", first < 0.010),
        ),
        (
            "tb's open + first on the large model / on the small one",
            f"{growth:.2f}x",
            "<= 2x (independent of size)",
            ctx.check(sec, "ONNX open + first independent of size", growth <= 2.0),
        ),
    ]
    reads = ctx.rounds(
        {
            "tb": Task(same, tb_read_all, (str(large),)),
            "tb mapped": Task(same, tb_read_mapped, (str(large),)),
            "onnx": Task(same, onnx_read_all, (str(large),)),
        },
        repeats,
    )
    best = {k: min(r.seconds for r in runs) for k, runs in reads.items()}
    anon = {k: min(r.anon_growth for r in runs) for k, runs in reads.items()}
    rss = {k: min(r.rss_growth for r in runs) for k, runs in reads.items()}
    ratio = best["onnx"] / best["tb"]
    out.append(
        (
            f"read every initializer into owned memory, {fmt_mib(size)}: tb.load(mmap=False) "
            "vs onnx.load + to_array",
            f"{size / best['tb'] / 1e9:.2f} vs {size / best['onnx'] / 1e9:.2f} GB/s = {ratio:.2f}x",
            ">= 1x",
            ctx.check(sec, "ONNX read-all >= 1x onnx.load + to_array", ratio >= 1.0),
        )
    )
    for key, what in (("tb mapped", "tb.load (mapped, every page touched)"),
                      ("tb", "tb.load(mmap=False)"), ("onnx", "onnx.load + to_array")):  # fmt: skip
        out.append(
            (
                f"memory growth reading all, {what}",
                f"anon {fmt_bytes(anon[key])}, resident {fmt_bytes(rss[key])} "
                f"({anon[key] / size:.2f}x the weights)",
                "a fraction of onnx's" if key == "tb mapped" else "",
                ctx.check(sec, "ONNX mapped read's memory < 0.25x onnx's",
                          anon[key] < 0.25 * anon["onnx"]) if key == "tb mapped" else "",
            )
        )  # fmt: skip
    sec.table(["measurement", "result", "target", "met"], out)
    ctx.highlight(
        f"**ONNX**: open + first initializer of a {fmt_mib(size)} model in {first * 1e3:.2f} ms "
        f"({growth:.2f}x the small model's); reading every initializer at {ratio:.2f}x "
        "onnx.load + to_array, mapped in "
        f"{anon['tb mapped'] / max(1, anon['onnx']):.2f}x its anonymous memory."
    )


def _version() -> str:
    try:
        import onnx

        return str(onnx.__version__)
    except ImportError:
        return "absent"
