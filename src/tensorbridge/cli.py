"""The ``tensorbridge`` command line: a thin argparse shell over the public API.

Commands: ``inspect``, ``convert``, ``compare``, ``cast-report``, ``demo``. Each calls the
library and formats what it returns: aligned tables (colour only on a terminal) or
``--json``. A user error is one line on stderr and exit status 1 (2 for usage errors),
an error nobody foresaw one line too (a bug to report); ``--debug`` shows the traceback
instead. A reader that goes away (``| head``) ends the command quietly with 141. torch,
NumPy and the library's modules are imported inside the commands that use them, so
``--help`` answers without loading them.

>>> main(["--help"])  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import functools
import json
import os
import re
import sys
import textwrap
import time
from collections.abc import Iterator, Mapping, Sequence, Set
from typing import TYPE_CHECKING, Any, TextIO

from . import __version__
from .errors import InvalidArgumentError, MissingExtraError, TensorBridgeError

if TYPE_CHECKING:
    import numpy as np

    from . import io as tbio
    from .io._common import TensorFile

_EXAMPLES = {
    "inspect": "examples:\n  tensorbridge inspect model.safetensors\n"
    "  tensorbridge inspect ckpt/ --stats --json",
    "convert": "examples:\n  tensorbridge convert pytorch_model.bin model.safetensors\n"
    "  tensorbridge convert model.safetensors out/ --float-dtype bf16 \\\n"
    "      --max-shard-size 5GB --verify\n"
    "  tensorbridge convert model.safetensors emb.npy --include 'embed*'\n"
    "  tensorbridge convert model-Q4_K_M.gguf out.safetensors --dequantize bf16\n"
    "  tensorbridge convert deepseek-fp8/ out/model.safetensors --dequantize bf16\n"
    "  tensorbridge convert dcp_checkpoint/ hf_model/ --max-shard-size 5GB --workers 4",
    "compare": "examples:\n  tensorbridge compare a.safetensors b.safetensors\n"
    "  tensorbridge compare ref.npz out.npz --rtol 1e-3 --plot errors.png\n"
    "  tensorbridge compare bf16_model/ mxfp4_model/ --scheme mxfp4",
    "cast-report": "examples:\n  tensorbridge cast-report model.safetensors --dtype bf16\n"
    "  tensorbridge cast-report model.safetensors --dtype float8_e4m3fn --plot ulps.png\n"
    "  tensorbridge cast-report model.safetensors --scheme nvfp4-modelopt",
    "demo": "example:\n  tensorbridge demo",
}


_ANSI = re.compile(r"\033\[[0-9;]*m")


class _UsageError(Exception):
    """A command line that makes no sense: exit status 2."""


EXIT_OK = 0
EXIT_FAILURE = 1  # an error, or a check that failed (compare outside tolerance, ...)
EXIT_USAGE = 2  # argparse's own status for a command line that makes no sense
EXIT_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader went away


class _Parser(argparse.ArgumentParser):
    """A parser whose epilog may be made when the help is printed: convert's destinations
    come from the format table, whose package imports torch, which ``--help`` must not."""

    lazy_epilog: tuple[str, ...] = ()

    def format_help(self) -> str:
        if self.lazy_epilog:
            from ._help_text import DESTINATIONS  # no import of the format table

            self.epilog = DESTINATIONS + "\n\n" + "".join(self.lazy_epilog)
            self.lazy_epilog = ()
        return super().format_help()


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
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )

    def command(name: str, help: str) -> argparse.ArgumentParser:
        p: _Parser = sub.add_parser(
            name,
            help=help,
            description=help[0].upper() + help[1:] + ".",
            epilog=_EXAMPLES[name],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if name == "convert":
            p.lazy_epilog = (_EXAMPLES[name],)
        return p

    def reading(p: argparse.ArgumentParser, dequantize: bool = True) -> None:
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
        p.add_argument("--scheme", metavar="NAME", help=help)
        p.add_argument(
            "--block-size",
            metavar="R,C",
            help="fp8 block-wise scales' block, when no config.json gives it (128,128)",
        )

    p = command(
        "inspect",
        "list the tensors of checkpoint files, shard indexes and checkpoint directories",
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

    p = command("convert", "convert a checkpoint between formats, streamed, atomically")
    p.add_argument(
        "src", metavar="SRC", help="the checkpoint to read: a file, shard index or directory"
    )
    p.add_argument(
        "dst",
        metavar="DST",
        help="the file to write; its suffix names the format (see destinations below); "
        "missing parent directories are created",
    )
    p.add_argument(
        "--float-dtype",
        metavar="DTYPE",
        help="cast floating-point tensors (bf16, f16, f32, float8_e4m3fn, ...)",
    )
    p.add_argument("--max-shard-size", metavar="SIZE", help="shard .safetensors output (5GB)")
    p.add_argument(
        "--dequantize",
        metavar="DTYPE",
        help="write quantized weights (GGUF blocks, codes + scales) as DTYPE (bf16, f16, f32)",
    )
    p.add_argument(
        "--scheme",
        metavar="NAME",
        help="the quantization scheme, when no config says it (fp8-block, mxfp4, ...)",
    )
    p.add_argument(
        "--quantize",
        metavar="SCHEME",
        help="write 2-D+ weights quantized (mxfp8, mxfp4, nvfp4-modelopt, "
        "nvfp4-compressed-tensors, fp8-block) in the scheme's published layout",
    )
    p.add_argument(
        "--layout",
        metavar="NAME",
        help="with --quantize mxfp4: gpt-oss writes openai/gpt-oss's experts "
        "NAME_blocks / NAME_scales (default: compressed-tensors)",
    )
    p.add_argument(
        "--element",
        metavar="TYPE",
        help="with --quantize mxfp8: the fp8 element type, e4m3 (default) or e5m2",
    )
    p.add_argument(
        "--metadata",
        action="append",
        default=[],
        metavar="KEY[:TYPE]=VALUE",
        help="add a metadata key (GGUF: general.architecture=llama is required); VALUE is "
        'JSON (2, 1e-5, true, [1, 2], "text") or else text; TYPE forces a GGUF type '
        "(uint64, float64, ...); repeatable",
    )
    p.add_argument(
        "--metadata-json",
        metavar="FILE",
        help="add the metadata keys of a JSON object in FILE (typed as --metadata's VALUE)",
    )
    p.add_argument(
        "--no-metadata",
        action="store_true",
        help="leave SRC's metadata out (a .pt source: its plain values, such as epoch)",
    )
    p.add_argument(
        "--block-size",
        metavar="R,C",
        help="fp8 block-wise block: to read when no config.json gives it, or to write "
        "(default 128,128)",
    )
    p.add_argument(
        "--ignore",
        action="append",
        default=[],
        metavar="PATTERN",
        help="with --quantize: keep weights matching PATTERN unquantized (glob; repeatable)",
    )
    p.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="PATTERN",
        help="keep only tensors whose name matches (glob; repeatable)",
    )
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="PATTERN",
        help="drop tensors whose name matches (glob; repeatable)",
    )
    p.add_argument(
        "--skip-unsupported",
        action="store_true",
        help="leave out entries that are not tensors (strings, objects), naming each on stderr",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace DST if it exists (even when it is SRC)"
    )
    p.add_argument(
        "--verify", action="store_true", help="re-read the output and check it against the source"
    )
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.add_argument(
        "--format",
        choices=("safetensors", "npy"),
        help="DCP source: npy writes DST as a directory of NAME.npy files",
    )
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="DCP source: write tensors in N local processes (byte-identical output)",
    )
    p.add_argument(
        "--dask-scheduler",
        metavar="ADDRESS",
        help="DCP source: run the tensor tasks on a dask.distributed cluster (shared disk)",
    )
    reading(p, dequantize=False)

    p = command("compare", "compare two files (or tensors) tensor by tensor")
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

    p = command("cast-report", "what casting every tensor of a file to DTYPE would do")
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

    command("demo", "convert a small bf16 model's weights both ways and report, offline")
    return parser


def write_help_text() -> None:
    """Regenerate ``_help_text.py`` from the format table (a test checks it is current)."""
    import pathlib
    import pprint

    from . import _help_text

    path = pathlib.Path(_help_text.__file__)
    head = path.read_text().split("DESTINATIONS = ")[0]
    path.write_text(f"{head}DESTINATIONS = {pprint.pformat(destinations_from_table())}\n")


def destinations_from_table() -> str:
    """What each destination of convert keeps, from the format table (imports nothing heavy)."""
    from .io._formats import DIRECTORY_FORMAT, FORMATS, INDEX_SUFFIX

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
    _enable_faulthandler()
    parser = _parser()
    args = parser.parse_args(argv)
    handler = {
        "inspect": _inspect,
        "convert": _convert,
        "compare": _compare,
        "cast-report": _cast_report,
        "demo": _demo,
    }[args.command]
    try:
        status = handler(args, sys.stdout)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return status
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, like the standard tools.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return EXIT_PIPE
    except _UsageError as e:
        if args.debug:
            raise
        _error(args.command, str(e))
        return EXIT_USAGE
    except (TensorBridgeError, OSError, ValueError, TypeError, KeyError) as e:
        if args.debug:
            raise
        _error(args.command, _message(e))
        return EXIT_FAILURE
    except Exception as e:  # a bug: one line, not a traceback
        if args.debug:
            raise
        _error(
            args.command,
            f"unexpected {type(e).__name__}: {e} (a bug in tensorbridge: rerun with --debug "
            "for the traceback and report it)",
        )
        return EXIT_FAILURE


def _message(e: BaseException) -> str:
    """An expected error's message: a KeyError's text unquoted, an OSError without its
    ``[Errno N]`` (``missing.pt: No such file or directory``)."""
    if isinstance(e, KeyError) and e.args:
        return str(e.args[0])
    if isinstance(e, OSError) and e.strerror:
        return f"{e.filename}: {e.strerror}" if e.filename is not None else e.strerror
    return str(e)


def _error(command: str, message: str) -> None:
    """One line on stderr, in the command line's words (see :func:`_cli_words`)."""
    print(f"tensorbridge {command}: error: {_cli_words(message)}", file=sys.stderr)


