"""Exit statuses and error lines: how a failure reaches the shell.

A user error is one line on stderr (``tensorbridge COMMAND: error: ...``) and exit
status 1; a command line that makes no sense raises :class:`UsageError` (2, argparse's
own status); a reader that went away (``| head``) ends the command with 141. The
library's messages end in the fix a Python caller makes; :func:`cli_words` turns them
into the options a shell user passes, once, for every error and note printed.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Mapping

EXIT_OK = 0
EXIT_FAILURE = 1  # an error, or a check that failed (compare outside tolerance, ...)
EXIT_USAGE = 2  # argparse's own status for a command line that makes no sense
EXIT_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader went away


class UsageError(Exception):
    """A command line that makes no sense: exit status 2."""


def message(e: BaseException) -> str:
    """An expected error's message: a KeyError's text unquoted, an OSError without its
    ``[Errno N]`` (``missing.pt: No such file or directory``)."""
    if isinstance(e, KeyError) and e.args:
        return str(e.args[0])
    if isinstance(e, OSError) and e.strerror:
        return f"{e.filename}: {e.strerror}" if e.filename is not None else e.strerror
    return str(e)


def error(command: str, text: str) -> None:
    """One line on stderr, in the command line's words (see :func:`cli_words`)."""
    print(f"tensorbridge {command}: error: {cli_words(text)}", file=sys.stderr)


def note(text: str) -> None:
    """A note on stderr, in the command line's words."""
    print(f"note: {cli_words(text)}", file=sys.stderr)


def enable_faulthandler() -> None:
    """A SIGBUS (a mapped file truncated by another process mid-read) prints a traceback."""
    import faulthandler

    if not faulthandler.is_enabled() and sys.__stderr__ is not None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            faulthandler.enable(file=sys.__stderr__)


# The library's messages end in the fix a Python caller makes (``pass a.astype(np.float64)``,
# ``pass scheme=...``); a shell cannot act on those. Every error, note and skipped entry the
# command line prints passes through cli_words once: a fix that has an option becomes that
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
        # a GGUF file's required key (tb.save's check): the options that give it
        (
            r"pass metadata=\{'general\.architecture': \.\.\., \.\.\.\}",
            "pass --metadata general.architecture=NAME (e.g. llama), or --metadata-json FILE",
        ),
        # tb.quantize_checkpoint's fixes
        (r"\(tb\.open\(src, dequantize='bf16'\), then tb\.save\)", "(convert --dequantize bf16)"),
        (r"\(leave '([^']+)' out of names=\)", r"(--exclude \1)"),
        (r"\bignore=\[('[^']*')\]", r"--ignore \1"),
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


def cli_words(message: str) -> str:
    """``message`` as a command line says it: options for Python arguments, no Python calls.

    >>> cli_words("x is float128; pass a.astype(np.float64), which rounds to 53 bits")
    'x is float128'
    >>> cli_words("ambiguous; pass scheme='gptq' or block_size=(64, 64)")
    'ambiguous; pass --scheme NAME or --block-size R,C'
    >>> cli_words("a.pt exists; pass overwrite=True (command line: --overwrite) to replace it")
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


# A Python argument as a message writes it: ``name='text'``, ``name=['a', 'b']``,
# ``name=(128, 128)`` or a bare ``name=`` ("leave out name=").
_ARGUMENT = r"\b({names})=(?:'([^']*)'|\[([^\]]*)\]|\((\d+), ?(\d+)\)|(?![\w'\"\[({{]))"


def as_options(text: str, options: Mapping[str, str]) -> str:
    """``text`` with each Python argument of ``options`` written as the option a command
    gives it, what was given included (:func:`cli_words` leaves a message's first clause,
    what was given, as it is: a command that knows which option stood for an argument
    says so first).

    >>> as_options("scheme='gptq': not written; leave out layout=", {"scheme": "--quantize",
    ...            "layout": "--layout"})
    '--quantize gptq: not written; leave out --layout'
    >>> as_options("ignore both (ignore=['e.*']) or block_size=(64, 64)",
    ...            {"ignore": "--ignore", "block_size": "--block-size"})
    "ignore both (--ignore 'e.*') or --block-size 64,64"
    """
    if not options:
        return text
    pattern = re.compile(_ARGUMENT.format(names="|".join(map(re.escape, options))))

    def option(m: re.Match[str]) -> str:
        flag = options[m.group(1)]
        if m.group(2) is not None:
            return f"{flag} {m.group(2)}"
        if m.group(3) is not None:
            return " ".join(f"{flag} {item.strip()}" for item in m.group(3).split(","))
        if m.group(4) is not None:
            return f"{flag} {m.group(4)},{m.group(5)}"
        return flag

    return pattern.sub(option, text)
