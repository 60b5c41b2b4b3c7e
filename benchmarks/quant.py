"""Section: quantized weights, dequantized — tensorbridge against each scheme's reference.

Two tables. **Throughput**: one weight per scheme, dequantized to bf16 by
``tb.dequantize`` and by the reference implementation on the same codes and scales
(transformers' fp8 block-wise and gpt-oss code, torchao's MX and NVFP4 tensors,
compressed-tensors' decompressors), in one process, interleaved; elements per second
and whether the two agree bit for bit. **Streaming**: a synthetic fp8 block-wise
checkpoint converted to bf16 safetensors — tensorbridge's stream (a block row at a
time), the naive route (load everything, dequantize with transformers' code, save),
and a raw sequential write of the output's bytes — each in a child process whose
anonymous memory is sampled from outside.

``python -m benchmarks --section quant`` (``--quick`` for a fast smoke run).
"""

from __future__ import annotations

import importlib
import json
import shutil
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import tensorbridge as tb

from .child import ChildRun, Task, fsync, raw_buffer, raw_write
from .core import Context, Section, fmt_bytes, fmt_count, fmt_ratio, speedup

TITLE = "Quantized weights: dequantize throughput and streamed conversion"
MIB, GIB = 1 << 20, 1 << 30


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _bits(x: torch.Tensor) -> np.ndarray:
    a: np.ndarray = tb.to_numpy(x.contiguous())
    return a.view(np.uint8)


