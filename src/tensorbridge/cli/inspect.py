"""``tensorbridge inspect``: list the tensors of checkpoint files, shard indexes and
directories (with ``--stats``, their values' statistics; for a quantized checkpoint,
its scheme and each weight's codes and scales).

Every file is reported: one that cannot be read is an error line (a JSON entry with
``"error"``) and exit status 1 once the others are listed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TextIO

from ..errors import TensorBridgeError
from ._errors import EXIT_FAILURE, EXIT_OK, cli_words, error, message
from ._files import open_file
from ._options import command, progress, reading
from ._output import clip, dump, num, plural, size, table

if TYPE_CHECKING:
    from .._tensorfile import TensorFile

EXAMPLES = (
    "examples:\n  tensorbridge inspect model.safetensors\n"
    "  tensorbridge inspect ckpt/ --stats --json"
)


def add_parser(subparsers: Any) -> None:
    p = command(
        subparsers,
        "inspect",
        "list the tensors of checkpoint files, shard indexes and checkpoint directories",
        EXAMPLES,
    )
    p.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="a checkpoint file, shard index or directory (every one is listed; a file that "
        "cannot be read is an error and exit status 1 after the others)",
    )
    p.add_argument("--stats", action="store_true", help="add min/max/mean/std and NaN/inf counts")
    p.add_argument("--json", action="store_true", help="print JSON for scripts (a list of files)")
    reading(p)


def run(args: argparse.Namespace) -> int:
    out = sys.stdout
    report: list[dict[str, Any]] = []
    for path in args.files:
        try:
            report.append(_inspect_file(path, args))
        except (TensorBridgeError, OSError, ValueError, TypeError, KeyError) as e:
            if args.debug:
                raise
            msg = message(e)
            report.append({"file": str(path), "error": msg})
            if not args.json:
                error(args.command, msg)
    failed = any("error" in file for file in report)
    status = EXIT_FAILURE if failed else EXIT_OK
    report_text = [file for file in report if "error" not in file]
    if args.json:
        dump(report, out)
        return status
    for i, file in enumerate(report_text):
        if i:
            out.write("\n")
        readable = [t for t in file["tensors"] if "unsupported" not in t]
        total = sum(t["nbytes"] for t in readable if "tied_to" not in t)
        line = f"{file['file']}: {plural(len(readable), 'tensor')}, {size(total)}"
        skipped = len(file["tensors"]) - len(readable)
        out.write(line + (f", {skipped} unsupported" if skipped else "") + "\n")
        if file["metadata"]:
            shown = {k: _clip_value(v) for k, v in file["metadata"].items()}
            out.write("metadata: " + json.dumps(shown, ensure_ascii=False) + "\n")
        quant = file["quantization"]
        if quant is not None:
            out.write(f"quantized: {quant.get('summary') or quant.get('refused')}\n")
        headers = ["name", "dtype", "shape", "size"]
        if args.stats:
            headers += ["min", "max", "mean", "std", "nan", "inf"]
        rows: list[list[str]] = []
        for t in file["tensors"]:
            if "unsupported" in t:
                rows.append([t["name"], "unsupported", "-", "-"] + ["-"] * (len(headers) - 4))
                continue
            cell = f"tied to {t['tied_to']}" if "tied_to" in t else size(t["nbytes"])
            cells = [t["name"], t["dtype"], str(tuple(t["shape"])), cell]
            if args.stats:
                st = t["stats"]
                cells += [num(st.get(k)) for k in ("min", "max", "mean", "std", "nan_count")]
                cells.append(num(st.get("posinf_count", 0) + st.get("neginf_count", 0)))
            rows.append(cells)
        table(rows, headers, out)
        for t in file["tensors"]:
            if "unsupported" in t:
                out.write(f"unsupported: {cli_words(t['unsupported'])}\n")
        if quant is not None and quant.get("details"):
            out.write("\n")
            _quant_table(quant["details"], args.stats, out)
    return status


def _inspect_file(path: str, args: argparse.Namespace) -> dict[str, Any]:
    """One file's entry of inspect's report."""
    from .._progress import progress_bar

    with open_file(path, args) as f:
        unsupported = f.unsupported()
        names = [n for n in f if n not in unsupported]
        bar = progress_bar(
            sum(f.nbytes(n) for n in names) if args.stats else 0,
            f"stats {os.path.basename(path)}",
            progress(args),
            tensors=len(names) if args.stats else 0,
            work="check",
        )
        tensors = []
        try:
            for name in f:
                if name in unsupported:
                    tensors.append({"name": name, "unsupported": unsupported[name]})
                    continue
                row, shape = f.info(name)
                entry: dict[str, Any] = {
                    "name": name,
                    "dtype": row.name,
                    "shape": list(shape),
                    "nbytes": f.nbytes(name),
                }
                if name in f.aliases:
                    entry["tied_to"] = f.aliases[name]
                if args.stats:
                    from .. import diagnostics  # torch's reductions: only for --stats

                    entry["stats"] = diagnostics.stats(f[name]).to_dict()
                    bar.update(entry["nbytes"])
                tensors.append(entry)
        finally:
            bar.close()
        return {
            "file": str(path),
            "metadata": _typed_metadata(f),
            "notes": list(f.notes),
            "quantization": _quantization(f, unsupported, args),
            "tensors": tensors,
        }


def _typed_metadata(f: TensorFile) -> dict[str, Any]:
    """``f.metadata`` with each value as the format types it, where JSON can say it: a GGUF
    array is a JSON array, a bool a JSON boolean, a UINT32 a number; text stays text."""
    typed = f.plain_values()
    out: dict[str, Any] = {}
    for key, text in f.metadata.items():
        value = _plain_json(typed[key]) if key in typed else None
        out[key] = text if value is None else value
    return out


def _plain_json(value: Any) -> Any:
    """``value`` as JSON's types (NumPy scalars unwrapped), or None when JSON has none for it."""
    import numpy as np

    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        value = value.item()
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, list | tuple):
        items = [_plain_json(v) for v in value]
        return None if any(i is None for i in items) else items
    return None


