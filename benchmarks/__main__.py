"""``python -m benchmarks``: run the benchmarks; write the report or print the tables.

>>> main(["--quick", "--out", "/tmp/bench"])  # doctest: +SKIP
0
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .harness import SECTIONS, BenchError, run, show

EXAMPLES = """examples:
  python -m benchmarks --out docs/bench          the published report (minutes, ~13 GiB disk)
  python -m benchmarks --quick --out /tmp/bench  the CI smoke run
  python -m benchmarks --section casts --section overhead   print two sections' tables"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Benchmark tensorbridge against plain torch / NumPy / safetensors, "
        "side by side in one run.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick", action="store_true", help="a fast smoke run (its figures are not measurements)"
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="write DIR/report.md and its PNG plots (default: print the tables to stdout)",
    )
    p.add_argument(
        "--scratch",
        metavar="DIR",
        help="temporary files (default: the system's temp dir; the full run needs ~13 GiB)",
    )
    p.add_argument(
        "--section",
        action="append",
        choices=SECTIONS,
        metavar="KEY",
        help=f"run only this section (repeatable): {', '.join(SECTIONS)}",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (1 when a section failed)."""
    args = parser().parse_args(argv)
    keys = args.section or list(SECTIONS)
    if args.out is None:
        return show(keys, args.quick, scratch=args.scratch, log=sys.stderr)
    try:
        report = run(args.out, args.quick, sections=keys, scratch=args.scratch, log=sys.stderr)
    except BenchError as e:
        print(f"python -m benchmarks: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    print(f"wrote {report} and its plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