def _enable_faulthandler() -> None:
    """A SIGBUS (a mapped file truncated by another process mid-read) prints a traceback."""
    import faulthandler

    if not faulthandler.is_enabled() and sys.__stderr__ is not None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            faulthandler.enable(file=sys.__stderr__)


# --- formatting -------------------------------------------------------------------------------


def _colour(text: str, ok: bool, out: TextIO) -> str:
    if not (hasattr(out, "isatty") and out.isatty()) or os.environ.get("NO_COLOR"):
        return text
    return f"\033[{32 if ok else 31}m{text}\033[0m"


def _visible(cell: str) -> int:
    return len(_ANSI.sub("", cell))


def _table(rows: list[list[str]], headers: list[str], out: TextIO) -> None:
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


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)  # pragma: no cover


def _num(x: Any) -> str:
    import numpy as np

    if x is None:
        return "-"
    if isinstance(x, int | np.integer):
        return f"{int(x):,}"
    x = float(x)
    if x != x or x in (float("inf"), float("-inf")):
        return str(x)
    return f"{x:.4g}"


def _dump(obj: Any, out: TextIO) -> None:
    json.dump(obj, out, indent=2, default=str)
    out.write("\n")


# --- files as mappings ------------------------------------------------------------------------


class _Lazy(Mapping[str, Any]):
    """Names of an open file, values read (mapped) only when asked: keeps convert streaming."""

    def __init__(self, f: TensorFile, names: list[str], carried: Mapping[str, Any]) -> None:
        self._f, self._names, self._carried = f, names, carried

    def __getitem__(self, name: str) -> Any:
        return self._carried[name] if name in self._carried else self._f[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def _select(names: list[str], include: list[str], exclude: list[str]) -> list[str]:
    kept = [n for n in names if not include or any(fnmatch.fnmatchcase(n, p) for p in include)]
    return [n for n in kept if not any(fnmatch.fnmatchcase(n, p) for p in exclude)]


# --- commands ---------------------------------------------------------------------------------


def _plural(n: int, word: str) -> str:
    """``1 entry``, ``2 entries``, ``3 mismatches``: English plurals of the words used here."""
    if n == 1:
        return f"{n:,} {word}"
    if word.endswith("y") and word[-2:-1] not in ("a", "e", "o", "u"):
        return f"{n:,} {word[:-1]}ies"
    if word.endswith(("s", "x", "ch", "sh")):
        return f"{n:,} {word}es"
    return f"{n:,} {word}s"


# The library's messages end in the fix a Python caller makes (``pass a.astype(np.float64)``,
# ``pass scheme=...``); a shell cannot act on those. Every error, note and skipped entry the
# command line prints passes through _cli_words once: a fix that has an option becomes that
# option, and a fix clause still naming a Python call is left out (the caller adds the
# command line's own fix, e.g. --exclude NAME / --skip-unsupported).
_OPTION_FIXES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), option)
    for pattern, option in (
        # the library's own hints, "X (command line: --x)": the option replaces X
        (r"dtype=, e\.g\. tb\.load\(path, dtype='\w+'\) \(command line: ([^)]+)\)", r"\1"),
        (r"dequantize='bf16' \(or 'f32', 'f16'; command line: ([^)]+)\)", r"\1 (or f32, f16)"),
        (r"\b\w+=(?:\([^)]*\)|[^\s;()]*) \(command line: ([^)]+)\)", r"\1"),
        (r", or read its blocks with raw\([^)]*\)", ""),  # a Python method, no option
        # Python arguments an option stands for
        (r"\bfloat_dtype=[\w.'\"]*", "--float-dtype DTYPE"),
        (r"\boverwrite=True\b", "--overwrite"),
        (r"\bscheme=(?:['\"][\w-]+['\"]|\.\.\.)?", "--scheme NAME"),
        (r"\bblock_size=(?:\(\d+, ?\d+\)|\.\.\.)?", "--block-size R,C"),
        (r"\bmax_shard_size=['\"]?\w*['\"]?", "--max-shard-size SIZE"),
        (r"\bquantize=['\"]?[\w-]*['\"]?", "--quantize SCHEME"),
        (r"\bdequantize=(?:torch|np)\.(\w+)", r"--dequantize \1"),
        (r"\bdtype=(?:torch|np)\.float32 to dequantize", "--dequantize f32 to dequantize"),
        (r"\bmetadata=False\b", "--no-metadata"),
    )
)
_PYTHON = re.compile(r"\w[(\[]|\b\w+=[\w'\"\[{(]|\b(?:np|torch|tb|ml_dtypes)\.\w")
_OPTION = re.compile(r"(?:^|\s)--[a-z]")  # a clause that names an option already speaks CLI
_FIX_VERBS = ("pass ", "use ", "call ", "convert ", "encode ", "take ", "or ", "save ", "e.g.")


def _cli_words(message: str) -> str:
    """``message`` as a command line says it: options for Python arguments, no Python calls.

    >>> _cli_words("x is float128; pass a.astype(np.float64), which rounds to 53 bits")
    'x is float128'
    >>> _cli_words("ambiguous; pass scheme='gptq' or block_size=(64, 64)")
    'ambiguous; pass --scheme NAME or --block-size R,C'
    >>> _cli_words("a.pt exists; pass overwrite=True (command line: --overwrite) to replace it")
    'a.pt exists; pass --overwrite to replace it'
    """
    first, sep, fixes = message.partition("; ")  # what was given (and why) stays as it is
    for pattern, option in _OPTION_FIXES:
        fixes = pattern.sub(option, fixes)
    kept = [first]
    for clause in fixes.split("; ") if sep else []:
        python = _PYTHON.search(clause) and not _OPTION.search(clause)
        if clause.lstrip("( ").startswith(_FIX_VERBS) and python:
            continue
        kept.append(clause)
    return "; ".join(_drop_python_aside(c) for c in kept)


def _drop_python_aside(clause: str) -> str:
    """A clause without a trailing parenthesis of Python (``first (e.g. np.frombuffer(...))``)."""
    start = clause.find(" (")
    python = ("e.g.", "np.", "torch.", "tb.", "a.", "a[")
    if start > 0 and clause.endswith(")") and clause[start + 2 :].startswith(python):
        return clause[:start]
    return clause


def _open(path: str, args: argparse.Namespace) -> TensorFile:
    """Open a source file, printing what is worth knowing about how it was read."""
    from . import io as tbio

    dequantize = _dtype_arg(args.dequantize, "--dequantize", floating=True)
    if dequantize is not None and not _is_gguf(path):
        dequantize = None  # it applies to the GGUF files among those read (compare A B)
    f = tbio.open(
        path,
        dtype=_dtype_arg(args.as_dtype, "--as-dtype"),
        dequantize=dequantize,
        follow_links=getattr(args, "follow_links", False),
    )
    if not args.quiet:
        for note in f.notes:
            print(f"note: {_cli_words(note)}", file=sys.stderr)
    return f


def _is_gguf(path: str) -> bool:
    from pathlib import Path

    from .io._detect import detect, resolve

    try:
        return detect(resolve(Path(path))) == "gguf"
    except (OSError, TensorBridgeError):
        return False  # opening it says what is wrong


