"""The options several commands share, and how their values are read.

Each command module adds its parser with :func:`command`; reading commands take
:func:`reading`'s options (``--as-dtype``, ``--quiet``, ``--no-progress``,
``--follow-links``, and ``--dequantize`` but for convert, which has its own). An
option whose value makes no sense raises :class:`~._errors.UsageError` (exit 2).
Nothing here imports torch, NumPy or the readers: ``--help`` stays as fast as the
interpreter.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import TensorBridgeError
from ._errors import UsageError


class Parser(argparse.ArgumentParser):
    """A parser whose epilog may be made when the help is printed: convert's destinations
    come from the format table, whose package imports torch, which ``--help`` must not."""

    lazy_epilog: tuple[str, ...] = ()

    def format_help(self) -> str:
        if self.lazy_epilog:
            from .._help_text import DESTINATIONS  # no import of the format table

            self.epilog = DESTINATIONS + "\n\n" + "".join(self.lazy_epilog)
            self.lazy_epilog = ()
        return super().format_help()


def command(
    subparsers: Any, name: str, help: str, examples: str, *, destinations: bool = False
) -> argparse.ArgumentParser:
    """A command's parser: ``help`` is its summary and description, ``examples`` its epilog
    (after the table of convert's destinations, with ``destinations``)."""
    p: Parser = subparsers.add_parser(
        name,
        help=help,
        description=help[0].upper() + help[1:] + ".",
        epilog=examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if destinations:
        p.lazy_epilog = (examples,)
    return p


def reading(p: argparse.ArgumentParser, dequantize: bool = True) -> None:
    """The options of a command that reads checkpoints."""
    p.add_argument(
        "--as-dtype",
        metavar="DTYPE",
        help="read raw-byte .npy/.npz members (np.save of ml_dtypes arrays) as DTYPE",
    )
    if dequantize:  # convert has its own, which also reads codes + scales
        p.add_argument(
            "--dequantize",
            metavar="DTYPE",
            help="read a GGUF file's quantized tensors as DTYPE values (bf16, f16, f32)",
        )
    p.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="print nothing on stderr but errors: no notes, no progress bar "
        "(--no-progress drops the bar only)",
    )
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="never show a progress bar (notes still print; --quiet drops both)",
    )
    p.add_argument(
        "--follow-links",
        action="store_true",
        help="read files a checkpoint names (shards, chunks, config.json) that are links "
        "leading out of its directory",
    )


def scheme_options(p: argparse.ArgumentParser, help: str) -> None:
    """``--scheme`` (with ``help``) and ``--block-size``, for the commands that read schemes."""
    p.add_argument("--scheme", metavar="NAME", help=help)
    p.add_argument(
        "--block-size",
        metavar="R,C",
        help="fp8 block-wise scales' block, when no config.json gives it (128,128)",
    )


SHORT = ("bf16", "f16", "f32", "f64")  # the aliases the help and the docs advertise


def dtype_arg(spec: str | None, option: str, floating: bool = False) -> Any:
    """A dtype option's row; an unknown or (for ``floating``) non-float name is a usage error."""
    if spec is None:
        return None
    from ..dtypes import dtype_table, resolve_dtype

    try:
        row = resolve_dtype(spec)
    except TensorBridgeError:
        row = None
    if row is None or (floating and not row.is_floating):
        rows = [r for r in dtype_table() if r.is_floating or not floating]
        names = [r.name for r in rows] + [a for r in rows for a in r.aliases if a in SHORT]
        what = "a floating-point dtype" if floating else "a dtype"
        raise UsageError(f"{option} {spec} is not {what}; pass one of {', '.join(names)}")
    return row


def block_size(args: argparse.Namespace) -> tuple[int, int] | None:
    """``--block-size R,C`` as two positive ints (a usage error otherwise)."""
    if args.block_size is None:
        return None
    try:
        sizes = tuple(int(b) for b in args.block_size.split(","))
    except ValueError:
        sizes = ()
    if len(sizes) != 2 or min(sizes) <= 0:
        raise UsageError(f"--block-size {args.block_size}: pass two positive sizes, 128,128")
    return sizes[0], sizes[1]


def check_tolerance(value: float | None, option: str) -> None:
    """``--rtol`` / ``--atol``: a number >= 0 (a usage error otherwise)."""
    if value is not None and not value >= 0:
        raise UsageError(f"{option} {value} is not a tolerance; pass a number >= 0")


def progress(args: argparse.Namespace) -> bool | None:
    """The library's ``progress=``: False with ``--quiet`` / ``--no-progress``, else auto."""
    return False if args.quiet or getattr(args, "no_progress", False) else None
