"""``tensorbridge compare``: two checkpoints (or tensors) tensor by tensor.

Errors in absolute, relative and ULP terms against tolerances by dtype (``--rtol`` /
``--atol``); when one side is quantized (its config, its names, or ``--scheme``),
each weight is compared block by block with its unquantized reference
(:func:`tensorbridge.quant_report`). Exit status 1 when anything differs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from ..errors import TensorBridgeError
from ._errors import UsageError
from ._files import open_file, quant_plan
from ._options import block_size as block_size_arg
from ._options import check_tolerance, command, progress, reading, scheme_options
from ._output import colour, display, dump, num, plural, quant_verdict, quant_weights, table
from ._plot import plot_errors

EXAMPLES = (
    "examples:\n  tensorbridge compare a.safetensors b.safetensors\n"
    "  tensorbridge compare ref.npz out.npz --rtol 1e-3 --plot errors.png\n"
    "  tensorbridge compare bf16_model/ mxfp4_model/ --scheme mxfp4"
)


def add_parser(subparsers: Any) -> None:
    p = command(subparsers, "compare", "compare two files (or tensors) tensor by tensor", EXAMPLES)
    p.add_argument("a", metavar="A", help="the reference: a checkpoint file or directory")
    p.add_argument(
        "b", metavar="B", help="the checkpoint compared with A (a copy, cast or conversion)"
    )
    p.add_argument("--rtol", type=float, help="relative tolerance (default: by dtype)")
    p.add_argument("--atol", type=float, help="absolute tolerance (default: by dtype)")
    p.add_argument("--plot", metavar="PNG", help="draw the error distributions (matplotlib)")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    scheme_options(p, "the quantized side's scheme, when no config says it (mxfp4, ...)")
    reading(p)


def _as_mapping(path: str, args: argparse.Namespace) -> dict[str, Any]:
    with open_file(path, args) as f:
        if f.single:
            return {f.keys()[0]: f[f.keys()[0]]}
        unsupported = f.unsupported()
        if unsupported:
            first = next(iter(unsupported))
            raise TensorBridgeError(
                f"{unsupported[first]}; compare reads tensors only (convert the others with "
                f"--exclude {first} or --skip-unsupported first)"
            )
        return {n: f[n] for n in f}


def run(args: argparse.Namespace) -> int:
    from .. import diagnostics

    out = sys.stdout
    check_tolerance(args.rtol, "--rtol")
    check_tolerance(args.atol, "--atol")
    block_size = block_size_arg(args)
    side = _quantized_side(args, block_size)
    if side is not None:
        return _compare_quantized(args, side, block_size, out)
    a, b = _as_mapping(args.a, args), _as_mapping(args.b, args)
    if len(a) == 1 and len(b) == 1 and a.keys() != b.keys():
        a, b = {"tensor": next(iter(a.values()))}, {"tensor": next(iter(b.values()))}
    result = diagnostics.compare(a, b, rtol=args.rtol, atol=args.atol, progress=progress(args))
    plotted = plot_errors(a, b, result, args.plot) if args.plot else None
    if args.json:
        doc = result.to_dict()
        if plotted is not None:
            doc["plot"] = plotted
        doc["leaves"] = {display(k): {**v, "path": display(k)} for k, v in doc["leaves"].items()}
        doc["missing"] = [display(k) for k in doc["missing"]]
        doc["extra"] = [display(k) for k in doc["extra"]]
        dump(doc, out)
        return 0 if result.ok else 1
    mixed = any(leaf.dtype_mismatch for leaf in result.leaves.values())
    rows = []
    for path, leaf in result.leaves.items():
        verdict = "ok" if leaf.ok else "DIFF"
        if leaf.problem:
            verdict = f"DIFF ({leaf.problem})"
        cells = [
            display(path),
            f"{leaf.dtype_a}/{leaf.dtype_b}" if leaf.dtype_mismatch else str(leaf.dtype_a),
            num(leaf.max_abs_err),
            num(leaf.max_rel_err),
            num(leaf.max_ulp),
        ]
        if mixed:
            cells.append(str(leaf.compared_in or "-"))
        rows.append([*cells, num(leaf.mismatches), colour(verdict, leaf.ok, out)])
    headers = ["tensor", "dtype", "max abs", "max rel", "max ulp"]
    headers += ["ulps of"] if mixed else []
    table(rows, [*headers, "mismatches", "verdict"], out)
    for name in result.missing:
        out.write(f"only in {args.a}: {display(name)}\n")
    for name in result.extra:
        out.write(f"only in {args.b}: {display(name)}\n")
    if plotted is not None:
        out.write(f"plot: {plotted['summary']}\n")
    bad = sum(not leaf.ok for leaf in result.leaves.values())
    unmatched = len(result.missing) + len(result.extra)
    problems = [f"{plural(bad, 'tensor')} {'differs' if bad == 1 else 'differ'}"] if bad else []
    problems += [f"{plural(unmatched, 'tensor')} in only one file"] if unmatched else []
    verdict = "within tolerance" if result.ok else ", ".join(problems) or "differ"
    out.write(f"verdict: {colour(verdict, result.ok, out)} ({_loss(result)})\n")
    return 0 if result.ok else 1


def _loss(result: Any) -> str:
    """What the comparison found, whatever the verdict: the largest errors of the floats,
    their ULP distances by the dtype they are counted in, the integers' differences."""
    ulps: dict[str, int] = {}
    ints: int | None = None
    abs_err = rel_err = None
    for leaf in result.leaves.values():
        if leaf.max_ulp is None:
            continue
        if leaf.compared_in in (None, "integers (exact)"):
            ints = max(ints or 0, leaf.max_ulp)
            continue
        ulps[leaf.compared_in] = max(ulps.get(leaf.compared_in, 0), leaf.max_ulp)
        if leaf.max_abs_err is not None:
            abs_err = max(abs_err or 0.0, leaf.max_abs_err)
            rel_err = max(rel_err or 0.0, leaf.max_rel_err or 0.0)
    parts = []
    if ulps:
        parts.append(f"max abs err {num(abs_err)}, max rel err {num(rel_err)}")
        each = ", ".join(f"{num(n)} counted in {unit}" for unit, n in sorted(ulps.items()))
        parts.append(f"max ulp {each}")
    if ints is not None:
        parts.append(f"integers: max difference {num(ints)}")
    return "; ".join(parts) or "nothing compared"


