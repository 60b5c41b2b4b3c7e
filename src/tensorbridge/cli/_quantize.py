"""convert --quantize: the option checked against the others, then
:func:`tensorbridge.quantize_checkpoint`, its notes and its summary."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from ._errors import UsageError, as_options
from ._options import progress
from ._output import conversion_report, plural

if TYPE_CHECKING:
    from .._tensorfile import TensorFile

# tb.quantize_checkpoint's arguments -> the options of convert --quantize that give them
QUANTIZE_OPTIONS = {
    "scheme": "--quantize",
    "layout": "--layout",
    "element": "--element",
    "block_size": "--block-size",
    "ignore": "--ignore",
}


def quantize_arg(
    args: argparse.Namespace, dequantize: Any, float_dtype: Any, block_size: Any
) -> str | None:
    """``--quantize``'s scheme, checked against the options it cannot go with."""
    if args.quantize is None:
        if args.ignore:
            raise UsageError("--ignore says which weights --quantize leaves; pass --quantize")
        for given, flag in ((args.layout, "--layout"), (args.element, "--element")):
            if given:
                raise UsageError(f"{flag} says how --quantize writes weights; pass --quantize")
        return None
    if dequantize is not None:
        raise UsageError("pass --quantize or --dequantize, not both")
    if float_dtype is not None:
        raise UsageError(
            "--quantize sets the weights' dtypes; cast the other tensors in a second convert "
            "with --float-dtype"
        )
    if args.scheme is not None:
        raise UsageError("--quantize names the scheme; leave out --scheme")
    from ..errors import QuantizationError
    from ..quant.write import writable  # imports torch: only when quantizing

    try:
        return writable(args.quantize, args.layout, args.element, block_size)
    except QuantizationError as e:
        raise UsageError(as_options(str(e), QUANTIZE_OPTIONS)) from None


def write_quantized(
    args: argparse.Namespace,
    src: TensorFile,
    names: list[str],
    meta: dict[str, Any],
    scheme: str,
    block_size: tuple[int, int] | None,
    start: float,
    out: TextIO,
) -> int:
    """convert --quantize: :func:`tensorbridge.quantize_checkpoint`, and its notes."""
    from ..checkpoint import quantize_checkpoint
    from ..quant.registry import SCHEMES

    done = quantize_checkpoint(
        src,
        args.dst,
        scheme,
        layout=args.layout,
        element=args.element,
        block_size=block_size,
        ignore=args.ignore,
        names=names,
        metadata=meta or False,
        max_shard_size=args.max_shard_size,
        overwrite=args.overwrite,
        progress=progress(args),
        verify=args.verify,
    )
    if not args.quiet:
        for n, why in done.left_unquantized.items():
            print(f"note: left {n} unquantized: {why}", file=sys.stderr)
    if done.config_kept is not None:
        print(
            f"note: kept the existing {done.config_kept} (pass --overwrite to replace it)",
            file=sys.stderr,
        )
    if done.config is not None and done.caveat and not args.quiet:
        print(f"note: {done.caveat}", file=sys.stderr)
    if done.config is None and not args.quiet:
        blocks = f" --block-size {','.join(map(str, block_size or (128, 128)))}"
        print(
            f"note: no config.json beside {args.src}, so none says how {args.dst} is "
            f"quantized: read it with --scheme {scheme}"
            + (blocks if SCHEMES[scheme].takes_block_size else "")
            + " (tb.open(..., dequantize=..., scheme=...))",
            file=sys.stderr,
        )
    summary: dict[str, Any] = {
        "src": args.src,
        "quantized": f"{scheme}: {plural(len(done.quantized), 'weight')}",
        **({"layout": args.layout} if args.layout else {}),
        **({"element": args.element} if args.element else {}),
        "quantized_weights": list(done.quantized),
        "left_unquantized": dict(done.left_unquantized),
        "config": done.config,
        "dst": done.path,
        "tensors": done.tensors,
        "bytes_in": done.bytes_in,
        "bytes_out": done.bytes_out,
        "seconds": round(time.perf_counter() - start, 3),
        "skipped": [],
        "dropped_metadata": [],
    }
    ok = True
    if done.problems is not None:
        summary["verified"] = not done.problems
        summary["problems"] = list(done.problems)
        ok = not done.problems
    return conversion_report(summary, args, out, ok, None)