def _dtype_arg(spec: str | None, option: str, floating: bool = False) -> Any:
    """A dtype option's row; an unknown or (for ``floating``) non-float name is a usage error."""
    if spec is None:
        return None
    from .dtypes import dtype_table, resolve_dtype

    try:
        row = resolve_dtype(spec)
    except TensorBridgeError:
        row = None
    if row is None or (floating and not row.is_floating):
        rows = [r for r in dtype_table() if r.is_floating or not floating]
        names = [r.name for r in rows] + [a for r in rows for a in r.aliases if a in _SHORT]
        what = "a floating-point dtype" if floating else "a dtype"
        raise _UsageError(f"{option} {spec} is not {what}; pass one of {', '.join(names)}")
    return row


_SHORT = ("bf16", "f16", "f32", "f64")  # the aliases the help and the docs advertise


def _progress(args: argparse.Namespace) -> bool | None:
    return False if args.quiet or getattr(args, "no_progress", False) else None


def _inspect(args: argparse.Namespace, out: TextIO) -> int:
    """Every file is reported: one that cannot be read is an error line (a JSON entry with
    ``"error"``) and exit status 1 once the others are listed."""
    report: list[dict[str, Any]] = []
    for path in args.files:
        try:
            report.append(_inspect_file(path, args))
        except (TensorBridgeError, OSError, ValueError, TypeError, KeyError) as e:
            if args.debug:
                raise
            msg = _message(e)
            report.append({"file": str(path), "error": msg})
            if not args.json:
                _error(args.command, msg)
    failed = any("error" in file for file in report)
    status = EXIT_FAILURE if failed else EXIT_OK
    report_text = [file for file in report if "error" not in file]
    if args.json:
        _dump(report, out)
        return status
    for i, file in enumerate(report_text):
        if i:
            out.write("\n")
        readable = [t for t in file["tensors"] if "unsupported" not in t]
        total = sum(t["nbytes"] for t in readable if "tied_to" not in t)
        line = f"{file['file']}: {_plural(len(readable), 'tensor')}, {_size(total)}"
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
            size = f"tied to {t['tied_to']}" if "tied_to" in t else _size(t["nbytes"])
            cells = [t["name"], t["dtype"], str(tuple(t["shape"])), size]
            if args.stats:
                st = t["stats"]
                cells += [_num(st.get(k)) for k in ("min", "max", "mean", "std", "nan_count")]
                cells.append(_num(st.get("posinf_count", 0) + st.get("neginf_count", 0)))
            rows.append(cells)
        _table(rows, headers, out)
        for t in file["tensors"]:
            if "unsupported" in t:
                out.write(f"unsupported: {_cli_words(t['unsupported'])}\n")
        if quant is not None and quant.get("details"):
            out.write("\n")
            _quant_table(quant["details"], args.stats, out)
    return status


def _inspect_file(path: str, args: argparse.Namespace) -> dict[str, Any]:
    """One file's entry of inspect's report."""
    from .io._common import progress_bar

    with _open(path, args) as f:
        unsupported = f.unsupported()
        names = [n for n in f if n not in unsupported]
        bar = progress_bar(
            sum(f.nbytes(n) for n in names) if args.stats else 0,
            f"stats {os.path.basename(path)}",
            _progress(args),
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
                    from . import diagnostics  # torch's reductions: only for --stats

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
            cells += [_num(d["blocks"]), _num(d["saturated_blocks"])]
            if e8m0:
                limits = sc.get("e8m0_at_limits", {})
                cells += [_num(limits.get(k)) for k in ("0x00", "0xfe", "nan")]
            st = d["stats"]
            cells += [_num(st.get(k)) for k in ("min", "max", "mean", "std")]
            cells += [_num(d["nan_produced"]), _num(d["inf_produced"])]
        rows.append(cells)
    _table(rows, headers, out)


def _clip_value(value: Any) -> Any:
    """A metadata value for the table: typed as in ``--json``, a long one cut short as text."""
    if isinstance(value, str):
        return _clip(value)
    text = json.dumps(value)
    return value if len(text) <= 200 else _clip(text)


def _clip(text: str, limit: int = 200) -> str:
    """A long metadata value (a GGUF tokenizer's 150,000 tokens) cut short for the table."""
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]}... ({len(text):,} characters; --json shows them all)"


def _quantization(
    f: TensorFile, unsupported: Mapping[str, str], args: argparse.Namespace
) -> dict[str, Any] | None:
    """The scheme a checkpoint is quantized with (None when it is not), or why it is refused;
    with ``--stats``, each weight's dequantized values, computed a block row at a time."""
    from .errors import QuantizationError
    from .io._common import progress_bar
    from .quant import SCHEMES, plan, read_config

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
        _progress(args),
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
                from .diagnostics import QuantWeight
                from .diagnostics._quant import weight_report

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


def _convertible(
    src: TensorFile, names: list[str], args: argparse.Namespace, carried: int = 0
) -> tuple[list[str], dict[str, str]]:
    """The selected names convert can write, and the entries it skips (with --skip-unsupported);
    ``carried``: how many more entries are copied as they are (NumPy to NumPy)."""
    unsupported = {n: why for n, why in src.unsupported().items() if n in names}
    if unsupported and not args.skip_unsupported:
        first = next(iter(unsupported))
        raise TensorBridgeError(
            f"{_cli_words(unsupported[first])}; {_plural(len(unsupported), 'entry')} cannot be "
            f"converted: pass --exclude {first}{' (each)' if len(unsupported) > 1 else ''} "
            "or --skip-unsupported"
        )
    for name, why in unsupported.items():
        print(f"skipped {name}: {_cli_words(why)}", file=sys.stderr)
    kept = [n for n in names if n not in unsupported]
    if not kept and not carried:  # one rule for every convert path: nothing to write is an error
        raise TensorBridgeError(
            f"every selected entry of {args.src} is unsupported ({_plural(len(names), 'entry')} "
            "skipped); nothing to convert, so nothing was written"
        )
    return kept, unsupported


def _block_size(args: argparse.Namespace) -> tuple[int, int] | None:
    """``--block-size R,C`` as two positive ints (a usage error otherwise)."""
    if args.block_size is None:
        return None
    try:
        sizes = tuple(int(b) for b in args.block_size.split(","))
    except ValueError:
        sizes = ()
    if len(sizes) != 2 or min(sizes) <= 0:
        raise _UsageError(f"--block-size {args.block_size}: pass two positive sizes, 128,128")
    return sizes[0], sizes[1]


