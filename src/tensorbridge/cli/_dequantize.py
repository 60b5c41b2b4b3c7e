"""convert --dequantize of a checkpoint of codes and scales: its one call,
:func:`tensorbridge.dequantize_checkpoint`, and its summary (a GGUF file dequantizes as
it is read, and is converted as any other file)."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any, TextIO

from ._options import progress
from ._output import conversion_report

if TYPE_CHECKING:
    from .._tensorfile import TensorFile


def write_dequantized(
    args: argparse.Namespace,
    src: TensorFile,
    names: list[str],
    meta: dict[str, Any],
    dtype: Any,
    report: tuple[dict[str, str], list[str], float],
    out: TextIO,
) -> int:
    """convert --dequantize: :func:`tensorbridge.dequantize_checkpoint` of ``src`` (opened
    dequantizing: ``tb.open(..., dequantize=...)``) and its summary; ``report``: the
    entries skipped, the metadata keys dropped and when the command started."""
    from ..checkpoint import dequantize_checkpoint

    skipped, dropped, start = report
    done = dequantize_checkpoint(
        src,
        args.dst,
        dtype,
        names=names,
        metadata=meta or False,
        max_shard_size=args.max_shard_size,
        overwrite=args.overwrite,
        progress=progress(args),
        verify=args.verify,
    )
    plan = done.plan
    summary: dict[str, Any] = {
        "src": args.src,
        "dequantized": plan.summary() if plan is not None else "",
        "dropped": list(done.dropped),
        "dst": done.path,
        "tensors": done.tensors,
        "bytes_in": done.bytes_in,
        "bytes_out": done.bytes_out,
        "seconds": round(time.perf_counter() - start, 3),
        "skipped": sorted(skipped),
        "dropped_metadata": dropped,
    }
    ok = True
    if done.problems is not None:
        summary["verified"] = not done.problems
        summary["problems"] = list(done.problems)
        ok = not done.problems
    return conversion_report(summary, args, out, ok, None)