def _quant_table(details: Mapping[str, Any], stats: bool, out: TextIO) -> None:
    """inspect's table of quantized weights: codes, scales, and with --stats their values."""
    e8m0 = any("e8m0_at_limits" in d["scales"] for d in details.values())
    headers = ["quantized weight", "scheme", "codes", "scales"]
    if stats:
        headers += ["blocks", "saturated"]
        headers += ["e8m0 0x00", "e8m0 0xfe", "e8m0 NaN"] if e8m0 else []
        headers += ["min", "max", "mean", "std", "nan", "inf"]
    rows = []
    for name, d in details.items():
        c, sc = d["codes"], d["scales"]
        cells = [
            name,
            d["scheme"],
            f"{c['dtype']} {tuple(c['shape'])}",
            f"{sc['dtype']} {tuple(sc['shape'])}",
        ]
        if stats:
            cells += [num(d["blocks"]), num(d["saturated_blocks"])]
            if e8m0:
                limits = sc.get("e8m0_at_limits", {})
                cells += [num(limits.get(k)) for k in ("0x00", "0xfe", "nan")]
            st = d["stats"]
            cells += [num(st.get(k)) for k in ("min", "max", "mean", "std")]
            cells += [num(d["nan_produced"]), num(d["inf_produced"])]
        rows.append(cells)
    table(rows, headers, out)


def _clip_value(value: Any) -> Any:
    """A metadata value for the table: typed as in ``--json``, a long one cut short as text."""
    if isinstance(value, str):
        return clip(value)
    text = json.dumps(value)
    return value if len(text) <= 200 else clip(text)


def _quantization(
    f: TensorFile, unsupported: Mapping[str, str], args: argparse.Namespace
) -> dict[str, Any] | None:
    """The scheme a checkpoint is quantized with (None when it is not), or why it is refused;
    with ``--stats``, each weight's dequantized values, computed a block row at a time."""
    from .._progress import progress_bar
    from ..errors import QuantizationError
    from ..quant import SCHEMES, plan, read_config

    index = {n: f.info(n) for n in f if n not in unsupported}
    try:
        p = plan(index, read_config(getattr(f, "path", None), follow_links=f.follow_links))
    except QuantizationError as e:
        return {"refused": str(e)}
    if not p.quantized:
        return None
    details: dict[str, Any] = {}
    bar = progress_bar(
        sum(f.nbytes(g.parts["codes"]) for g in p.groups) if args.stats else 0,
        "dequantized stats",
        progress(args),
        tensors=len(p.groups) if args.stats else 0,
        work="check",
    )
    try:
        for g in p.groups:
            (crow, cshape), (srow, sshape) = index[g.parts["codes"]], index[g.parts["scale"]]
            entry: dict[str, Any] = {
                "scheme": g.scheme,
                "shape": list(g.shape),
                "codes": {"name": g.parts["codes"], "dtype": crow.name, "shape": list(cshape)},
                "scales": {"name": g.parts["scale"], "dtype": srow.name, "shape": list(sshape)},
            }
            if args.stats:
                from ..diagnostics import QuantWeight, weight_report

                parts = {role: f.get(stored, framework="torch") for role, stored in g.parts.items()}
                w: QuantWeight = weight_report(SCHEMES[g.scheme], g, parts)
                if w.e8m0_min is not None:
                    entry["scales"]["e8m0_at_limits"] = {
                        "0x00": w.e8m0_min,
                        "0xfe": w.e8m0_max,
                        "nan": w.e8m0_nan,
                    }
                entry["blocks"] = w.blocks
                entry["saturated_blocks"] = w.saturated_blocks
                entry["nan_produced"] = w.nan_produced
                entry["inf_produced"] = w.inf_produced
                entry["stats"] = w.stats.to_dict()
                bar.update(f.nbytes(g.parts["codes"]))
            details[g.name] = entry
    finally:
        bar.close()
    return {
        "summary": p.summary(),
        "schemes": list(p.schemes),
        "weights": {g.name: {"scheme": g.scheme, **dict(g.parts)} for g in p.groups},
        "dropped": list(p.dropped),
        "details": details,
    }