def _metadata_args(args: argparse.Namespace, fmt: Any) -> dict[str, Any]:
    """``--metadata-json FILE``'s keys, then each ``--metadata KEY[:TYPE]=VALUE``.

    VALUE is read as JSON (``2``, ``1e-5``, ``true``, ``[1, 2]``, ``"2"``), else as
    text; a format that keeps text metadata (safetensors) keeps VALUE as given. TYPE
    names a GGUF value type (``uint64``, ``float64``, ``string``, ...).
    """
    if not args.metadata and not args.metadata_json:
        return {}
    if not fmt.metadata:
        from .io._formats import listing

        raise _UsageError(
            f"--metadata: {fmt.description} keeps no metadata; write "
            f"{listing(lambda f: f.metadata, ' or ')}"
        )
    out: dict[str, Any] = {}
    if args.metadata_json:
        try:
            with open(args.metadata_json, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            raise _UsageError(f"--metadata-json {args.metadata_json}: {e}") from None
        if not isinstance(doc, dict):
            raise _UsageError(
                f"--metadata-json {args.metadata_json} holds a {type(doc).__name__}; pass a "
                'JSON object ({"general.architecture": "llama", ...})'
            )
        out.update(doc if not fmt.text_metadata else {k: _text(v) for k, v in doc.items()})
    for item in args.metadata:
        key, sep, text = item.partition("=")
        key, colon, kind = key.partition(":")
        if not sep or not key:
            raise _UsageError(f"--metadata {item}: pass KEY=VALUE (general.architecture=llama)")
        if fmt.text_metadata:
            if colon:
                raise _UsageError(f"--metadata {item}: {fmt.description} keeps text; drop :{kind}")
            out[key] = text
            continue
        try:
            value: Any = json.loads(text)
        except ValueError:
            value = text
        if colon:
            if fmt.name != "gguf":
                raise _UsageError(f"--metadata {item}: :{kind} names a GGUF value type; drop it")
            from .io.gguf import metadata_value

            try:
                value = metadata_value(value, kind)
            except TensorBridgeError as e:
                raise _UsageError(f"--metadata {item}: {e}") from None
        out[key] = value
    return out


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _convert(args: argparse.Namespace, out: TextIO) -> int:
    from . import io as tbio
    from .io._formats import listing  # what each format can hold, for the messages
    from .io.safetensors import parse_size

    float_dtype = _dtype_arg(args.float_dtype, "--float-dtype", floating=True)
    dequantize = _dtype_arg(args.dequantize, "--dequantize", floating=True)
    block_size = _block_size(args)
    quantize = _quantize_arg(args, dequantize, float_dtype, block_size)
    if (args.scheme or args.block_size) is not None and dequantize is None and not quantize:
        raise _UsageError(
            "--scheme / --block-size say how to dequantize; pass --dequantize bf16 with them"
        )
    if dequantize is not None and float_dtype is not None:
        raise _UsageError("--dequantize already sets the weights' dtype; leave out --float-dtype")
    if args.workers is not None and args.workers < 1:
        raise _UsageError(f"--workers {args.workers}: pass a number of processes >= 1")
    if args.workers is not None and args.dask_scheduler is not None:
        raise _UsageError("pass --workers or --dask-scheduler, not both")
    # what the save creates is said in the summary, not done silently
    args.created = _missing_directory(args.dst, args.format == "npy" or _is_chunked(args.src))
    if args.format == "npy" or _is_chunked(args.src):
        if args.metadata or args.metadata_json:
            raise _UsageError(
                "--metadata applies to a checkpoint converted to safetensors, GGUF, .pt or "
                "Zarr, not to a DCP checkpoint's conversion"
            )
        if quantize is not None:
            raise _UsageError(
                "--quantize reads a safetensors (or .bin, .pt, .npz) checkpoint; convert the DCP "
                "checkpoint to safetensors first"
            )
        if dequantize is not None:
            raise _UsageError(
                "--dequantize reads quantized checkpoints; a DCP checkpoint is converted as "
                "stored (pass --float-dtype to cast it)"
            )
        return _convert_chunked(args, out, float_dtype)
    try:
        dst = tbio.destination(args.dst)
        if args.max_shard_size is not None:
            parse_size(args.max_shard_size)
    except (TensorBridgeError, ValueError) as e:
        raise _UsageError(str(e)) from None
    if args.max_shard_size is not None and not dst.format.sharding:
        raise _UsageError(
            f"--max-shard-size needs a {listing(lambda f: f.sharding, ' or ')} destination "
            f"(or a directory), not {args.dst}"
        )
    given_meta = _metadata_args(args, dst.format)
    if quantize is not None and dst.format.name != "safetensors":
        raise _UsageError(
            f"--quantize writes the schemes' published safetensors layouts, not {args.dst}; "
            "write a .safetensors file or a directory"
        )
    dst.check_overwrite(args.overwrite)  # before reading anything
    if args.workers is not None or args.dask_scheduler is not None or args.format:
        raise _UsageError(
            "--workers, --dask-scheduler and --format apply to a DCP checkpoint source; "
            f"{args.src} is not one"
        )
    start = time.perf_counter()
    opened = _open(args.src, args)
    schemes = dequantize is not None and not _is_gguf(args.src)  # GGUF dequantizes as it reads
    if schemes:
        from .quant.api import DequantizedFile

        try:
            opened = DequantizedFile(
                opened,
                dequantize,
                scheme=args.scheme,
                block_size=block_size,
            )
        except BaseException:
            opened.close()
            raise
        if not args.quiet and opened.plan.quantized:
            print(f"note: {_cli_words(opened.notes[-1])}", file=sys.stderr)
    with opened as src:
        names = _select(src.keys(), args.include, args.exclude)
        if not src.keys():
            raise TensorBridgeError(f"{args.src} holds no arrays or tensors; nothing to convert")
        if not names:
            raise _UsageError(
                f"no tensor of {args.src} matches --include/--exclude; "
                f"'tensorbridge inspect {args.src}' lists the names"
            )
        try:  # NumPy to NumPy: members torch cannot hold are copied as they are
            carried = tbio.carried_members(
                src, dst.format, names, skip_refused=args.skip_unsupported
            )
        except TensorBridgeError as e:  # an object array
            raise TensorBridgeError(
                f"{e}; pass --exclude NAME or --skip-unsupported to convert the rest"
            ) from None
        selected = names
        names, unsupported = _convertible(
            src, [n for n in names if n not in carried], args, len(carried)
        )
        names = [n for n in selected if n in carried or n in names]
        if carried and not args.quiet:
            kinds = ", ".join(f"{n} ({c.stored})" for n, c in list(carried.items())[:5])
            print(
                f"note: copied {kinds}{' ...' if len(carried) > 5 else ''} unchanged: no "
                "torch dtype holds them, so their .npy bytes are carried as they are",
                file=sys.stderr,
            )
        if not dst.format.many_arrays and len(names) != 1:
            raise _UsageError(
                f"a {dst.path.suffix} file holds one array but {len(names)} tensors were "
                f"selected; pick one with --include NAME or write "
                f"{listing(lambda f: f.many_arrays)}"
            )
        meta, dropped = (
            ({}, [])
            if args.no_metadata
            else tbio.carried_metadata(src, dst.format, names, fix="pass --no-metadata")
        )
        meta.update(given_meta)
        clash = [k for k in given_meta if k in names]
        if clash and dst.format.metadata_with_tensors:
            raise _UsageError(
                f"--metadata {clash[0]}: a {dst.path.suffix} file keeps metadata beside the "
                "tensors under one set of names, and a tensor has that name; pick another key"
            )
        if dst.format.name == "gguf":
            from .io.gguf import check_architecture

            check_architecture(
                meta,
                dst.path,
                fix="pass --metadata general.architecture=NAME (e.g. llama), or "
                "--metadata-json FILE",
            )
        if dropped and not args.quiet:
            print(
                f"note: dropped metadata {', '.join(dropped)}: {dst.path.suffix} files have no "
                f"place for it (convert to {tbio.metadata_homes(dropped, names)} to keep it; "
                "--no-metadata leaves it out without this note)",
                file=sys.stderr,
            )
        progress = _progress(args)
        if quantize is not None:
            return _convert_quantized(args, src, dst, names, meta, quantize, block_size, start, out)
        if not dst.format.many_arrays:
            tbio.save(
                carried.get(names[0]) or src[names[0]],
                dst.path,
                float_dtype=float_dtype,
                progress=progress,
                overwrite=True,
            )
        else:
            values: Any = _Lazy(src, names, carried)
            if schemes and dst.format.name == "safetensors":
                values = {n: src.stream_value(n) for n in names}
            try:
                tree = (
                    tbio.nested_values(src, names, plain=not args.no_metadata)
                    if dst.format.nested
                    else None
                )
            except InvalidArgumentError as e:  # a list's items selected in part
                raise _UsageError(
                    f"{e} (--include / --exclude), or convert to "
                    f"{listing(lambda f: f.many_arrays and not f.nested)}, which keep flat names"
                ) from None
            if tree is not None:  # the source's nesting, its plain values in their places
                values, meta = tree, given_meta
            tbio.save(
                values,
                args.dst,
                float_dtype=float_dtype,
                metadata=meta or None,
                max_shard_size=args.max_shard_size,
                progress=progress,
                overwrite=True,
            )
        if schemes:
            _copy_config(src, dst, args.overwrite)
        took = time.perf_counter() - start
        in_bytes = sum(
            c.size if (c := carried.get(n)) else src.nbytes(n)
            for n in names
            if n not in src.aliases
        )
        out_bytes = sum(p.stat().st_size for p in dst.existing())
        written = _written(dst)
        summary: dict[str, Any] = {
            "src": args.src,
            **(
                {"dequantized": src.plan.summary(), "dropped": list(src.plan.dropped)}  # type: ignore[attr-defined]
                if schemes
                else {}
            ),
            "dst": written,
            "tensors": len(names),
            "bytes_in": in_bytes,
            "bytes_out": out_bytes,
            "seconds": round(took, 3),
            "skipped": sorted(unsupported),
            "dropped_metadata": dropped,
        }
        ok = True
        if args.verify:
            kept = [n for n in names if n not in carried]
            problems = _verify(src, kept, written, float_dtype, progress) if kept else []
            problems += _verify_carried(carried, names, written)
            summary["verified"] = not problems
            summary["problems"] = problems
            ok = not problems
    return _report(summary, args, out, ok, float_dtype)


def _quantize_arg(
    args: argparse.Namespace, dequantize: Any, float_dtype: Any, block_size: Any
) -> str | None:
    """``--quantize``'s scheme, checked against the options it cannot go with."""
    if args.quantize is None:
        if args.ignore:
            raise _UsageError("--ignore says which weights --quantize leaves; pass --quantize")
        for given, flag in ((args.layout, "--layout"), (args.element, "--element")):
            if given:
                raise _UsageError(f"{flag} says how --quantize writes weights; pass --quantize")
        return None
    if dequantize is not None:
        raise _UsageError("pass --quantize or --dequantize, not both")
    if float_dtype is not None:
        raise _UsageError(
            "--quantize sets the weights' dtypes; cast the other tensors in a second convert "
            "with --float-dtype"
        )
    if args.scheme is not None:
        raise _UsageError("--quantize names the scheme; leave out --scheme")
    from .errors import QuantizationError
    from .quant.write import writable  # imports torch: only when quantizing

    try:
        scheme = writable(args.quantize, args.layout, args.element)
    except QuantizationError as e:
        raise _UsageError(str(e)) from None
    if block_size is not None and scheme != "fp8-block":
        raise _UsageError(f"--block-size is fp8-block's; {scheme} has fixed blocks")
    return scheme


def _convert_quantized(
    args: argparse.Namespace,
    src: TensorFile,
    dst: tbio.Destination,
    names: list[str],
    meta: dict[str, Any],
    scheme: str,
    block_size: tuple[int, int] | None,
    start: float,
    out: TextIO,
) -> int:
    """convert --quantize: each selected weight quantized as it is written, the rest as stored."""
    from . import io as tbio
    from .quant.write import (
        config_caveat,
        quantized_parts,
        skip_reason,
        unconverted_modules,
    )

    layout = {"layout": args.layout, "element": args.element}
    if _quant_plan(src, None, None).quantized:
        raise TensorBridgeError(
            f"{args.src} is already quantized; dequantize it first (convert --dequantize bf16)"
        )
    values: dict[str, Any] = {}
    quantized: list[str] = []
    left: dict[str, str] = {}
    taken = set(names)
    for n in names:
        row, shape = src.info(n)
        why = skip_reason(n, row, shape, scheme, args.ignore, layout=args.layout)
        if why is not None:
            values[n] = src[n]
            if not why.startswith("not a "):
                left[n] = why
            continue
        load = functools.partial(src.get, n, framework="torch")  # mapped, not copied
        parts = quantized_parts(n, load, shape, scheme, block_size, **layout)
        clash = [k for k in parts if k != n and k in taken]
        if clash:
            raise TensorBridgeError(
                f"{n} quantizes into {clash[0]}, which {args.src} already holds; exclude one "
                f"of them (--exclude {clash[0]})"
            )
        values.update(parts)
        quantized.append(n)
    if not quantized:
        what = (
            "3-D float ...experts.gate_up_proj / down_proj tensors"
            if args.layout == "gpt-oss"
            else "2-D+ float weights, not embeddings, lm_head or norms"
        )
        raise TensorBridgeError(
            f"no weight of {args.src} is one {scheme} quantizes ({what}); nothing to quantize"
        )
    ignored = unconverted_modules(list(left), quantized, layout=args.layout)
    if not args.quiet:
        for n, why in left.items():
            print(f"note: left {n} unquantized: {why}", file=sys.stderr)
    tbio.save(
        values,
        args.dst,
        metadata=meta or None,
        max_shard_size=args.max_shard_size,
        progress=_progress(args),
        overwrite=True,
    )
    config = _write_quant_config(src, dst, scheme, block_size, ignored, args)
    caveat = config_caveat(scheme, args.element)
    if config is not None and caveat and not args.quiet:
        print(f"note: {caveat}", file=sys.stderr)
    if config is None and not args.quiet:
        size = f" --block-size {','.join(map(str, block_size or (128, 128)))}"
        print(
            f"note: no config.json beside {args.src}, so none says how {args.dst} is "
            f"quantized: read it with --scheme {scheme}"
            + (size if scheme == "fp8-block" else "")
            + " (tb.open(..., dequantize=..., scheme=...))",
            file=sys.stderr,
        )
    took = time.perf_counter() - start
    written = _written(dst)
    summary: dict[str, Any] = {
        "src": args.src,
        "quantized": f"{scheme}: {_plural(len(quantized), 'weight')}",
        **({"layout": args.layout} if args.layout else {}),
        **({"element": args.element} if args.element else {}),
        "quantized_weights": quantized,
        "left_unquantized": left,
        "config": config,
        "dst": written,
        "tensors": len(values),
        "bytes_in": sum(src.nbytes(n) for n in names if n not in src.aliases),
        "bytes_out": sum(p.stat().st_size for p in dst.existing()),
        "seconds": round(took, 3),
        "skipped": [],
        "dropped_metadata": [],
    }
    ok = True
    if args.verify:
        problems = _verify_quantized(src, names, written, scheme, block_size, quantized, args)
        summary["verified"] = not problems
        summary["problems"] = problems
        ok = not problems
    return _report(summary, args, out, ok, None)


def _write_quant_config(
    src: TensorFile,
    dst: tbio.Destination,
    scheme: str,
    block_size: tuple[int, int] | None,
    ignored: list[str],
    args: argparse.Namespace,
) -> str | None:
    """A quantized checkpoint's config.json: the source's, with its ``quantization_config``
    (written only when the source directory has a config.json; returns its path)."""
    from .io._common import atomic_write
    from .quant.write import quantization_config

    source = getattr(src, "path", None)
    if source is None:
        return None
    here = source if os.path.isdir(source) else os.path.dirname(os.path.abspath(source))
    there = os.path.dirname(os.path.abspath(dst.path))
    config = os.path.join(here, "config.json")
    target = os.path.join(there, "config.json")
    if os.path.abspath(here) == there or not os.path.isfile(config):
        return None
    if os.path.exists(target) and not args.overwrite:
        print(f"note: kept the existing {target} (pass --overwrite to replace it)", file=sys.stderr)
        return None
    with open(config, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        return None
    data["quantization_config"] = quantization_config(
        scheme, block_size, ignored, layout=args.layout
    )
    with atomic_write(target) as f:
        f.write((json.dumps(data, indent=2) + "\n").encode("utf-8"))
    return target


def _verify_quantized(
    src: TensorFile,
    names: list[str],
    written: str,
    scheme: str,
    block_size: tuple[int, int] | None,
    quantized: list[str],
    args: argparse.Namespace,
) -> list[str]:
    """The output re-read: the same quantized weights as tb.quantize's, bit for bit, under
    the same scheme, and every other tensor equal to the source."""
    import numpy as np

    from . import io as tbio
    from .quant import quantize
    from .quant.write import LAYOUTS

    kept = [n for n in names if n not in quantized]
    problems = _verify(src, kept, written, None, _progress(args)) if kept else []
    with tbio.open(written) as f:
        p = _quant_plan(f, scheme, block_size)
        found = {g.name for g in p.groups}
        problems += [
            f"{n}: not read back as a {scheme} weight" for n in quantized if n not in found
        ]
        for n in quantized:
            want = quantize(
                np.asarray(src[n]),
                scheme,
                name=n,
                block_size=block_size,
                layout=args.layout or LAYOUTS[scheme],
                element=args.element,
            )
            for k, v in want.items():
                if k not in f or not np.array_equal(_bits(v), _bits(f[k])):
                    problems.append(f"{k}: differs from tb.quantize({n})")
    return problems


def _missing_directory(dst: str, chunked: bool) -> str | None:
    """The directory a save to ``dst`` will create (with its missing parents), or None."""
    from pathlib import Path

    path = Path(dst)
    directory = dst.endswith(("/", os.sep)) or (chunked and not path.suffix) or path.is_dir()
    wanted = path if directory else path.parent
    return None if wanted.exists() or wanted.is_symlink() else str(wanted)


def _report(
    summary: dict[str, Any], args: argparse.Namespace, out: TextIO, ok: bool, cast: Any
) -> int:
    """Print a conversion's summary (JSON, or a line and the verdict of --verify)."""
    created = getattr(args, "created", None)
    if created is not None and os.path.isdir(created):
        summary["created_directory"] = created
    if args.json:
        _dump(summary, out)
        return 0 if ok else 1
    out.write(
        f"converted {_plural(summary['tensors'], 'tensor')} ({_size(summary['bytes_in'])} in, "
        f"{_size(summary['bytes_out'])} out) {args.src} -> {summary['dst']} in "
        f"{summary['seconds']:.2f} s"
        + (f" (created the directory {created}/)" if "created_directory" in summary else "")
        + "\n"
    )
    if "quantized" in summary:
        config = f"; {summary['config']} written" if summary["config"] else ""
        out.write(f"quantized: {summary['quantized']}{config}\n")
    if args.verify:
        if not ok:
            verdict = _plural(len(summary["problems"]), "mismatch")
        elif cast is not None:
            verdict = (
                f"bit-exact to the source cast to {cast.name} (torch's kernel); "
                "the cast itself may round: see tensorbridge cast-report"
            )
        else:
            verdict = "bit-exact"
        out.write("verify: " + _colour(verdict, ok, out) + "\n")
        for p in summary["problems"]:
            out.write(f"  {p}\n")
    return 0 if ok else 1


def _copy_config(src: TensorFile, dst: tbio.Destination, overwrite: bool) -> None:
    """A dequantized checkpoint's config.json beside it, without ``quantization_config``."""
    from .io._common import atomic_write

    source = getattr(src, "path", None)
    if source is None:
        return
    here = os.path.dirname(os.path.abspath(source))
    there = os.path.dirname(os.path.abspath(dst.path))
    config = os.path.join(here, "config.json")
    target = os.path.join(there, "config.json")
    if here == there or not os.path.isfile(config) or (os.path.exists(target) and not overwrite):
        return
    with open(config, encoding="utf-8") as f:
        data = json.load(f)
    if isinstance(data, dict):
        data.pop("quantization_config", None)
    with atomic_write(target) as f:
        f.write((json.dumps(data, indent=2) + "\n").encode("utf-8"))


def _is_chunked(path: str) -> bool:
    """Whether ``path`` is a checkpoint stored in chunks (a DCP directory), by content."""
    from pathlib import Path

    from .io._detect import detect, resolve
    from .io._formats import by_kind

    try:
        fmt = by_kind(detect(resolve(Path(path))))
    except (OSError, TensorBridgeError):
        return False  # the usual path reports what is wrong
    return fmt is not None and fmt.chunked


@contextlib.contextmanager
def _executor(args: argparse.Namespace) -> Iterator[Any]:
    """The executor --workers / --dask-scheduler ask for, or None (serial)."""
    if args.workers is not None and args.workers > 1:
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        with ProcessPoolExecutor(args.workers, mp_context=get_context("spawn")) as ex:
            yield ex
    elif args.dask_scheduler is not None:
        try:
            from distributed import Client
        except ImportError:
            raise MissingExtraError(
                "--dask-scheduler needs dask.distributed; pip install tensorbridge[dask]"
            ) from None
        with Client(args.dask_scheduler) as client:  # type: ignore[no-untyped-call]
            yield client.get_executor()
    else:
        yield None


def _as_directory(path: str) -> str:
    """A suffix-less destination of a DCP conversion is a directory (sharded safetensors)."""
    from pathlib import Path

    p = Path(path)
    if p.suffix or path.endswith(("/", os.sep)) or p.is_file():
        return path
    return path + os.sep


def _convert_chunked(args: argparse.Namespace, out: TextIO, float_dtype: Any) -> int:
    """Convert a DCP checkpoint: each tensor assembled window by window into the output."""
    from pathlib import Path

    from . import io as tbio

    if args.format == "npy" and args.max_shard_size is not None:
        raise _UsageError("--max-shard-size applies to safetensors; .npy files are not sharded")
    start = time.perf_counter()
    with _open(args.src, args) as src:
        if not getattr(src, "chunked", False):
            raise _UsageError(
                f"--format npy writes a DCP checkpoint's tensors; {args.src} is not one"
            )
        names = _select(src.keys(), args.include, args.exclude)
        if not names:
            raise _UsageError(
                f"no tensor of {args.src} matches --include/--exclude; "
                f"'tensorbridge inspect {args.src}' lists the names"
            )
        names, unsupported = _convertible(src, names, args)
        view = src.select(names)  # type: ignore[attr-defined]
        with _executor(args) as executor:
            tbio.save(
                view,
                _as_directory(args.dst),
                float_dtype=float_dtype,
                metadata=False if args.no_metadata else None,
                max_shard_size=args.max_shard_size,
                overwrite=args.overwrite,
                progress=_progress(args),
                format=args.format,
                executor=executor,
            )
        took = time.perf_counter() - start
        in_bytes = sum(src.nbytes(n) for n in names)
        if args.format == "npy":
            files = [Path(args.dst) / f"{n}.npy" for n in names]
            written = str(args.dst)
        else:
            dst = tbio.destination(_as_directory(args.dst))
            files = dst.existing()
            written = _written(dst)
        out_bytes = sum(p.stat().st_size for p in files)
        summary: dict[str, Any] = {
            "src": args.src,
            "dst": written,
            "tensors": len(names),
            "bytes_in": in_bytes,
            "bytes_out": out_bytes,
            "seconds": round(took, 3),
            "skipped": sorted(unsupported),
            "dropped_metadata": sorted(src.plain_values())
            if args.format == "npy" or args.no_metadata
            else [],
        }
        ok = True
        if args.verify:
            problems: list[str] = []
            if args.format == "npy":
                for n, p in zip(names, files, strict=True):
                    problems += [
                        f"{n}: {q.split(': ', 1)[1]}"
                        for q in _verify(src, [n], str(p), float_dtype, _progress(args))
                    ]
            else:
                problems = _verify(src, names, written, float_dtype, _progress(args))
            summary["verified"] = not problems
            summary["problems"] = problems
            ok = not problems
    return _report(summary, args, out, ok, None)


def _written(dst: tbio.Destination) -> str:
    """What ``save`` wrote: the shard index when the save was sharded, else the file."""
    return str(dst.index if not dst.path.exists() and dst.index.exists() else dst.path)


def _verify(
    src: TensorFile, names: list[str], dst_path: str, float_dtype: Any, progress: bool | None
) -> list[str]:
    """Every output tensor must equal the source, or its cast with the same kernel, bit for bit."""
    import numpy as np

    from . import io as tbio
    from .convert import to_numpy
    from .io._common import cast_target, progress_bar, row_of

    problems = []
    bar = progress_bar(sum(src.nbytes(n) for n in names), "verifying", progress, tensors=len(names))
    with tbio.open(dst_path) as written:
        keys = written.keys()
        if written.single:  # one bare array, named after the file
            where = {names[0]: keys[0]} if keys else {}
        else:
            stored = set(keys)
            where = {n: n for n in names if n in stored}
        try:
            for name in names:
                bar.update(src.nbytes(name))
                if name not in where:
                    problems.append(f"{name}: missing from the output")
                    continue
                a, b = src[name], written[where[name]]
                want = cast_target(row_of(a), float_dtype)
                expected = to_numpy(a, dtype=want) if want.numpy != a.dtype else a
                if expected.shape != b.shape or expected.dtype != b.dtype:
                    problems.append(
                        f"{name}: {expected.dtype}{expected.shape} became {b.dtype}{b.shape}"
                    )
                elif not np.array_equal(_bits(expected), _bits(b)):
                    problems.append(f"{name}: the bytes differ")
        finally:
            bar.close()
    return problems


def _verify_carried(carried: Mapping[str, Any], names: list[str], dst_path: str) -> list[str]:
    """Every member copied unchanged (``NpyBytes``) must be in the output byte for byte."""
    from . import io as tbio

    problems: list[str] = []
    if not carried:
        return problems
    with tbio.open(dst_path) as written:
        keys = written.keys()
        for name, want in carried.items():
            key = keys[0] if written.single else name
            if key not in keys:
                problems.append(f"{name}: missing from the output")
                continue
            got = written.npy_bytes(key)  # type: ignore[attr-defined]
            with want.opener() as a, got.opener() as b:
                step = 1 << 20
                same = want.size == got.size and all(
                    a.read(min(step, want.size - i)) == b.read(min(step, want.size - i))
                    for i in range(0, want.size, step)
                )
            if not same:
                problems.append(f"{name}: the bytes differ")
    return problems


def _bits(a: np.ndarray) -> np.ndarray:
    import numpy as np

    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _as_mapping(path: str, args: argparse.Namespace) -> dict[str, Any]:
    with _open(path, args) as f:
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


def _check_tolerance(value: float | None, option: str) -> None:
    if value is not None and not value >= 0:
        raise _UsageError(f"{option} {value} is not a tolerance; pass a number >= 0")


def _compare(args: argparse.Namespace, out: TextIO) -> int:
    from . import diagnostics

    _check_tolerance(args.rtol, "--rtol")
    _check_tolerance(args.atol, "--atol")
    block_size = _block_size(args)
    side = _quantized_side(args, block_size)
    if side is not None:
        return _compare_quantized(args, side, block_size, out)
    a, b = _as_mapping(args.a, args), _as_mapping(args.b, args)
    if len(a) == 1 and len(b) == 1 and a.keys() != b.keys():
        a, b = {"tensor": next(iter(a.values()))}, {"tensor": next(iter(b.values()))}
    result = diagnostics.compare(a, b, rtol=args.rtol, atol=args.atol, progress=_progress(args))
    plotted = _plot_errors(a, b, result, args.plot) if args.plot else None
    if args.json:
        doc = result.to_dict()
        if plotted is not None:
            doc["plot"] = plotted
        doc["leaves"] = {_display(k): {**v, "path": _display(k)} for k, v in doc["leaves"].items()}
        doc["missing"] = [_display(k) for k in doc["missing"]]
        doc["extra"] = [_display(k) for k in doc["extra"]]
        _dump(doc, out)
        return 0 if result.ok else 1
    mixed = any(leaf.dtype_mismatch for leaf in result.leaves.values())
    rows = []
    for path, leaf in result.leaves.items():
        verdict = "ok" if leaf.ok else "DIFF"
        if leaf.problem:
            verdict = f"DIFF ({leaf.problem})"
        cells = [
            _display(path),
            f"{leaf.dtype_a}/{leaf.dtype_b}" if leaf.dtype_mismatch else str(leaf.dtype_a),
            _num(leaf.max_abs_err),
            _num(leaf.max_rel_err),
            _num(leaf.max_ulp),
        ]
        if mixed:
            cells.append(str(leaf.compared_in or "-"))
        rows.append([*cells, _num(leaf.mismatches), _colour(verdict, leaf.ok, out)])
    headers = ["tensor", "dtype", "max abs", "max rel", "max ulp"]
    headers += ["ulps of"] if mixed else []
    _table(rows, [*headers, "mismatches", "verdict"], out)
    for name in result.missing:
        out.write(f"only in {args.a}: {_display(name)}\n")
    for name in result.extra:
        out.write(f"only in {args.b}: {_display(name)}\n")
    if plotted is not None:
        out.write(f"plot: {plotted['summary']}\n")
    bad = sum(not leaf.ok for leaf in result.leaves.values())
    unmatched = len(result.missing) + len(result.extra)
    problems = [f"{_plural(bad, 'tensor')} {'differs' if bad == 1 else 'differ'}"] if bad else []
    problems += [f"{_plural(unmatched, 'tensor')} in only one file"] if unmatched else []
    verdict = "within tolerance" if result.ok else ", ".join(problems) or "differ"
    out.write(f"verdict: {_colour(verdict, result.ok, out)} ({_loss(result)})\n")
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
        parts.append(f"max abs err {_num(abs_err)}, max rel err {_num(rel_err)}")
        each = ", ".join(f"{_num(n)} counted in {unit}" for unit, n in sorted(ulps.items()))
        parts.append(f"max ulp {each}")
    if ints is not None:
        parts.append(f"integers: max difference {_num(ints)}")
    return "; ".join(parts) or "nothing compared"


def _quant_plan(f: TensorFile, scheme: str | None, block_size: Any) -> Any:
    """The quantization plan of an open file (``--scheme`` / ``--block-size`` applied)."""
    from .quant import plan, read_config

    index = {n: f.info(n) for n in f if n not in f.unsupported()}
    opts = {"block_size": block_size} if block_size is not None else {}
    return plan(
        index, read_config(getattr(f, "path", None), follow_links=f.follow_links), scheme, opts
    )


def _quantized_side(args: argparse.Namespace, block_size: Any) -> str | None:
    """Which of compare's A and B is the quantized one ("a" / "b"), or None for a plain
    comparison: the one side with quantized weights (--scheme's, or what the config
    or the names say)."""
    from .errors import QuantizationError

    found: dict[str, bool] = {}
    for key in ("a", "b"):
        path = getattr(args, key)
        with _open(path, argparse.Namespace(**{**vars(args), "quiet": True})) as f:
            try:
                found[key] = _quant_plan(f, args.scheme, block_size).quantized
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
        raise _UsageError(f"neither {args.a} nor {args.b} holds {what}; leave out --scheme")
    raise _UsageError(
        f"both {args.a} and {args.b} hold {what}; compare a quantized checkpoint with its "
        "unquantized reference (or leave out --scheme to compare the stored tensors)"
    )


def _compare_quantized(args: argparse.Namespace, side: str, block_size: Any, out: TextIO) -> int:
    """compare of a quantized checkpoint with its reference: errors block by block."""
    from . import diagnostics
    from .io._common import progress_bar

    qpath, rpath = (args.b, args.a) if side == "b" else (args.a, args.b)
    with _open(qpath, args) as qf, _open(rpath, args) as rf:
        p = _quant_plan(qf, args.scheme, block_size)
        bar = progress_bar(
            sum(qf.nbytes(g.parts["codes"]) for g in p.groups),
            "comparing",
            _progress(args),
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
        _dump(
            {
                "quantized": qpath,
                "reference": rpath,
                "ok": ok,
                "report": report.to_dict(),
                "tensors": {_display(k): v.to_dict() for k, v in rest.leaves.items()},
                "only_in_reference": only_ref,
                "only_in_quantized": only_q,
            },
            out,
        )
        return 0 if ok else 1
    out.write(f"quantized: {qpath}: {report.summary}; reference: {rpath}\n")
    _quant_weights(report, out, too_far)
    if rest.leaves:
        out.write("\n")
        rows = [
            [
                _display(k),
                str(leaf.dtype_a),
                _num(leaf.max_abs_err),
                _num(leaf.max_rel_err),
                _num(leaf.max_ulp),
                _colour("ok" if leaf.ok else "DIFF", leaf.ok, out),
            ]
            for k, leaf in rest.leaves.items()
        ]
        _table(rows, ["tensor", "dtype", "max abs", "max rel", "max ulp", "verdict"], out)
    for name in report.unmatched:
        out.write(f"only in {qpath}: {name}\n")
    for name in only_q:
        out.write(f"only in {qpath}: {name}\n")
    for name in only_ref:
        out.write(f"only in {rpath}: {name}\n")
    out.write("verdict: " + _colour(_quant_verdict(report, ok, too_far, args.rtol), ok, out) + "\n")
    return 0 if ok else 1


def _quant_weights(report: Any, out: TextIO, too_far: Set[str] = frozenset()) -> None:
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
        cells = [name, w.scheme, _num(w.blocks), _num(w.saturated_blocks)]
        if e8m0:
            cells += [_num(w.e8m0_min), _num(w.e8m0_max), _num(w.e8m0_nan)]
        if errors:
            cells += [_num(w.max_abs_err), _num(w.max_rel_err)]
        good = w.ok and name not in too_far
        verdict = "ok" if good else "BAD" if not w.ok else "DIFF"
        if w.problem:
            verdict = f"BAD ({w.problem})"
        cells += [_num(w.nan_produced), _num(w.inf_produced), _colour(verdict, good, out)]
        rows.append(cells)
    _table(rows, headers, out)
    if report.worst_blocks:
        out.write("worst blocks (max rel: the block's max abs error / its largest |reference|):\n")
        for b in report.worst_blocks:
            out.write(
                f"  {b.tensor} block {tuple(b.block)}: max abs {_num(b.max_abs_err)}, "
                f"max rel {_num(b.max_rel_err)}\n"
            )


def _quant_verdict(report: Any, ok: bool, too_far: Set[str], rtol: float | None) -> str:
    bad = [n for n, w in report.weights.items() if not w.ok]
    if ok:
        worst = report.worst_blocks[0] if report.worst_blocks else None
        where = f" ({worst.tensor} block {tuple(worst.block)})" if worst else ""
        rels = [w.max_rel_err for w in report.weights.values() if w.max_rel_err is not None]
        tail = f"; worst block max rel {_num(max(rels))}{where}" if rels else ""
        return "no NaN or inf produced" + tail
    problems = []
    if bad:
        problems.append(f"{_plural(len(bad), 'weight')} with NaN / inf or unreadable")
    if too_far:
        problems.append(f"{_plural(len(too_far), 'weight')} beyond --rtol {rtol}")
    return ", ".join(problems) or "tensors differ or are missing"


def _cast_report(args: argparse.Namespace, out: TextIO) -> int:
    from . import diagnostics
    from ._progress import progress_bar

    if args.dtype is not None and (args.scheme or args.block_size) is not None:
        raise _UsageError("pass --dtype (a cast) or --scheme (a quantization), not both")
    if args.dtype is None:
        return _cast_report_scheme(args, out)
    if args.ignore:
        raise _UsageError("--ignore applies to --scheme; a cast applies to every tensor")
    target = _dtype_arg(args.dtype, "--dtype", floating=True)
    _check_tolerance(args.rtol, "--rtol")
    reports = {}
    with _open(args.file, args) as f:
        unsupported = f.unsupported()
        names = [
            n for n in f if n not in unsupported and f.info(n)[0].category in ("float", "complex")
        ]
        nbytes = sum(f.nbytes(n) for n in names)  # counted, not read
        bar = progress_bar(nbytes, "cast-report", _progress(args), tensors=len(names), work="check")
        try:
            for name in names:
                reports[name] = diagnostics.cast_report(f[name], target, rtol=args.rtol)
                bar.update(f.nbytes(name))
        finally:
            bar.close()
    if not reports:
        raise _UsageError(f"{args.file} has no floating-point or complex tensors to cast")
    plotted = _plot_ulps(reports, args.plot, target.name) if args.plot else None
    ok = all(r.ok for r in reports.values())
    safe = all(r.safe for r in reports.values())
    if args.json:
        doc = {"dtype": target.name, "safe": safe, "rtol": args.rtol, "ok": ok}
        doc["meaning"] = _cast_meaning(args.rtol)
        doc["tensors"] = {k: r.to_dict() for k, r in reports.items()}
        if plotted is not None:
            doc["plot"] = plotted
        _dump(doc, out)
        return 0 if ok else 1
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
        + [_num(getattr(r, field)) for _, field in counts]
        + [
            _num(r.max_rel_err),
            _num(r.mean_rel_err),
            _colour(_cast_verdict(r), r.ok, out),
        ]
        for name, r in reports.items()
    ]
    headers = ["tensor", "from", *(h for h, _ in counts), "max rel", "mean rel", "verdict"]
    _table(rows, headers, out)
    first = next(iter(reports.values()))
    out.write(f"kernel: {first.kernel} ({first.semantics})\n")
    out.write(f"{_cast_meaning(args.rtol)}\n")
    if plotted is not None:
        out.write(f"plot: {plotted['summary']}\n")
    worst = max((r.max_rel_err or 0.0) for r in reports.values())
    if not safe:
        verdict = f"lossy in {target.name}"
    elif not ok:
        over = sum(not r.ok for r in reports.values())
        verdict = (
            f"{_plural(over, 'tensor')} beyond --rtol {args.rtol} in {target.name} "
            f"(max rel err {_num(worst)})"
        )
    elif args.rtol is None:
        verdict = (
            f"safe to store in {target.name} (max rel err {_num(worst)}; pass --rtol to "
            "bound the rounding)"
        )
    else:
        verdict = f"within --rtol {args.rtol} in {target.name} (max rel err {_num(worst)})"
    out.write("verdict: " + _colour(verdict, ok, out) + "\n")
    return 0 if ok else 1


def _cast_verdict(r: Any) -> str:
    if not r.safe:
        return "LOSSY"
    return "safe" if r.rtol is None else ("ok" if r.ok else "BEYOND-RTOL")


def _cast_meaning(rtol: float | None) -> str:
    safe = (
        "safe: nothing overflowed, saturated, flushed to zero, lost its zero or sign, or "
        "became or changed a NaN"
    )
    if rtol is None:
        return f"{safe}; rounding is not judged (pass --rtol to bound max rel)"
    return f"{safe}; ok: safe, and max rel <= --rtol {rtol}"


def _cast_report_scheme(args: argparse.Namespace, out: TextIO) -> int:
    """cast-report --scheme: a quantized file's weights, or what quantizing a plain one does."""
    from . import diagnostics
    from .io._common import progress_bar

    block_size = _block_size(args)
    with _open(args.file, args) as f:
        if args.scheme is None and not _quant_plan(f, None, block_size).quantized:
            raise _UsageError(
                f"{args.file} is not quantized: pass --dtype DTYPE for a cast or "
                "--scheme NAME for what quantizing it would do"
            )
        names = [n for n in f if n not in f.unsupported()]
        bar = progress_bar(
            sum(f.nbytes(n) for n in names),
            "cast-report",
            _progress(args),
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
        finally:
            bar.close()
    if not report.weights:
        raise _UsageError(
            f"{args.file} has no weight {args.scheme} would quantize (2-D+ float weights, "
            "not embeddings, lm_head or norms)"
        )
    if args.json:
        _dump(report.to_dict(), out)
        return 0 if report.ok else 1
    out.write(f"{args.file}: {report.summary}\n")
    _quant_weights(report, out)
    for name, why in report.skipped.items():
        if "multiple" in why or "matches" in why:
            out.write(f"left unquantized: {name} ({why})\n")
    verdict = _quant_verdict(report, report.ok, frozenset(), None)
    out.write("verdict: " + _colour(verdict, report.ok, out) + "\n")
    return 0 if report.ok else 1


def _demo(args: argparse.Namespace, out: TextIO) -> int:
    from ._demo import run

    return run(out)


# --- plots ------------------------------------------------------------------------------------


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingExtraError(
            "--plot needs matplotlib; pip install 'tensorbridge[plot]' (or matplotlib)"
        ) from None
    return plt


def _plot_errors(
    a: Mapping[str, Any], b: Mapping[str, Any], result: Any, path: str
) -> dict[str, Any]:
    """Draw the worst tensors' error histograms; returns what was drawn and why."""
    import numpy as np

    plt = _pyplot()
    measured = [k for k, leaf in result.leaves.items() if leaf.max_abs_err is not None]
    # ULPs of different dtypes do not compare; relative errors do
    ranked = sorted(
        measured,
        key=lambda k: (result.leaves[k].mismatches, result.leaves[k].max_rel_err or 0.0),
        reverse=True,
    )[:_PLOTTED]
    names = {k: k for k in result.leaves}
    fig, axes = plt.subplots(
        max(1, len(ranked)), 1, figsize=(7, 2.2 * max(1, len(ranked))), squeeze=False
    )
    for ax, key in zip(axes[:, 0], ranked, strict=False):
        name = _leaf_name(key, a)
        x = _wide(a[name]) if name in a else np.zeros(0)
        y = _wide(b[name]) if name in b else np.zeros(0)
        err = np.abs(x - y) if x.shape == y.shape else np.zeros(0)
        err = err[np.isfinite(err)]
        ax.hist(err, bins=60, log=True)
        ax.set_title(
            f"{_display(names[key])}: |a - b| (max ulp {_num(result.leaves[key].max_ulp)})",
            fontsize=9,
        )
    if not ranked:
        axes[0, 0].text(0.5, 0.5, "no numeric tensors to plot", ha="center")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    left_out = len(measured) - len(ranked)
    criterion = "the most mismatches, then the largest max rel err"
    summary = f"{path}: {_plural(len(ranked), 'tensor')} of {len(measured)}, the worst by "
    summary += criterion + (f" ({left_out} left out)" if left_out else "")
    return {
        "file": path,
        "tensors": [_display(k) for k in ranked],
        "left_out": left_out,
        "criterion": criterion,
        "summary": summary,
    }


def _wide(x: Any) -> np.ndarray:
    """Values as float64 (complex128 for complex), flat, for plotting differences."""
    from .convert import to_numpy
    from .io._common import row_of

    wide = "complex128" if row_of(x).category == "complex" else "float64"
    result: np.ndarray = to_numpy(x, dtype=wide).reshape(-1)
    return result


def _display(path: str) -> str:
    """``['a.b']`` -> ``a.b`` for the flat names of a file; deeper paths stay as they are."""
    if path.startswith("['") and path.endswith("']") and "']['" not in path:
        return path[2:-2]
    return path


def _leaf_name(path: str, mapping: Mapping[str, Any]) -> str:
    for name in mapping:
        if path in (name, f"[{name!r}]"):
            return name
    return path


_PLOTTED = 6  # histograms in one figure
_LOST = (
    "overflow_inf",
    "saturated",
    "nan_created",
    "flushed_to_zero",
    "nan_changed",
    "zero_replaced",
    "sign_dropped",
    "imag_discarded",
)


def _plot_ulps(reports: Mapping[str, Any], path: str, target: str) -> dict[str, Any]:
    """Draw the worst tensors' ULP histograms; returns what was drawn and why, for the output."""
    plt = _pyplot()

    def badness(name: str) -> tuple[int, float, int]:
        r = reports[name]
        return sum(getattr(r, k) for k in _LOST), r.max_rel_err or 0.0, r.subnormal

    worst = sorted(reports, key=badness, reverse=True)[:_PLOTTED]  # stable: ties in file order
    left_out = len(reports) - len(worst)
    criterion = (
        "most values lost (overflowed, saturated, flushed to zero, NaN), then the largest "
        "max rel err, then the most subnormals"
    )
    summary = f"{path}: {_plural(len(worst), 'tensor')} of {len(reports)}, the worst by {criterion}"
    summary += f" ({left_out} left out)" if left_out else ""
    fig, axes = plt.subplots(len(worst), 1, figsize=(7, 2.2 * len(worst)), squeeze=False)
    for ax, name in zip(axes[:, 0], worst, strict=False):
        hist = reports[name].ulp_histogram
        ax.bar(list(hist.keys()), list(hist.values()))
        # no finite result at all (every value became NaN): matplotlib 3.7 warns on a log scale
        ax.set_yscale("log" if any(hist.values()) else "linear")
        ax.set_title(f"{name} -> {target}: error in target ULPs", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return {
        "file": path,
        "tensors": worst,
        "left_out": left_out,
        "criterion": criterion,
        "summary": summary,
    }
