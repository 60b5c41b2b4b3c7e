"""The ``tensorbridge`` command line: a thin argparse shell over the public API."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tensorbridge",
        description="Move tensors between PyTorch and NumPy without losing a bit.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "demo",
        help="convert a small bf16 model's weights both ways and report",
        description="Offline, in seconds: a bf16 TransformerEncoderLayer's weights to NumPy "
        "and back.\n\nexample:\n  tensorbridge demo",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 failure, 2 usage error)."""
    args = _parser().parse_args(argv)
    if args.command == "demo":
        from ._demo import run

        return run(sys.stdout)
    return 2  # pragma: no cover - argparse rejects unknown commands
