"""Section: GGUF files against the ``gguf`` package (llama.cpp's own reader), issue 13's rows.

On one GGUF file of BF16 weights (1 GiB; ``--quick``: 64 MiB) with a tokenizer
of 150,000 tokens in its metadata (the strings, their scores and types, as Qwen-sized
vocabularies have), written by ``tb.save``:

1. open + first tensor: ``tb.open(path)[first]`` vs ``gguf.GGUFReader(path).tensors[0]``
   (the page cache warm for both; each timed apart, GGUFReader's garbage would slow
   what runs after it). Target: tensorbridge under 10 ms;
2. BF16 read zero-copy: the array is ``ml_dtypes.bfloat16``, shares memory with the
   mapped file and is read-only (the reader hands out raw ``uint8`` bytes instead);
3. dequantize throughput (elements/s) per type, ``tensorbridge.io.gguf.dequantize_blocks``
   vs ``gguf.quants.dequantize`` on the same blocks (one 4096-wide matrix, 64 Mi values;
   ``--quick``: 4 Mi), to float32. Target: at least 1x the gguf package's.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

import ml_dtypes
import numpy as np
import torch

import tensorbridge as tb
from tensorbridge.io import gguf as tbg

from .core import MIB, Context, Section, fmt_mib, fmt_pair, fmt_ratio, speedup

TITLE = "GGUF: open, BF16 zero-copy, dequantizing against the gguf package"

N_TENSORS = 16
WIDTH = 4096
TYPES = ("Q8_0", "Q4_0", "MXFP4", "Q4_K", "Q6_K")
_QUANTIZABLE = ("Q8_0", "Q4_0", "MXFP4")  # gguf's Python quantizer has these


def _metadata(vocab: int) -> dict[str, Any]:
    return {
        "general.architecture": "llama",
        "llama.block_count": N_TENSORS,
        "llama.context_length": 4096,
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": _tokens(vocab),
        "tokenizer.ggml.scores": [float(-i) for i in range(vocab)],
        "tokenizer.ggml.token_type": [1] * vocab,
    }


def _tokens(vocab: int) -> list[str]:
    """Byte-level BPE-like tokens (``Ġ`` + 1-15 letters, as Llama 3's 128k or Qwen's
    150k vocabularies look), distinct, so the string array is a realistic size."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 16, vocab)
    letters = rng.integers(97, 123, int(lengths.sum()), dtype=np.uint8).tobytes().decode()
    ends = np.cumsum(lengths)
    return [f"Ġ{letters[e - n : e]}{i}" for i, (e, n) in enumerate(zip(ends, lengths, strict=True))]


