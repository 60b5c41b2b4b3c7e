"""Griffe extension: read tensorbridge's docstrings (written for doctest and Sphinx) as Markdown.

mkdocstrings renders docstrings as Markdown, where two things in them would go wrong:

* ``>>>`` doctest lines would become nested block quotes. Each run of them (up to the
  next blank line, outputs included) is wrapped in a ``pycon`` code fence.
* ``a, b: text`` or ``a / b: text`` in an ``Args:`` or ``Attributes:`` section (two
  names sharing one description) is split into one entry per name, so that each is
  matched against the signature and gets its own row.
* Sphinx roles (``:func:`~tensorbridge.to_numpy```, ``:class:`CopyRequiredError```)
  would print as they are. A role naming a public ``tensorbridge`` name, or a module
  this site renders, becomes a cross-reference (a broken one fails the strict build);
  any other role (private helpers) becomes plain code.

The source stays untouched: the docstrings keep working as doctests and in ``help()``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

import tensorbridge

_PUBLIC = {name for name in tensorbridge.__all__ if not name.startswith("_")}
# modules whose docstrings the site renders (api/*.md, formats.md, copy-contract.md)
RENDERED_MODULES = {
    "tensorbridge.convert",
    "tensorbridge.dtypes",
    "tensorbridge.tree",
    "tensorbridge.diagnostics",
    "tensorbridge.errors",
    "tensorbridge.io.safetensors",
    "tensorbridge.io.npy",
    "tensorbridge.io.npz",
    "tensorbridge.io.pt",
}
_ROLE = re.compile(r":(?:py:)?(?:class|func|mod|meth|attr|data|exc|obj):`(~?)([\w.]+)`")


def _role(m: re.Match[str]) -> str:
    tilde, target = m.group(1), m.group(2)
    last = target.rsplit(".", 1)[-1]
    if target in RENDERED_MODULES:
        return f"[`{last if tilde else target}`][{target}]"
    if last in _PUBLIC:
        return f"[`{last if tilde or '.' not in target else target}`][tensorbridge.{last}]"
    return f"`{last if tilde else target}`"


def _fence_doctests(text: str) -> str:
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith(">>>"):
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}```pycon")
            while i < len(lines) and lines[i].strip():
                out.append(lines[i])
                i += 1
            out.append(f"{indent}```")
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


_SECTION = re.compile(r"^(\s*)(Args|Arguments|Parameters|Attributes):\s*$")
_SHARED = re.compile(r"^(\s+)(\w+(?:\s*[,/]\s*\w+)+):(.*)$")


def _split_shared_args(text: str) -> str:
    lines = text.splitlines()
    out: list[str] = []
    in_args, section_indent = False, 0
    i = 0
    while i < len(lines):
        line = lines[i]
        head = _SECTION.match(line)
        if head:
            in_args, section_indent = True, len(head.group(1))
        elif line.strip() and len(line) - len(line.lstrip()) <= section_indent:
            in_args = False
        shared = _SHARED.match(line) if in_args and not head else None
        if shared is None:
            out.append(line)
            i += 1
            continue
        indent = shared.group(1)
        entry = [shared.group(3)]
        i += 1
        while (
            i < len(lines)
            and lines[i].strip()
            and len(lines[i]) - len(lines[i].lstrip()) > len(indent)
        ):
            entry.append("\n" + lines[i])
            i += 1
        for name in re.split(r"\s*[,/]\s*", shared.group(2)):
            out.append(f"{indent}{name}:" + "".join(entry))
    return "\n".join(out)


def markup(text: str) -> str:
    """The Markdown form of a docstring (see the module docstring)."""
    return _ROLE.sub(_role, _fence_doctests(_split_shared_args(text)))


class DocstringMarkup(griffe.Extension):
    """Applies :func:`markup` to every docstring griffe loads."""

    def on_object(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markup(obj.docstring.value)
