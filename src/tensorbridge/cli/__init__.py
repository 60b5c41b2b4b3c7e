"""The ``tensorbridge`` command line: a thin argparse shell over the public API.

Commands: ``inspect``, ``convert``, ``compare``, ``cast-report``, ``demo``, one module
each (:data:`COMMANDS`), each with ``add_parser(subparsers)`` and ``run(args) -> int``:
it calls the library and formats what it returns, aligned tables (colour only on a
terminal, :mod:`._output`) or ``--json``. A user error is one line on stderr and exit
status 1 (2 for usage errors), an error nobody foresaw one line too (a bug to report);
``--debug`` shows the traceback instead. A reader that goes away (``| head``) ends the
command quietly with 141 (:mod:`._errors`). torch, NumPy and the library's modules are
imported inside ``run``, so ``--help`` answers without loading them.

>>> main(["--help"])  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import textwrap
from collections.abc import Sequence
from types import ModuleType

from .. import __version__
from ..errors import TensorBridgeError
from ._errors import (
    EXIT_FAILURE,
    EXIT_PIPE,
    EXIT_USAGE,
    UsageError,
    enable_faulthandler,
    error,
    message,
)
from ._options import Parser
from ._output import plural as _plural  # noqa: F401 - tests name it here

__all__ = [
    "COMMANDS",
    "destinations_from_table",
    "main",
    "save_options_from_table",
    "write_help_text",
]

# A command's name -> its module under tensorbridge.cli; the order of ``--help``.
COMMANDS = {
    "inspect": "inspect",
    "convert": "convert",
    "compare": "compare",
    "cast-report": "cast_report",
    "demo": "demo",
}


def _command(name: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{COMMANDS[name]}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tensorbridge",
        description="Move tensors between PyTorch and NumPy without losing a bit.",
        epilog="example:\n  tensorbridge demo\n\n"
        "run 'tensorbridge COMMAND --help' for a command's options and examples",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("--version", action="version", version=f"tensorbridge {__version__}")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=Parser
    )
    for name in COMMANDS:
        _command(name).add_parser(sub)
    return parser


def write_help_text() -> None:
    """Regenerate ``_help_text.py`` from the format table (a test checks it is current)."""
    import pathlib
    import pprint

    from .. import _help_text

    path = pathlib.Path(_help_text.__file__)
    head = path.read_text().split("DESTINATIONS = ")[0]
    path.write_text(
        f"{head}DESTINATIONS = {pprint.pformat(destinations_from_table())}\n\n"
        f"SAVE_OPTIONS = {pprint.pformat(save_options_from_table())}\n"
    )


def save_options_from_table() -> tuple[tuple[str, str, str, str], ...]:
    """The formats' save options ``convert`` offers (each row's ``cli_options``): option,
    metavar, help and the destination suffixes that take it."""
    from ..io import FORMATS

    found: dict[str, tuple[str, str, str, str]] = {}
    for f in FORMATS:
        for option, metavar, text in f.cli_options:
            _, _, _, suffixes = found.get(option, ("", "", "", ""))
            joined = ", ".join(filter(None, [suffixes, *f.suffixes]))
            found[option] = (option, metavar, text, joined)
    return tuple(found.values())


def destinations_from_table() -> str:
    """What each destination of convert keeps, from the format table (imports nothing heavy)."""
    from ..io import DIRECTORY_FORMAT, FORMATS, INDEX_SUFFIX

    rows = [(", ".join(f.suffixes), f.keeps) for f in FORMATS if f.writes]
    sharded = f"NAME{DIRECTORY_FORMAT.suffixes[0]}{INDEX_SUFFIX}"
    rows += [
        ("DIR/", f"model{DIRECTORY_FORMAT.suffixes[0]} inside (a DCP source: shards + index)"),
        (sharded, "shards of --max-shard-size and their index"),
        ("DIR/ --format npy", "a DCP source: one NAME.npy per tensor; no metadata"),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [
        textwrap.fill(
            keeps, 80, initial_indent=f"  {suffix:<{width}}  ", subsequent_indent=" " * (width + 4)
        )
        for suffix, keeps in rows
    ]
    return "destinations (by DST's suffix) and what each keeps:\n" + "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status: 0 ok, 1 failure, 2 usage error,
    141 the reader of the output went away (a closed pipe)."""
    enable_faulthandler()
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        status: int = _command(args.command).run(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return status
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, like the standard tools.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return EXIT_PIPE
    except UsageError as e:
        if args.debug:
            raise
        error(args.command, str(e))
        return EXIT_USAGE
    except (TensorBridgeError, OSError, ValueError, TypeError, KeyError) as e:
        if args.debug:
            raise
        error(args.command, message(e))
        return EXIT_FAILURE
    except Exception as e:  # a bug: one line, not a traceback
        if args.debug:
            raise
        error(
            args.command,
            f"unexpected {type(e).__name__}: {e} (a bug in tensorbridge: rerun with --debug "
            "for the traceback and report it)",
        )
        return EXIT_FAILURE