def _blocks(name: str, rows: int) -> np.ndarray:
    """One ``rows`` x 4096 matrix of ``name`` blocks: gguf's quantizer where it has one."""
    import gguf
    from gguf import quants

    qtype = gguf.GGMLQuantizationType[name]
    rng = np.random.default_rng(0)
    if name in _QUANTIZABLE:
        x = rng.standard_normal((rows, WIDTH), dtype=np.float32)
        return np.asarray(quants.quantize(x, qtype))
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, (rows, WIDTH // block, size), dtype=np.uint8)
    scale = rng.uniform(-0.1, 0.1, (rows, WIDTH // block, 1)).astype(np.float16)
    b[..., 0:2] = scale.view(np.uint8)  # finite f16 scales where the layout starts with d
    b[..., 2:4] = scale.view(np.uint8)  # Q4_K's dmin
    b[..., -2:] = scale.view(np.uint8)  # Q6_K's d is last
    return b.reshape(rows, -1)


def run(ctx: Context, sec: Section) -> None:
    total = ctx.pick(1 << 30, 64 * MIB, 4 * MIB)
    # --quick: a Llama-2-sized vocabulary; GGUFReader parses each token into arrays of its
    # own, seconds a read at 150,000, and --quick is a smoke run
    vocab = ctx.pick(150_000, 32_000, 1_000)
    values = ctx.pick(64 * MIB, 2 * MIB, 64 * 1024)
    repeats = ctx.pick(5, 3, 1)
    sec.intro(
        f"""A GGUF file of {N_TENSORS} BF16 weights ({fmt_mib(total)}) with a
        {vocab:,}-token tokenizer in its metadata, written by `tb.save`; then each
        quantized type's blocks for a {values // WIDTH:,} x {WIDTH} matrix. Times are
        min / median of {repeats} interleaved runs; ratios are the gguf package's time
        / tensorbridge's (> 1: tensorbridge is faster)."""
    )
    if importlib.util.find_spec("gguf") is None:
        sec.text("*Skipped: the `gguf` package (`pip install tensorbridge[gguf]`) is absent.*")
        return
    from gguf import GGMLQuantizationType, GGUFReader, quants

    path = ctx.scratch / "model.gguf"
    rows = total // N_TENSORS // 2 // WIDTH
    weight = torch.randn(rows, WIDTH).to(torch.bfloat16)
    sd = {f"blk.{i}.ffn_up.weight": weight for i in range(N_TENSORS)}
    tb.save(sd, path, metadata=_metadata(vocab), progress=False, overwrite=True)
    del sd, weight

    def ours() -> Any:
        with tb.open(path) as f:
            return f[f.keys()[0]]

    def theirs() -> Any:
        return GGUFReader(path).tensors[0].data

    # measured apart: GGUFReader's millions of small arrays would slow whatever runs
    # next; tensorbridge's open is cheap enough to repeat more
    st = ctx.measure({"tb": ours}, repeats=4 * repeats)
    st |= ctx.measure({"gguf": theirs}, repeats=repeats)
    first = st["tb"].min
    out: list[tuple[str, str, str, str]] = [
        (
            f"open + first tensor of a {fmt_mib(path.stat().st_size)} GGUF file, tb vs GGUFReader",
            f"{fmt_pair(st['tb'])} vs {fmt_pair(st['gguf'])} = "
            f"{fmt_ratio(speedup(st['gguf'], st['tb']), 0)}x",
            "< 10 ms",
            ctx.check(sec, "GGUF open + first tensor < 10 ms", first < 0.010),
        )
    ]
    with tbg.open(path) as f:
        name = f.keys()[0]
        a = f[name]
        zero_copy = (
            a.dtype == ml_dtypes.bfloat16
            and np.shares_memory(a, f.raw(name))
            and not a.flags.writeable
            and not a.flags.owndata
        )
    raw = GGUFReader(path).tensors[0].data
    out.append(
        (
            "BF16 read zero-copy (ml_dtypes.bfloat16 view of the map, read-only)",
            f"{a.dtype}{list(a.shape)} (GGUFReader: {raw.dtype}{list(raw.shape)})",
            "zero-copy",
            ctx.check(sec, "GGUF BF16 read zero-copy", zero_copy),
        )
    )
    del a, raw
    path.unlink()
    sec.table(["measurement", "result", "target", "result"], out)

    deq: list[tuple[str, str, str, str, str]] = []
    worst = float("inf")
    for name in TYPES:
        blocks = _blocks(name, values // WIDTH)
        qtype = GGMLQuantizationType[name]
        shape = (values // WIDTH, WIDTH)
        st = ctx.measure(
            {
                "tb": functools.partial(tbg.dequantize_blocks, blocks, name, shape),
                "gguf": functools.partial(quants.dequantize, blocks, qtype),
            },
            repeats=repeats,
        )
        ratio = speedup(st["gguf"], st["tb"])
        worst = min(worst, ratio[0])
        deq.append(
            (
                name,
                f"{values / st['tb'].min / 1e6:,.0f} M/s",
                f"{values / st['gguf'].min / 1e6:,.0f} M/s",
                f"{fmt_ratio(ratio)}x",
                ctx.check(sec, f"GGUF {name} dequantize >= 1x gguf", ratio[0] >= 1.0),
            )
        )
    sec.text(
        """Dequantizing to float32, elements per second: `dequantize_blocks` (own
        in-place kernels for these five types, bit-identical to the gguf package's on
        every bit pattern; the package's own code, fed cache-sized runs of blocks, for
        the others) vs `gguf.quants.dequantize` on the whole matrix. Target: >= 1x."""
    )
    sec.table(["type", "tensorbridge", "gguf", "ratio (min / median)", "target >= 1x"], deq)
    ctx.highlight(
        f"**GGUF**: open + first tensor in {first * 1e3:.2f} ms, BF16 as zero-copy "
        f"`ml_dtypes.bfloat16` views; dequantizing at {worst:.2f}x or more the gguf "
        "package's speed."
    )
