"""Every ```python block in README.md and docs/**/*.md runs, and must assert its result.

A page's blocks run in order in one namespace (a later block may use what an earlier
one defined), in a fresh temporary working directory, under the suite's warning
filters (a warning is an error). Tracebacks point at the Markdown file and line.

A block preceded by ``<!-- requires: jax -->`` (a comma-separated list of importable
modules, each optionally with a version range: ``numpy<2.5``, ``ml_dtypes>=0.7``) runs only
when those modules import at those versions; otherwise it is reported as a skipped test of
its own, with the reason. A page shows behaviour that changed between releases as one
block for each side. ```bash and other blocks are not run.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<ticks>`{3,})(?P<info>[^`]*)$")
_REQUIRES = re.compile(r"^\s*<!--\s*requires:\s*(?P<mods>[\w., <>=!]+?)\s*-->\s*$")
_PYTHON_LIKE = {"py", "python3", "pycon", "py3"}  # would escape the runner: use ```python


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the first code line
    code: str
    requires: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def missing(self) -> list[str]:
        """The requirements not met: "jax (not installed)", "numpy<2.5 (this is 2.5.5)"."""
        unmet = []
        for spec in self.requires:
            req = Requirement(spec)
            if importlib.util.find_spec(req.name) is None:
                unmet.append(f"{spec} (not installed)")
                continue
            if req.specifier:
                have = importlib.metadata.version(req.name)
                if not req.specifier.contains(have, prereleases=True):
                    unmet.append(f"{spec} (this is {have})")
        return unmet


HIDDEN: list[str] = []  # Python-looking fences the runner would not run


def blocks_of(page: Path) -> list[Block]:
    """The ```python blocks of a page, in order, with their ``requires`` markers."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, ticks = m.group("indent"), m.group("ticks")
        lang = m.group("info").strip().split(" ")[0].lower() if m.group("info").strip() else ""
        start = i + 1
        end = start
        while end < len(lines) and not (
            lines[end].strip().startswith(ticks) and lines[end].strip().strip("`") == ""
        ):
            end += 1
        if lang == "python":
            prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            req = _REQUIRES.match(prev)
            mods = tuple(s.strip() for s in req.group("mods").split(",")) if req else ()
            body = [ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines[start:end]]
            found.append(Block(page, start + 1, "\n".join(body) + "\n", mods))
        elif lang in _PYTHON_LIKE:
            HIDDEN.append(f"{page.relative_to(ROOT)}:{i + 1}: ```{lang}")
        i = end + 1
    return found


ALL = {page: blocks_of(page) for page in PAGES}
RUNNABLE = [page for page, blocks in ALL.items() if blocks]
MARKED = [b for blocks in ALL.values() for b in blocks if b.requires]


def _id(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", RUNNABLE, ids=_id)
def test_page_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the page's blocks in order in one namespace; any exception fails the test."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    namespace: dict[str, object] = {"__name__": "__docs__"}
    for block in ALL[page]:
        if block.missing():
            continue  # reported by test_marked_examples_have_their_modules
        # pad so that tracebacks give the line in the Markdown file
        code = compile("\n" * (block.line - 1) + block.code, str(block.page), "exec")
        exec(code, namespace)


@pytest.mark.parametrize("block", MARKED, ids=lambda b: f"{b.where}[{','.join(b.requires)}]")
def test_marked_examples_have_their_modules(block: Block) -> None:
    """A ``<!-- requires: X -->`` block skips, with the reason, when X is not installed.

    When X is installed (at the version asked for) the block has already run as part of
    its page's test.
    """
    missing = block.missing()
    if missing:
        pytest.skip(reason=f"{block.where} needs {', '.join(missing)}")


@pytest.mark.parametrize(
    "block", [b for blocks in ALL.values() for b in blocks], ids=lambda b: b.where
)
def test_every_example_asserts(block: Block) -> None:
    """An example that asserts nothing can rot silently: each block has an ``assert``."""
    tree = ast.parse(block.code, filename=block.where)
    assert any(isinstance(node, ast.Assert) for node in ast.walk(tree)), (
        f"{block.where}: this ```python block asserts nothing; check its result with assert"
    )


def test_no_python_hides_under_another_name() -> None:
    """```py, ```python3 or ```pycon would escape the runner: every example says ```python."""
    assert not HIDDEN, f"use ```python for these blocks so that they run: {HIDDEN}"


def test_examples_were_found() -> None:
    """Guard against a parser change that silently finds nothing to run."""
    assert len(RUNNABLE) >= 5
    assert sum(len(b) for b in ALL.values()) >= 30
