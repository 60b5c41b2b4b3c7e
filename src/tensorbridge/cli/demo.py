"""``tensorbridge demo``: convert a small bf16 model's weights both ways and report, offline
(:mod:`tensorbridge._demo`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ._options import command

EXAMPLES = "example:\n  tensorbridge demo"


def add_parser(subparsers: Any) -> None:
    command(
        subparsers,
        "demo",
        "convert a small bf16 model's weights both ways and report, offline",
        EXAMPLES,
    )


def run(args: argparse.Namespace) -> int:
    from .._demo import run as demo

    return demo(sys.stdout)
