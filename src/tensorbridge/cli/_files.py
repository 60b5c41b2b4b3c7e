"""Opening the checkpoints a command reads, and asking what they hold.

:func:`open_file` is every command's ``tb.open``: it applies the reading options
(``--as-dtype``, ``--dequantize`` for GGUF, ``--follow-links``) and prints the reader's
notes unless ``--quiet``. The library is imported inside the functions.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
from typing import TYPE_CHECKING, Any

from ..errors import TensorBridgeError
from ._errors import cli_words, note
from ._options import dtype_arg
from ._output import plural

if TYPE_CHECKING:
    from .._tensorfile import TensorFile


def open_file(
    path: str, args: argparse.Namespace, *, schemes: bool = False, block_size: Any = None
) -> TensorFile:
    """Open a source file, printing what is worth knowing about how it was read.

    ``--dequantize`` applies to GGUF files (compare A B), and with ``schemes`` to
    checkpoints of codes and scales too, read through ``--scheme`` and ``block_size``.
    """
    from .. import io as tbio

    dequantize = dtype_arg(args.dequantize, "--dequantize", floating=True)
    gguf = dequantize is not None and is_gguf(path)  # its blocks dequantized as it is read
    codes = dequantize is not None and schemes and not gguf  # codes and scales: a scheme
    if not gguf and not codes:
        dequantize = None  # it applies to the GGUF files among those read (compare A B)
    f = tbio.open(
        path,
        dtype=dtype_arg(args.as_dtype, "--as-dtype"),
        dequantize=dequantize,
        scheme=args.scheme if codes else None,
        block_size=block_size if codes else None,
        follow_links=getattr(args, "follow_links", False),
    )
    if not args.quiet:
        for text in f.notes:
            note(text)
    return f


def is_gguf(path: str) -> bool:
    """Whether ``path`` holds a GGUF file, by content (False when it cannot be read)."""
    from pathlib import Path

    from ..io import by_kind, detect, resolve

    try:
        fmt = by_kind(detect(resolve(Path(path))))
    except (OSError, TensorBridgeError):
        return False  # opening it says what is wrong
    return fmt is not None and fmt.dequantizes


def select(names: list[str], include: list[str], exclude: list[str]) -> list[str]:
    """``names`` matching an ``--include`` pattern (if any) and no ``--exclude`` pattern."""
    kept = [n for n in names if not include or any(fnmatch.fnmatchcase(n, p) for p in include)]
    return [n for n in kept if not any(fnmatch.fnmatchcase(n, p) for p in exclude)]


def quant_plan(f: TensorFile, scheme: str | None, block_size: Any) -> Any:
    """The quantization plan of an open file (``--scheme`` / ``--block-size`` applied)."""
    from ..quant import plan, read_config

    index = {n: f.info(n) for n in f if n not in f.unsupported()}
    opts = {"block_size": block_size} if block_size is not None else {}
    return plan(
        index, read_config(getattr(f, "path", None), follow_links=f.follow_links), scheme, opts
    )


def convertible(
    src: TensorFile, names: list[str], args: argparse.Namespace, carried: int = 0
) -> tuple[list[str], dict[str, str]]:
    """The selected names convert can write, and the entries it skips (with --skip-unsupported);
    ``carried``: how many more entries are copied as they are (NumPy to NumPy)."""
    unsupported = {n: why for n, why in src.unsupported().items() if n in names}
    if unsupported and not args.skip_unsupported:
        first = next(iter(unsupported))
        raise TensorBridgeError(
            f"{cli_words(unsupported[first])}; {plural(len(unsupported), 'entry')} cannot be "
            f"converted: pass --exclude {first}{' (each)' if len(unsupported) > 1 else ''} "
            "or --skip-unsupported"
        )
    for name, why in unsupported.items():
        print(f"skipped {name}: {cli_words(why)}", file=sys.stderr)
    kept = [n for n in names if n not in unsupported]
    if not kept and not carried:  # one rule for every convert path: nothing to write is an error
        raise TensorBridgeError(
            f"every selected entry of {args.src} is unsupported ({plural(len(names), 'entry')} "
            "skipped); nothing to convert, so nothing was written"
        )
    return kept, unsupported
