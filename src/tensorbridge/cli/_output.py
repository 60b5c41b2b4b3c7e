"""What the commands print: aligned tables, sizes, numbers, plurals, JSON.

Colour only on a terminal (and never with ``NO_COLOR``); numbers right-aligned; JSON
with ``default=str`` so any value a report holds prints. NumPy is imported only when
a value needs it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Sequence, Set
from typing import Any, TextIO

_ANSI = re.compile(r"\033\[[0-9;]*m")


def colour(text: str, ok: bool, out: TextIO) -> str:
    """``text`` green (``ok``) or red, on a terminal that allows colour."""
    if not (hasattr(out, "isatty") and out.isatty()) or os.environ.get("NO_COLOR"):
        return text
    return f"\033[{32 if ok else 31}m{text}\033[0m"


def _visible(cell: str) -> int:
    return len(_ANSI.sub("", cell))


def table(rows: list[list[str]], headers: list[str], out: TextIO) -> None:
    """Print ``rows`` under ``headers``, columns aligned, numbers to the right."""
    widths = [max(_visible(str(c)) for c in col) for col in zip(headers, *rows, strict=False)]
    numeric = [all(_is_number(r[i]) for r in rows) and bool(rows) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        padded = []
        for c, w, num in zip(cells, widths, numeric, strict=False):
            pad = " " * (w - _visible(str(c)))
            padded.append(pad + str(c) if num else str(c) + pad)
        return "  ".join(padded).rstrip()

    out.write(line(headers) + "\n")
    out.write("  ".join("-" * w for w in widths) + "\n")
    for r in rows:
        out.write(line(r) + "\n")


def _is_number(s: str) -> bool:
    try:
        float(s.replace(",", "").split()[0])
    except (ValueError, IndexError):
        return False
    return True


def size(n: int) -> str:
    """``n`` bytes for people: ``12 B``, ``1.5 KiB``, ..."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)  # pragma: no cover


def num(x: Any) -> str:
    """A table cell for a number: ``-`` for None, integers with commas, floats to 4 digits."""
    import numpy as np

    if x is None:
        return "-"
    if isinstance(x, int | np.integer):
        return f"{int(x):,}"
    x = float(x)
    if x != x or x in (float("inf"), float("-inf")):
        return str(x)
    return f"{x:.4g}"


def dump(obj: Any, out: TextIO) -> None:
    """``obj`` as indented JSON and a newline."""
    json.dump(obj, out, indent=2, default=str)
    out.write("\n")


def plural(n: int, word: str) -> str:
    """``1 entry``, ``2 entries``, ``3 mismatches``: English plurals of the words used here."""
    if n == 1:
        return f"{n:,} {word}"
    if word.endswith("y") and word[-2:-1] not in ("a", "e", "o", "u"):
        return f"{n:,} {word[:-1]}ies"
    if word.endswith(("s", "x", "ch", "sh")):
        return f"{n:,} {word}es"
    return f"{n:,} {word}s"


def clip(text: str, limit: int = 200) -> str:
    """A long metadata value (a GGUF tokenizer's 150,000 tokens) cut short for the table."""
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]}... ({len(text):,} characters; --json shows them all)"


def display(path: str) -> str:
    """``['a.b']`` -> ``a.b`` for the flat names of a file; deeper paths stay as they are."""
    if path.startswith("['") and path.endswith("']") and "']['" not in path:
        return path[2:-2]
    return path


def quant_weights(report: Any, out: TextIO, too_far: Set[str] = frozenset()) -> None:
    """The per-weight table of a QuantReport, and its worst blocks."""
    weights = report.weights
    e8m0 = any(w.e8m0_min is not None for w in weights.values())
    errors = any(w.max_abs_err is not None for w in weights.values())
    headers = ["weight", "scheme", "blocks", "saturated"]
    headers += ["e8m0 0x00", "e8m0 0xfe", "e8m0 NaN"] if e8m0 else []
    headers += ["max abs", "max rel"] if errors else []
    headers += ["nan", "inf", "verdict"]
    rows = []
    for name, w in weights.items():
        cells = [name, w.scheme, num(w.blocks), num(w.saturated_blocks)]
        if e8m0:
            cells += [num(w.e8m0_min), num(w.e8m0_max), num(w.e8m0_nan)]
        if errors:
            cells += [num(w.max_abs_err), num(w.max_rel_err)]
        good = w.ok and name not in too_far
        verdict = "ok" if good else "BAD" if not w.ok else "DIFF"
        if w.problem:
            verdict = f"BAD ({w.problem})"
        cells += [num(w.nan_produced), num(w.inf_produced), colour(verdict, good, out)]
        rows.append(cells)
    table(rows, headers, out)
    if report.worst_blocks:
        out.write("worst blocks (max rel: the block's max abs error / its largest |reference|):\n")
        for b in report.worst_blocks:
            out.write(
                f"  {b.tensor} block {tuple(b.block)}: max abs {num(b.max_abs_err)}, "
                f"max rel {num(b.max_rel_err)}\n"
            )


def quant_verdict(report: Any, ok: bool, too_far: Set[str], rtol: float | None) -> str:
    """The verdict line of a QuantReport (compare, cast-report --scheme)."""
    bad = [n for n, w in report.weights.items() if not w.ok]
    if ok:
        worst = report.worst_blocks[0] if report.worst_blocks else None
        where = f" ({worst.tensor} block {tuple(worst.block)})" if worst else ""
        rels = [w.max_rel_err for w in report.weights.values() if w.max_rel_err is not None]
        tail = f"; worst block max rel {num(max(rels))}{where}" if rels else ""
        return "no NaN or inf produced" + tail
    problems = []
    if bad:
        problems.append(f"{plural(len(bad), 'weight')} with NaN / inf or unreadable")
    if too_far:
        problems.append(f"{plural(len(too_far), 'weight')} beyond --rtol {rtol}")
    return ", ".join(problems) or "tensors differ or are missing"


def conversion_report(
    summary: dict[str, Any], args: argparse.Namespace, out: TextIO, ok: bool, cast: Any
) -> int:
    """Print a conversion's summary (JSON, or a line and the verdict of --verify)."""
    created = getattr(args, "created", None)
    if created is not None and os.path.isdir(created):
        summary["created_directory"] = created
    if args.json:
        dump(summary, out)
        return 0 if ok else 1
    out.write(
        f"converted {plural(summary['tensors'], 'tensor')} ({size(summary['bytes_in'])} in, "
        f"{size(summary['bytes_out'])} out) {args.src} -> {summary['dst']} in "
        f"{summary['seconds']:.2f} s"
        + (f" (created the directory {created}/)" if "created_directory" in summary else "")
        + "\n"
    )
    if "quantized" in summary:
        config = f"; {summary['config']} written" if summary["config"] else ""
        out.write(f"quantized: {summary['quantized']}{config}\n")
    if args.verify:
        if not ok:
            verdict = plural(len(summary["problems"]), "mismatch")
        elif cast is not None:
            verdict = (
                f"bit-exact to the source cast to {cast.name} (torch's kernel); "
                "the cast itself may round: see tensorbridge cast-report"
            )
        else:
            verdict = "bit-exact"
        out.write("verify: " + colour(verdict, ok, out) + "\n")
        for p in summary["problems"]:
            out.write(f"  {p}\n")
    return 0 if ok else 1
