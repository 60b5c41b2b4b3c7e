"""``tensorbridge cast-report``: what casting every tensor of a file to ``--dtype`` would
do (overflow, saturation, flushing, NaNs, errors in the target's ULPs), or, with
``--scheme``, what quantizing its weights would do (or what a quantized file's scales
and codes hold). Exit status 1 when a tensor is lossy or beyond ``--rtol``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import QuantizationError
from ._errors import UsageError, as_options
from ._files import open_file, quant_plan
from ._options import block_size as block_size_arg
from ._options import check_tolerance, command, dtype_arg, progress, reading, scheme_options
from ._output import colour, dump, num, plural, quant_verdict, quant_weights, table
from ._plot import plot_ulps

EXAMPLES = (
    "examples:\n  tensorbridge cast-report model.safetensors --dtype bf16\n"
    "  tensorbridge cast-report model.safetensors --dtype float8_e4m3fn --plot ulps.png\n"
    "  tensorbridge cast-report model.safetensors --scheme nvfp4-modelopt"
)

# quant_report's arguments -> the options that give them
_SCHEME_OPTIONS = {"scheme": "--scheme", "block_size": "--block-size", "ignore": "--ignore"}


def add_parser(subparsers: Any) -> None:
    p = command(
        subparsers, "cast-report", "what casting every tensor of a file to DTYPE would do", EXAMPLES
    )
    p.add_argument("file", metavar="FILE", help="the checkpoint whose tensors would be cast")
    p.add_argument(
        "--dtype",
        metavar="DTYPE",
        help="the dtype to cast to: bf16, f16, float8_e4m3fn, ... (required, unless --scheme "
        "is given or FILE is quantized)",
    )
    p.add_argument(
        "--rtol",
        type=float,
        help="with --dtype: the largest max relative error a tensor may have (default: "
        "rounding is not judged, only overflow, flushing and NaNs)",
    )
    p.add_argument(
        "--plot",
        metavar="PNG",
        help="draw the ULP histograms of the 6 worst tensors (matplotlib)",
    )
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    scheme_options(
        p, "quantize with NAME and dequantize again (mxfp8, mxfp4, nvfp4-modelopt, fp8-block)"
    )
    p.add_argument(
        "--ignore",
        action="append",
        default=[],
        metavar="PATTERN",
        help="with --scheme: leave weights matching PATTERN unquantized (glob; repeatable)",
    )
    reading(p)


def run(args: argparse.Namespace) -> int:
    from .. import diagnostics
    from .._progress import progress_bar

    out = sys.stdout
    if args.dtype is not None and (args.scheme or args.block_size) is not None:
        raise UsageError("pass --dtype (a cast) or --scheme (a quantization), not both")
    if args.dtype is None:
        return _run_scheme(args)
    if args.ignore:
        raise UsageError("--ignore applies to --scheme; a cast applies to every tensor")
    target = dtype_arg(args.dtype, "--dtype", floating=True)
    check_tolerance(args.rtol, "--rtol")
    reports = {}
    with open_file(args.file, args) as f:
        unsupported = f.unsupported()
        names = [
            n for n in f if n not in unsupported and f.info(n)[0].category in ("float", "complex")
        ]
        nbytes = sum(f.nbytes(n) for n in names)  # counted, not read
        bar = progress_bar(nbytes, "cast-report", progress(args), tensors=len(names), work="check")
        try:
            for name in names:
                reports[name] = diagnostics.cast_report(f[name], target, rtol=args.rtol)
                bar.update(f.nbytes(name))
        finally:
            bar.close()
    if not reports:
        raise UsageError(f"{args.file} has no floating-point or complex tensors to cast")
    plotted = plot_ulps(reports, args.plot, target.name) if args.plot else None
    ok = all(r.ok for r in reports.values())
    safe = all(r.safe for r in reports.values())
    if args.json:
        doc = {"dtype": target.name, "safe": safe, "rtol": args.rtol, "ok": ok}
        doc["meaning"] = _meaning(args.rtol)
        doc["tensors"] = {k: r.to_dict() for k, r in reports.items()}
        if plotted is not None:
            doc["plot"] = plotted
        dump(doc, out)
        return 0 if ok else 1
    return _print_table(reports, args, target, plotted, out)


def _print_table(
    reports: dict[str, Any], args: argparse.Namespace, target: Any, plotted: Any, out: Any
) -> int:
    """The reports as a table of counts, the kernel's semantics and the verdict; the exit
    status (1: a tensor is lossy, or beyond --rtol)."""
    ok = all(r.ok for r in reports.values())
    safe = all(r.safe for r in reports.values())
    # every count that makes a tensor unsafe has a column; the last three only when they happen
    counts = [
        ("to inf", "overflow_inf"),
        ("saturated", "saturated"),
        ("to NaN", "nan_created"),
        ("to zero", "flushed_to_zero"),
        ("subnormal", "subnormal"),
        ("NaN changed", "nan_changed"),
    ]
    for column in (
        ("zero replaced", "zero_replaced"),  # a target with no zero: float8_e8m0fnu
        ("sign dropped", "sign_dropped"),  # a target with no sign: float8_e8m0fnu
        ("imag dropped", "imag_discarded"),
    ):
        if any(getattr(r, column[1]) for r in reports.values()):
            counts.append(column)
    rows = [
        [name, r.source_dtype]
        + [num(getattr(r, field)) for _, field in counts]
        + [
            num(r.max_rel_err),
            num(r.mean_rel_err),
            colour(_verdict(r), r.ok, out),
        ]
        for name, r in reports.items()
    ]
    headers = ["tensor", "from", *(h for h, _ in counts), "max rel", "mean rel", "verdict"]
    table(rows, headers, out)
    for kernel, semantics in dict.fromkeys((r.kernel, r.semantics) for r in reports.values()):
        out.write(f"kernel: {kernel} ({semantics})\n")
    out.write(f"{_meaning(args.rtol)}\n")
    if plotted is not None:
        out.write(f"plot: {plotted['summary']}\n")
    worst = max((r.max_rel_err or 0.0) for r in reports.values())
    if not safe:
        verdict = f"lossy in {target.name}"
    elif not ok:
        over = sum(not r.ok for r in reports.values())
        verdict = (
            f"{plural(over, 'tensor')} beyond --rtol {args.rtol} in {target.name} "
            f"(max rel err {num(worst)})"
        )
    elif args.rtol is None:
        verdict = (
            f"safe to store in {target.name} (max rel err {num(worst)}; pass --rtol to "
            "bound the rounding)"
        )
    else:
        verdict = f"within --rtol {args.rtol} in {target.name} (max rel err {num(worst)})"
    out.write("verdict: " + colour(verdict, ok, out) + "\n")
    return 0 if ok else 1


def _verdict(r: Any) -> str:
    if not r.safe:
        return "LOSSY"
    return "safe" if r.rtol is None else ("ok" if r.ok else "BEYOND-RTOL")


def _meaning(rtol: float | None) -> str:
    safe = (
        "safe: nothing overflowed, saturated, flushed to zero, lost its zero or sign, or "
        "became or changed a NaN"
    )
    if rtol is None:
        return f"{safe}; rounding is not judged (pass --rtol to bound max rel)"
    return f"{safe}; ok: safe, and max rel <= --rtol {rtol}"


def _run_scheme(args: argparse.Namespace) -> int:
    """cast-report --scheme: a quantized file's weights, or what quantizing a plain one does."""
    from .. import diagnostics
    from .._progress import progress_bar

    out = sys.stdout
    block_size = block_size_arg(args)
    with open_file(args.file, args) as f:
        if args.scheme is None and not quant_plan(f, None, block_size).quantized:
            raise UsageError(
                f"{args.file} is not quantized: pass --dtype DTYPE for a cast or "
                "--scheme NAME for what quantizing it would do"
            )
        names = [n for n in f if n not in f.unsupported()]
        bar = progress_bar(
            sum(f.nbytes(n) for n in names),
            "cast-report",
            progress(args),
            tensors=len(names),
            work="check",
        )
        try:
            report = diagnostics.quant_report(
                f,
                scheme=args.scheme,
                block_size=block_size,
                ignore=args.ignore,
                progress=lambda name: bar.update(f.nbytes(name) if name in f else 0),
            )
        except QuantizationError as e:  # what was given, said as the option that gave it
            raise QuantizationError(as_options(str(e), _SCHEME_OPTIONS)) from None
        finally:
            bar.close()
    if not report.weights:
        raise UsageError(
            f"{args.file} has no weight {args.scheme} would quantize (2-D+ float weights, "
            "not embeddings, lm_head or norms)"
        )
    if args.json:
        dump(report.to_dict(), out)
        return 0 if report.ok else 1
    out.write(f"{args.file}: {report.summary}\n")
    quant_weights(report, out)
    for name, why in report.skipped.items():
        if "multiple" in why or "matches" in why:
            out.write(f"left unquantized: {name} ({why})\n")
    verdict = quant_verdict(report, report.ok, frozenset(), None)
    out.write("verdict: " + colour(verdict, report.ok, out) + "\n")
    return 0 if report.ok else 1