def _quantized_side(args: argparse.Namespace, block_size: Any) -> str | None:
    """Which of compare's A and B is the quantized one ("a" / "b"), or None for a plain
    comparison: the one side with quantized weights (--scheme's, or what the config
    or the names say)."""
    from ..errors import QuantizationError

    found: dict[str, bool] = {}
    for key in ("a", "b"):
        path = getattr(args, key)
        with open_file(path, argparse.Namespace(**{**vars(args), "quiet": True})) as f:
            try:
                found[key] = quant_plan(f, args.scheme, block_size).quantized
            except QuantizationError as e:
                if args.scheme is not None or block_size is not None:
                    raise
                if not args.quiet:
                    print(
                        f"note: {path} looks quantized but {e}; comparing the stored tensors",
                        file=sys.stderr,
                    )
                found[key] = False
    sides = [k for k, q in found.items() if q]
    if len(sides) == 1:
        return sides[0]
    if args.scheme is None and block_size is None:
        return None
    what = f"{args.scheme} weights" if args.scheme else "quantized weights"
    if not sides:
        raise UsageError(f"neither {args.a} nor {args.b} holds {what}; leave out --scheme")
    raise UsageError(
        f"both {args.a} and {args.b} hold {what}; compare a quantized checkpoint with its "
        "unquantized reference (or leave out --scheme to compare the stored tensors)"
    )


def _compare_quantized(args: argparse.Namespace, side: str, block_size: Any, out: TextIO) -> int:
    """compare of a quantized checkpoint with its reference: errors block by block."""
    from .. import diagnostics
    from .._progress import progress_bar

    qpath, rpath = (args.b, args.a) if side == "b" else (args.a, args.b)
    with open_file(qpath, args) as qf, open_file(rpath, args) as rf:
        p = quant_plan(qf, args.scheme, block_size)
        bar = progress_bar(
            sum(qf.nbytes(g.parts["codes"]) for g in p.groups),
            "comparing",
            progress(args),
            tensors=len(p.groups),
            work="check",
        )
        nbytes = {g.name: qf.nbytes(g.parts["codes"]) for g in p.groups}
        try:
            report = diagnostics.quant_report(
                qf,
                rf,
                scheme=args.scheme,
                block_size=block_size,
                progress=lambda name: bar.update(nbytes[name]),
            )
        finally:
            bar.close()
        ref_names = [n for n in rf if n not in rf.unsupported()]
        shared = [n for n in p.passthrough if n in ref_names]
        rest = diagnostics.compare(
            {n: rf[n] for n in shared},
            {n: qf[n] for n in shared},
            rtol=args.rtol,
            atol=args.atol,
        )
        only_ref = [n for n in ref_names if n not in p.passthrough and p.group(n) is None]
        only_q = [n for n in p.passthrough if n not in ref_names]
    too_far = {
        n
        for n, w in report.weights.items()
        if args.rtol is not None and w.max_rel_err is not None and w.max_rel_err > args.rtol
    }
    ok = report.ok and rest.ok and not only_ref and not only_q and not too_far
    if args.json:
        dump(
            {
                "quantized": qpath,
                "reference": rpath,
                "ok": ok,
                "report": report.to_dict(),
                "tensors": {display(k): v.to_dict() for k, v in rest.leaves.items()},
                "only_in_reference": only_ref,
                "only_in_quantized": only_q,
            },
            out,
        )
        return 0 if ok else 1
    out.write(f"quantized: {qpath}: {report.summary}; reference: {rpath}\n")
    quant_weights(report, out, too_far)
    if rest.leaves:
        out.write("\n")
        rows = [
            [
                display(k),
                str(leaf.dtype_a),
                num(leaf.max_abs_err),
                num(leaf.max_rel_err),
                num(leaf.max_ulp),
                colour("ok" if leaf.ok else "DIFF", leaf.ok, out),
            ]
            for k, leaf in rest.leaves.items()
        ]
        table(rows, ["tensor", "dtype", "max abs", "max rel", "max ulp", "verdict"], out)
    for name in report.unmatched:
        out.write(f"only in {qpath}: {name}\n")
    for name in only_q:
        out.write(f"only in {qpath}: {name}\n")
    for name in only_ref:
        out.write(f"only in {rpath}: {name}\n")
    out.write("verdict: " + colour(quant_verdict(report, ok, too_far, args.rtol), ok, out) + "\n")
    return 0 if ok else 1