def _cases(
    rows: int, cols: int
) -> list[tuple[str, str, Callable[[], Any], Callable[[], Any] | None]]:
    """(scheme, reference name, ours, reference) on the same codes and scales."""
    torch.manual_seed(0)
    w = torch.randn(rows, cols)
    out: list[tuple[str, str, Callable[[], Any], Callable[[], Any] | None]] = []
    fg = _module("transformers.integrations.finegrained_fp8")
    q = tb.quantize(w, "fp8-block")
    c, s = q["weight"], q["weight_scale_inv"]
    out.append((
        "fp8-block",
        "transformers Fp8Dequantize",
        lambda: tb.dequantize(c, s, scheme="fp8-block", block_size=(128, 128)),
        (lambda: fg.Fp8Dequantize(None)._dequantize_one(c, s, torch.bfloat16)) if fg else None,
    ))  # fmt: skip
    ctf = _module("compressed_tensors.quantization.lifecycle.forward")
    ctq = _module("compressed_tensors.quantization")
    ch_scale = w.abs().amax(dim=1, keepdim=True) / 448
    ch_codes = (w / ch_scale).to(torch.float8_e4m3fn)
    ch_ref = None
    if ctf and ctq:
        args = ctq.QuantizationArgs(num_bits=8, type="float", strategy="channel")
        ch_ref = lambda: ctf.dequantize(ch_codes, ch_scale, args=args).to(torch.bfloat16)  # noqa: E731
    out.append((
        "fp8 (per channel)",
        "compressed-tensors dequantize",
        lambda: tb.dequantize(ch_codes, ch_scale, scheme="fp8"),
        ch_ref,
    ))  # fmt: skip
    mx = _module("torchao.prototype.mx_formats.mx_tensor")
    for scheme, elem in (("mxfp8", torch.float8_e4m3fn), ("mxfp4", torch.float4_e2m1fn_x2)):
        qm = tb.quantize(w, scheme)
        codes, scale = qm["weight"], qm["weight_scale"]
        out.append((scheme, "torchao MX to_dtype", _ours_mx(codes, scale, scheme),
                    _torchao_mx(mx, codes, scale, elem) if mx else None))  # fmt: skip
    mref = _module("transformers.integrations.mxfp4")
    experts = max(1, rows // 1024)
    e = torch.randn(experts, cols, rows // experts)
    g = tb.quantize(e, "mxfp4", layout="gpt-oss", name="p")
    blocks, scales = g["p_blocks"], g["p_scales"]
    out.append((
        "mxfp4 (gpt-oss)",
        "transformers convert_moe_packed_tensors",
        lambda: tb.dequantize(blocks, scales, scheme="mxfp4", layout="gpt-oss"),
        (lambda: mref.convert_moe_packed_tensors(blocks, scales, dtype=torch.bfloat16))
        if mref else None,
    ))  # fmt: skip
    nv = _module("torchao.prototype.mx_formats.nvfp4_tensor")
    mo = tb.quantize(w, "nvfp4-modelopt")
    nv_ref = None
    if nv:
        t = nv.NVFP4Tensor(
            mo["weight"],
            mo["weight_scale"],
            16,
            torch.bfloat16,
            per_tensor_scale=mo["weight_scale_2"],
        )
        nv_ref = lambda: t.dequantize(torch.bfloat16)  # noqa: E731
    out.append((
        "nvfp4-modelopt",
        "torchao NVFP4Tensor.dequantize",
        lambda: tb.dequantize(mo["weight"], mo["weight_scale"], global_scale=mo["weight_scale_2"],
                              scheme="nvfp4-modelopt"),
        nv_ref,
    ))  # fmt: skip
    ctn = _module("compressed_tensors.compressors.nvfp4.base")
    ct = tb.quantize(w, "nvfp4-compressed-tensors")
    ct_ref = None
    if ctn and ctq:
        scheme_ct = ctq.preset_name_to_scheme("NVFP4", ["Linear"])
        ct_ref = lambda: ctn.NVFP4PackedCompressor.decompress(dict(ct), scheme_ct)["weight"]  # noqa: E731
    out.append((
        "nvfp4-compressed-tensors",
        "compressed-tensors NVFP4PackedCompressor",
        lambda: tb.dequantize(ct["weight_packed"], ct["weight_scale"],
                              global_scale=ct["weight_global_scale"], scheme="nvfp4-ct"),
        ct_ref,
    ))  # fmt: skip
    ctp = _module("compressed_tensors.compressors.pack_quantized.base")
    if ctp and ctq:
        args4 = ctq.QuantizationArgs(num_bits=4, type="int", strategy="group", group_size=128)
        sch = ctq.QuantizationScheme(targets=["Linear"], weights=args4)
        wb = w.bfloat16()
        sc = (wb.float().reshape(rows, -1, 128).abs().amax(-1) / 7).bfloat16()
        packed = ctp.PackedQuantizationCompressor.compress({"weight": wb, "weight_scale": sc}, sch)
        pk, pscale = packed["weight_packed"], packed["weight_scale"]
        out.append((
            "pack-quantized (int4)",
            "compressed-tensors PackedQuantizationCompressor",
            lambda: tb.dequantize(pk, pscale, scheme="pack-quantized", group_size=128),
            lambda: ctp.PackedQuantizationCompressor.decompress(dict(packed), sch)["weight"],
        ))  # fmt: skip
    return out


def _ours_mx(codes: torch.Tensor, scale: torch.Tensor, scheme: str) -> Callable[[], Any]:
    return lambda: tb.dequantize(codes, scale, scheme=scheme)


def _torchao_mx(mx: Any, codes: torch.Tensor, scale: torch.Tensor, elem: Any) -> Callable[[], Any]:
    return lambda: mx.to_dtype(codes, scale, elem, 32, torch.bfloat16)


# --- the streaming rows, run in child processes -----------------------------------------------


def write_checkpoint(directory: str, nbytes: int) -> None:
    """A DeepSeek-V3-like fp8 block-wise checkpoint of about ``nbytes`` of codes."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    rows, cols = (4096 if nbytes >= 256 * MIB else 1024), 7168
    count = max(1, nbytes // (rows * cols))
    g = torch.Generator().manual_seed(0)
    sd: dict[str, torch.Tensor] = {}
    for i in range(count):
        codes = torch.randint(0, 0x7E, (rows, cols), dtype=torch.uint8, generator=g)
        sd[f"model.layers.{i}.mlp.up_proj.weight"] = codes.view(torch.float8_e4m3fn)
        scale = torch.rand(rows // 128, cols // 128, generator=g)
        sd[f"model.layers.{i}.mlp.up_proj.weight_scale_inv"] = scale
    tb.save(sd, d / "model.safetensors.index.json", max_shard_size=2 * GIB, overwrite=True)
    config = {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    (d / "config.json").write_text(json.dumps(config))


def open_source(src: str, dst: str, nbytes: int) -> tuple[str, str, int]:
    return src, dst, nbytes


def tb_stream(inputs: tuple[str, str, int]) -> None:
    src, dst, _ = inputs
    with tb.open(src, dequantize="bf16") as f:
        tb.save(f, dst, progress=False, overwrite=True)


def _naive_absent() -> str:
    """Which of the naive route's references are not installed ("`transformers` is"), or ""."""
    needed = ("transformers.integrations.finegrained_fp8", "safetensors.torch")
    missing = [f"`{name.split('.')[0]}`" for name in needed if _module(name) is None]
    if not missing:
        return ""
    return " and ".join(missing) + (" is" if len(missing) == 1 else " are")


def naive(inputs: tuple[str, str, int]) -> None:
    """Load everything, dequantize with transformers' code (float32, then bf16), save."""
    from safetensors.torch import load_file, save_file

    fg: Any = importlib.import_module("transformers.integrations.finegrained_fp8")

    src, dst, _ = inputs
    sd: dict[str, torch.Tensor] = {}
    for shard in sorted(Path(src).glob("model-*.safetensors")):
        sd.update(load_file(shard))
    out = {}
    dequantize = fg.Fp8Dequantize(None)._dequantize_one  # the throughput rows' reference
    for name in [n for n in sd if not n.endswith("_scale_inv")]:
        w = dequantize(sd[name], sd[name + "_scale_inv"], torch.float32)
        out[name] = w.to(torch.bfloat16)
    save_file(out, dst)
    fsync(dst)


ROUTES: dict[str, tuple[str, Callable[..., Any], Callable[[Any], None]]] = {
    "tb": ("tensorbridge, streamed", open_source, tb_stream),
    "naive": ("load all, transformers' dequantize, save", open_source, naive),
    "raw": ("raw sequential write of the output bytes", raw_buffer, raw_write),
}


def run(ctx: Context, sec: Section) -> None:
    rows, cols = ctx.pick((4096, 4096), (2048, 2048), (256, 512))
    sec.intro(
        f"""Throughput: one {rows} x {cols} weight ({fmt_count(rows * cols)} elements) per
        scheme, dequantized to bf16 by tensorbridge and by the scheme's reference on the same
        codes and scales; elements per second from the minimum / median time, *tb vs ref* =
        reference time / tensorbridge time (> 1: tensorbridge is faster), *bits*: whether the
        two results are bit-identical. torch threads: {torch.get_num_threads()}."""
    )
    table: list[list[str]] = []
    for scheme, ref_name, ours, ref in _cases(rows, cols):
        cands: dict[str, Callable[[], Any]] = {"tb": ours}
        if ref is not None:
            cands["ref"] = ref
        st = ctx.measure(cands, repeats=ctx.pick(7, 5, 3))
        n = rows * cols
        rate = f"{n / st['tb'].min / 1e9:.2f} / {n / st['tb'].median / 1e9:.2f}"
        if ref is None:
            table.append([scheme, "(reference not installed)", rate, "-", "-", "-"])
            continue
        ratio = speedup(st["ref"], st["tb"])
        same = bool(np.array_equal(_bits(ours()), _bits(ref())))
        ok = ctx.check(sec, f"{scheme}: dequantize >= 1x {ref_name}", ratio[1] >= 1.0)
        ref_rate = f"{n / st['ref'].min / 1e9:.2f} / {n / st['ref'].median / 1e9:.2f}"
        table.append([scheme, ref_name, rate, ref_rate, fmt_ratio(ratio), f"{same} {ok}"])
    sec.table(
        ["scheme", "reference", "tb Gelem/s", "ref Gelem/s", "tb vs ref", "bits / target"], table
    )
    _streaming(ctx, sec)


def _streaming(ctx: Context, sec: Section) -> None:
    # --quick: one run of each route on 64 MiB (the section took the longest of a --quick
    # run profiled under load: nine 256 MiB child runs); its figures are no measurements
    size = ctx.pick(4 * GIB, 64 * MIB, 8 * MIB)
    repeats = ctx.pick(3, 1, 1)
    # the naive route holds the codes, float32 values and the bf16 output at once
    naive_size = size if _mem_available() > 8 * size + GIB else min(size, GIB)
    absent = _naive_absent()  # its references are optional: the route is skipped, said why
    if absent:
        naive_size = size  # no separate smaller run either
    free = shutil.disk_usage(ctx.scratch).free
    need = 3 * size + (3 * naive_size if naive_size != size else 0) + 512 * MIB
    if free < need:
        sec.text(f"Streaming skipped: needs {fmt_bytes(need)} of disk, {fmt_bytes(free)} free.")
        return
    dst = ctx.scratch / "quant-dst.safetensors"
    runs: dict[str, list[ChildRun]] = {}
    sizes: dict[str, int] = {}

    def rows(src: Path, keys: tuple[str, ...], tag: str) -> None:
        codes = sum(p.stat().st_size for p in src.glob("*.safetensors"))
        for _ in range(repeats):  # interleaved, so that the load on the machine is shared
            for key in keys:
                _, prepare, step = ROUTES[key]
                task = Task(prepare, step, (str(src), str(dst), 2 * codes))
                runs.setdefault(key + tag, []).append(ctx.child(task))
                sizes[key + tag] = 2 * codes
                dst.unlink(missing_ok=True)

    try:
        src = ctx.scratch / "quant-src"
        write_checkpoint(str(src), size)
        shards = len(list(src.glob("model-*.safetensors")))
        naive_here = naive_size == size and not absent
        rows(src, ("raw", "tb", "naive") if naive_here else ("raw", "tb"), "")
        shutil.rmtree(src, ignore_errors=True)
        if naive_size != size:
            write_checkpoint(str(src), naive_size)
            rows(src, ("raw", "naive"), "@small")
    finally:
        shutil.rmtree(ctx.scratch / "quant-src", ignore_errors=True)
        dst.unlink(missing_ok=True)
    sec.text(
        f"""Streaming: a synthetic DeepSeek-V3-like fp8 block-wise checkpoint
        ({fmt_bytes(sizes["tb"] // 2)} of [rows, 7168] F8_E4M3 weights with 128 x 128 F32
        scales, {shards} shard(s) with an index) converted to bf16 safetensors
        ({fmt_bytes(sizes["tb"])}), `tb.open(dequantize="bf16")` + `tb.save` as
        `convert --dequantize bf16` does. Each row runs in a child process; *time*: median
        of {repeats} runs, interleaved with the raw write of the same output size; *anon +*:
        the largest growth of the child's anonymous memory over its level before the step
        (mapped file pages excluded); *vs raw*: raw write time / row time (medians)."""
        + (
            f""" The naive route (load every shard, transformers' dequantize, save) needs
            about 3x the checkpoint in memory: it runs on a {fmt_bytes(naive_size)}
            checkpoint, with its own raw write of that output."""
            if naive_size != size
            else ""
        )
        + (
            f""" The naive route (load every shard, transformers' dequantize, save) is
            skipped: {absent} not installed."""
            if absent
            else ""
        )
    )
    table = []
    for key, rs in runs.items():
        route = key.split("@")[0]
        raw = runs["raw@small" if key.endswith("@small") else "raw"]
        t = statistics.median(r.seconds for r in rs)
        vs = statistics.median(r.seconds for r in raw) / t
        table.append([ROUTES[route][0], fmt_bytes(sizes[key]), f"{t:.2f} s",
                      fmt_bytes(max(r.anon_growth for r in rs)), f"{vs:.2f}"])  # fmt: skip
    sec.table(["route", "output", "time", "anon +", "vs raw"], table)
    if "tb" in runs:
        tb_s = statistics.median(r.seconds for r in runs["tb"])
        ratio = statistics.median(r.seconds for r in runs["raw"]) / tb_s
        growth = max(r.anon_growth for r in runs["tb"])
        ctx.check(sec, "streamed dequantize: anon growth < 128 MiB", growth < 128 * MIB)
        ctx.check(sec, "streamed dequantize: >= 0.8x a raw write", ratio >= 0.8)
        ctx.highlight(
            f"**Dequantizing a {fmt_bytes(sizes['tb'] // 2)} fp8 checkpoint to bf16**, "
            f"streamed: {ratio:.2f}x the speed of a raw write of its output, "
            f"{fmt_bytes(growth)} of anonymous memory."
        )


def _mem_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            return next(
                int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")
            )
    except (OSError, StopIteration):
        return 0
