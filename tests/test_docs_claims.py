"""What the README and the docs state, checked against what is true.

* Every benchmark figure quoted in README.md and docs/ comes from the committed report
  (docs/bench/report.md): a prose figure is a link to the report whose title names the
  report's row (``[4.07×](bench/report.md "bfloat16 -> float32; 16M (2^24)")``: every
  ``;``-separated part is found in one row of the report, and every number of the
  link's text in that row); a table of figures follows ``<!-- tb:report "## 14." -->``
  and every number in it is found in that section of the report. A speed ratio written
  without such a link is refused.
* The table of NaN narrowed to bfloat16, per source dtype, is what torch does.
* No address of the project is invented (none is published yet).
* The front door's examples can run twice in one directory.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import tensorbridge as tb

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "docs" / "bench" / "report.md"
PAGES = [
    p
    for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    if p != REPORT and p.name != "changelog.md"  # the changelog records past runs
]
_LINK = re.compile(
    r"\[(?P<text>[^\]]+)\]\((?:docs/|(?:\.\./)+)?bench/report\.md \"(?P<row>[^\"]+)\"\)"
)
_TABLE = re.compile(r"<!-- tb:report \"(?P<section>[^\"]+)\"[^>]*-->\n(?P<table>(?:\|.*\n)+)")
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
_RATIO = re.compile(
    r"\d+(?:\.\d+)?\s?[x×]\s+(?:faster|as fast|slower|quicker)|≥\s?\d+(?:\.\d+)?\s?[x×]"
)


def _numbers(text: str) -> list[str]:
    return [n.replace(",", "") for n in _NUMBER.findall(text)]


def _report_lines() -> list[str]:
    return REPORT.read_text(encoding="utf-8").splitlines()


def _quoted_links() -> list[tuple[str, str, str]]:
    return [
        (p.relative_to(ROOT).as_posix(), m["text"], m["row"])
        for p in PAGES
        for m in _LINK.finditer(p.read_text(encoding="utf-8"))
    ]


def test_the_docs_quote_report_figures() -> None:
    assert len(_quoted_links()) >= 5  # a parser change that finds nothing fails here


@pytest.mark.parametrize("page,text,row", _quoted_links(), ids=lambda x: str(x)[:40])
def test_a_quoted_figure_is_the_reports(page: str, text: str, row: str) -> None:
    parts = [p.strip() for p in row.split(";")]
    rows = [line for line in _report_lines() if all(p in line for p in parts)]
    assert len(rows) == 1, f"{page}: {row!r} names {len(rows)} rows of the report"
    there = set(_numbers(rows[0]))
    for number in _numbers(text):
        assert number in there, f"{page}: {number} is not in the report's row {rows[0]!r}"


def _quoted_tables() -> list[tuple[str, str, str]]:
    return [
        (p.relative_to(ROOT).as_posix(), m["section"], m["table"])
        for p in PAGES
        for m in _TABLE.finditer(p.read_text(encoding="utf-8"))
    ]


@pytest.mark.parametrize("page,section,table", _quoted_tables(), ids=lambda x: str(x)[:20])
def test_a_quoted_table_is_the_reports(page: str, section: str, table: str) -> None:
    text = REPORT.read_text(encoding="utf-8")
    start = text.index("\n" + section)
    end = text.find("\n## ", start + 1)
    there = set(_numbers(text[start : end if end > 0 else None]))
    for number in _numbers(table):
        assert number in there, f"{page}: {number} is not in the report's {section}"


def test_no_speed_ratio_is_quoted_without_the_report() -> None:
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        linked = [m.span() for m in _LINK.finditer(text)]
        for m in _RATIO.finditer(text):
            inside = any(a <= m.start() < b for a, b in linked)
            assert inside, f"{page.relative_to(ROOT)}: {m.group()!r} quotes no report row"


# --- NaN narrowed to bfloat16 -----------------------------------------------------------------


def _nan_table() -> dict[str, tuple[int, int]]:
    text = (ROOT / "docs" / "dtypes.md").read_text(encoding="utf-8")
    table = text[text.index("<!-- tb:nan-to-bf16") :].split("\n\n")[0]
    rows = [line.strip("|").split("|") for line in table.splitlines()[3:]]
    return {r[0].strip(): (int(r[1].strip(" `"), 16), int(r[2].strip(" `"), 16)) for r in rows}


def _nans(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Positive and negative NaNs of ``dtype``: the default one and payloads (quiet, signalling)."""
    bits = {torch.float16: 16, torch.float32: 32, torch.float64: 64}[dtype]
    exp = {16: 5, 32: 8, 64: 11}[bits]
    mant = bits - 1 - exp
    quiet = ((1 << exp) - 1) << mant | 1 << (mant - 1)
    pos = [quiet, quiet | 1, ((1 << exp) - 1) << mant | 1]  # default, payload, signalling
    carrier = {16: np.uint16, 32: np.uint32, 64: np.uint64}[bits]
    signed = np.array(pos, dtype=carrier), np.array([p | 1 << (bits - 1) for p in pos], carrier)
    as_float = {16: np.float16, 32: np.float32, 64: np.float64}[bits]
    return tuple(torch.from_numpy(s.view(as_float)) for s in signed)  # type: ignore[return-value]


def test_nan_to_bfloat16_table_is_what_torch_does() -> None:
    table = _nan_table()
    assert sorted(table) == ["float16", "float32", "float64"]
    for name, (want_pos, want_neg) in table.items():
        pos, neg = _nans(getattr(torch, name))
        assert all(math.isnan(v) for v in [*pos.tolist(), *neg.tolist()])
        for values, want in ((pos, want_pos), (neg, want_neg)):
            got = tb.to_numpy(values, dtype="bf16").view(np.uint16)
            assert got.tolist() == [want] * len(values), name
            plain = values.to(torch.bfloat16).view(torch.uint16).tolist()
            assert plain == [want] * len(values), name  # Tensor.to() does the same


# --- addresses --------------------------------------------------------------------------------


def test_no_project_address_is_invented() -> None:
    files = [*PAGES, ROOT / "pyproject.toml", ROOT / "mkdocs.yml", ROOT / "SECURITY.md"]
    for f in files:
        for url in re.findall(r"https?://[^\s)>\"'`]+", f.read_text(encoding="utf-8")):
            assert "tensorbridge" not in url.lower(), f"{f.relative_to(ROOT)}: {url}"


# --- the front door runs twice ----------------------------------------------------------------


@pytest.mark.parametrize("page", ["docs/getting-started.md", "docs/cli.md"])
def test_front_door_examples_run_twice(
    page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = (ROOT / page).read_text(encoding="utf-8")
    code = "\n".join(re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M))
    monkeypatch.chdir(tmp_path)
    for _ in range(2):  # the second run finds what the first left behind
        exec(compile(code, page, "exec"), {"__name__": "__docs__"})
