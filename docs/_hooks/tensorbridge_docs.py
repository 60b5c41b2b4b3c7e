"""MkDocs hook: pages generated from the code at build time, never hand-copied.

A page asks for generated content with an HTML comment on a line of its own,
``<!-- tb:NAME -->``; :func:`on_page_markdown` replaces it with the Markdown that
``GENERATORS[NAME]`` returns. An unknown name fails the build. The generators:

* ``dtype-table``: one row per entry of ``tensorbridge.dtype_table()`` (name, torch
  dtype, NumPy dtype, bytes, safetensors code, aliases; the torch side says "no kernels"
  for torch's sub-byte integers and "NumPy only" for the types torch lacks), so the page
  lists exactly what the installed torch and ml_dtypes support.
* ``unsupported-dtypes``: dtypes with no counterpart on the other side, each with the
  message (and so the fix) that tensorbridge itself raises for it.
* ``cli-reference``: the ``--help`` of ``tensorbridge`` and of every subcommand, read
  from the argparse parser in ``tensorbridge.cli`` (``_parser()``).
* ``versions``: the torch / NumPy / ml_dtypes versions the site was built with.
* ``security-policy``: the repository's ``SECURITY.md`` without its title, so the
  policy GitHub shows and the site's page are one text.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import torch

import tensorbridge as tb
from tensorbridge.cli import _parser

_MARKER = re.compile(r"^<!-- tb:([a-z0-9-]+) -->$", re.M)
HELP_COLUMNS = 82  # argparse wraps help at the terminal width; fix it for a stable page


def _code(s: str) -> str:
    return f"`{s}`"


def dtype_table() -> str:
    lines = [
        "| name | torch | NumPy | bytes | safetensors | aliases |",
        "| --- | --- | --- | ---: | --- | --- |",
    ]
    for row in tb.dtype_table():
        numpy_side = f"`numpy.{row.numpy}`" if row.carrier is None else f"`ml_dtypes.{row.numpy}`"
        torch_side = _code(str(row.torch)) if row.in_torch else "— (NumPy only)"
        if row.in_torch and not row.kernels:
            torch_side += " (no kernels)"
        lines.append(
            "| "
            + " | ".join(
                [
                    f"**{row.name}**",
                    torch_side,
                    numpy_side,
                    str(row.itemsize),
                    _code(row.safetensors) if row.safetensors else "—",
                    ", ".join(_code(a) for a in row.aliases) or "—",
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def _message(spec: Callable[[], Any]) -> str | None:
    """The message tensorbridge raises for a dtype, or None when it converts."""
    try:
        spec()
    except tb.UnsupportedDtypeError as e:
        return str(e)
    return None


def _unsupported() -> list[tuple[str, str, str]]:
    """(side, dtype, message) for every dtype with no counterpart, as tensorbridge says it."""
    found: list[tuple[str, str, str]] = []

    def torch_side(dt: torch.dtype) -> None:
        msg = _message(lambda: tb.resolve_dtype(dt))
        if msg:
            found.append(("torch", str(dt), msg))

    names = [
        "float4_e2m1fn_x2", "qint8", "quint8", "qint32", "quint4x2", "quint2x4",
        "bits1x8", "bits2x4", "bits4x2", "bits8", "bits16",
        *(f"int{i}" for i in range(1, 8)), *(f"uint{i}" for i in range(1, 8)),
    ]  # fmt: skip
    for name in names:
        dt = getattr(torch, name, None)
        if isinstance(dt, torch.dtype):
            torch_side(dt)

    def numpy_side(label: str, make: Callable[[], np.ndarray]) -> None:
        msg = _message(lambda: tb.to_torch(make()))
        if msg:
            found.append(("NumPy", label, msg))

    ml_names = [
        "int1", "int2", "int4", "uint1", "uint2", "uint4", "float4_e2m1fn",
        "float6_e2m3fn", "float6_e3m2fn", "float8_e3m4", "float8_e4m3",
        "float8_e4m3b11fnuz", "float8_e5m3fnu", "bcomplex32",
    ]  # fmt: skip
    for name in ml_names:
        t = getattr(ml_dtypes, name, None)
        if t is not None:
            numpy_side(f"ml_dtypes.{name}", lambda t=t: np.zeros(2, dtype=t))
    numpy_side("datetime64[D]", lambda: np.zeros(2, dtype="datetime64[D]"))
    numpy_side("timedelta64[s]", lambda: np.zeros(2, dtype="timedelta64[s]"))
    numpy_side("object", lambda: np.array([1, "a"], dtype=object))
    numpy_side("str (<U1)", lambda: np.array(["a"]))
    numpy_side("bytes (S1)", lambda: np.array([b"a"]))
    numpy_side("structured", lambda: np.zeros(2, dtype=[("a", "<i4"), ("b", "<f4")]))
    numpy_side("raw void (V2)", lambda: np.zeros(2, dtype="V2"))
    if np.dtype(np.longdouble).itemsize > 8:
        numpy_side(f"longdouble ({np.dtype(np.longdouble)})", lambda: np.zeros(2, np.longdouble))
    return found


def unsupported_dtypes() -> str:
    lines = ["| side | dtype | what tensorbridge says |", "| --- | --- | --- |"]
    for side, name, msg in _unsupported():
        lines.append(f"| {side} | `{name}` | {_escape(msg)} |")
    return "\n".join(lines)


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help(parser: argparse.ArgumentParser) -> str:
    if hasattr(parser, "color"):  # Python 3.14+: never colour a page
        parser.color = False
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(HELP_COLUMNS)
    try:
        return parser.format_help().rstrip()
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def cli_reference() -> str:
    parser = _parser()
    commands = _subcommands(parser)
    parts = [
        "### tensorbridge",
        "",
        "```text",
        "$ tensorbridge --help",
        _help(parser),
        "```",
    ]
    for name, sub in commands.items():
        parts += ["", f"### tensorbridge {name}", "", "```text"]
        parts += [f"$ tensorbridge {name} --help", _help(sub), "```"]
    return "\n".join(parts)


def versions() -> str:
    return (
        f"tensorbridge {tb.__version__}, torch {torch.__version__}, NumPy {np.__version__}, "
        f"ml_dtypes {ml_dtypes.__version__}"
    )


def security_policy() -> str:
    text = (Path(__file__).resolve().parents[2] / "SECURITY.md").read_text(encoding="utf-8")
    body = text.split("\n", 1)[1]  # the page has its own title
    return body.replace("](docs/", "](").strip()


GENERATORS: dict[str, Callable[[], str]] = {
    "dtype-table": dtype_table,
    "unsupported-dtypes": unsupported_dtypes,
    "cli-reference": cli_reference,
    "versions": versions,
    "security-policy": security_policy,
}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    def expand(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in GENERATORS:
            raise ValueError(
                f"{page.file.src_path}: unknown generated block <!-- tb:{name} -->; "
                f"known: {', '.join(GENERATORS)}"
            )
        return GENERATORS[name]()

    return _MARKER.sub(expand, markdown)
