"""Check a built copy of the documentation site for problems `mkdocs build --strict` misses.

Usage (CI runs this right after building the site)::

    python docs/_tools/check_site.py /tmp/site-check

MkDocs validates the Markdown it is given, but not everything that ends up in the built HTML:
links written inside raw HTML, anchors that the theme or mkdocstrings generate, the search
index, and the layout. This script reads every ``.html`` file of the built site and checks:

1. Links. Every internal ``href``/``src`` (relative, or absolute under the site's own path,
   which is read from the canonical link of the home page) must point at a file that exists
   in the site directory, a directory standing for its ``index.html``; a ``#fragment`` must
   name an ``id`` (or an ``<a name>``) in the target page. Links with a scheme or a host
   (``https:``, ``mailto:``, ``javascript:``, ``data:``, ``//host``) are not checked.
2. Search. ``search/search_index.json`` must exist, parse, have a ``docs`` list that has at
   least one entry for every built page (the page's URL is the ``location`` before ``#``;
   ``404.html`` is never indexed), and give at least one hit for each query in
   ``SEARCH_QUERIES`` when searched the simple way: a case-insensitive substring of an
   entry's title or text. A broken index makes the search box silently return nothing.
3. Width. A static stand-in for "the page fits a 1280-pixel-wide window without sideways
   scrolling": no line of a ``<pre>`` block (tags stripped, entities unescaped) is longer
   than ``PRE_MAX_CHARS``, on every page, the benchmark report included; and no table is
   estimated wider than ``TABLE_MAX_CHARS``. A table's width is estimated as the sum over its
   columns of the widest cell in that column, plus ``TABLE_CELL_PADDING`` per column, where a
   cell's width is its longest unbreakable run: browsers wrap cell text at spaces (and at
   ``<wbr>``), so a cell with spaces counts as its longest word.
4. Headings. Every page has exactly one ``<h1>``: the page title, for readers, screen readers
   and search engines alike.

It prints one line per problem on stderr and exits 1, or exits 0 when it finds none. Only
the standard library is used, so it runs wherever the site was built.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

# The longest line of a code block, in characters, that shows without a horizontal scrollbar
# in Material's content column at a 1280-pixel-wide window (monospace at its default size).
PRE_MAX_CHARS = 82

# The widest table, in characters of body text, that fits the same content column; wider
# tables get a scrollbar (Material wraps them in a scrolling box) or squash their columns.
TABLE_MAX_CHARS = 110
# The same for a page that hides its navigation and table of contents (the benchmark report):
# its content column is about the whole 1280-pixel window.
TABLE_MAX_CHARS_FULL_WIDTH = 180
# A run of text with no space counts this many characters at most: the site's stylesheet lets
# code in a table cell wrap, and the browser breaks a longer run (Material's code breaks words).
TOKEN_MAX_CHARS = 24

# The characters one table column adds on top of its text: the cell padding on both sides.
TABLE_CELL_PADDING = 3

# Queries the search box must answer; each names something a reader is likely to look for.
SEARCH_QUERIES = ("bfloat16", "to_numpy", "safetensors", "overwrite")

# Built pages that MkDocs never puts in the search index.
SEARCH_EXEMPT_PAGES = frozenset({"404.html"})

# Where the search plugin writes its index, relative to the site directory.
SEARCH_INDEX = "search/search_index.json"

# Separators a browser may wrap table-cell text at: ASCII whitespace (not the no-break space)
# and the zero-width space, which is what a <wbr> tag is recorded as below.
_BREAK = "\u200b"
_HIDDEN_NAVIGATION = re.compile(r'<div class="md-sidebar md-sidebar--primary"[^>]*\bhidden\b')
_WRAP_POINTS = re.compile(r"[ \t\n\r\f\u200b]+")
_SPACES = re.compile(r"[ \t\n\r\f]+")

# Link-carrying attributes that are checked.
_LINK_ATTRS = frozenset({"href", "src"})

# Void elements: they have no end tag, so they never open a scope.
_VOID = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}
)


@dataclass
class Link:
    """One ``href`` or ``src`` value found on a page."""

    value: str
    line: int


@dataclass
class PreBlock:
    """The text of one ``<pre>`` element, and the section it sits in."""

    text: str
    section: str


@dataclass
class Table:
    """The rows of one ``<table>``: each cell as (text, colspan)."""

    section: str
    rows: list[list[tuple[str, int]]] = field(default_factory=list)


@dataclass
class _OpenTable:
    table: Table
    row: list[tuple[str, int]] | None = None
    cell: list[str] | None = None
    colspan: int = 1


class PageParser(HTMLParser):
    """Collects what the checks need from one page in a single pass."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[Link] = []
        self.anchors: set[str] = set()
        self.h1_count = 0
        self.pres: list[PreBlock] = []
        self.tables: list[Table] = []
        self.canonical: str | None = None
        self._section = "(top)"
        self._pre_depth = 0
        self._pre_text: list[str] = []
        self._open_tables: list[_OpenTable] = []

    # -- tags --------------------------------------------------------------------------------

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value for name, value in attrs if value is not None}
        line = self.getpos()[0]
        for name, value in attrs:
            if name in _LINK_ATTRS and value is not None:
                self.links.append(Link(value.strip(), line))
        if "id" in values:
            self.anchors.add(values["id"])
        if tag == "a" and "name" in values:
            self.anchors.add(values["name"])
        if tag == "link" and "canonical" in values.get("rel", "").lower().split():
            self.canonical = values.get("href")
        if tag == "h1":
            self.h1_count += 1
        if tag in {"h1", "h2", "h3", "h4", "h5", "h6"} and "id" in values:
            self._section = "#" + values["id"]
        if tag == "pre":
            if self._pre_depth == 0:
                self._pre_text = []
            self._pre_depth += 1
        elif tag == "br":
            self._text("\n" if self._pre_depth else " ")
        elif tag == "wbr":
            self._cell_text(_BREAK)
        self._table_start(tag, values)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in _VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag == "pre" and self._pre_depth:
            self._pre_depth -= 1
            if self._pre_depth == 0:
                self.pres.append(PreBlock("".join(self._pre_text), self._section))
        self._table_end(tag)

    def handle_data(self, data: str) -> None:
        self._text(data)

    # -- text --------------------------------------------------------------------------------

    def _text(self, data: str) -> None:
        if self._pre_depth:
            self._pre_text.append(data)
        self._cell_text(data)

    def _cell_text(self, data: str) -> None:
        if self._open_tables and self._open_tables[-1].cell is not None:
            self._open_tables[-1].cell.append(data)

    # -- tables ------------------------------------------------------------------------------

    def _table_start(self, tag: str, values: dict[str, str]) -> None:
        if tag == "table":
            table = Table(self._section)
            self.tables.append(table)
            self._open_tables.append(_OpenTable(table))
            return
        if not self._open_tables:
            return
        state = self._open_tables[-1]
        if tag == "tr":
            self._close_row(state)
            state.row = []
        elif tag in {"td", "th"}:
            self._close_cell(state)
            if state.row is None:
                state.row = []
            state.cell = []
            try:
                state.colspan = max(1, int(values.get("colspan", "1")))
            except ValueError:
                state.colspan = 1

    def _table_end(self, tag: str) -> None:
        if not self._open_tables:
            return
        state = self._open_tables[-1]
        if tag in {"td", "th"}:
            self._close_cell(state)
        elif tag == "tr":
            self._close_row(state)
        elif tag == "table":
            self._close_row(state)
            self._open_tables.pop()

    @staticmethod
    def _close_cell(state: _OpenTable) -> None:
        if state.cell is not None and state.row is not None:
            state.row.append(("".join(state.cell), state.colspan))
        state.cell = None
        state.colspan = 1

    def _close_row(self, state: _OpenTable) -> None:
        self._close_cell(state)
        if state.row is not None:
            state.table.rows.append(state.row)
        state.row = None


@dataclass
class Page:
    """One built HTML page: its path relative to the site directory, and what was parsed."""

    rel: str
    parsed: PageParser
    full_width: bool = False  # the page hides its navigation sidebar (front matter ``hide``)

    @property
    def url(self) -> str:
        """The page's URL relative to the site root, as the search index writes it."""
        if self.rel == "index.html":
            return ""
        if self.rel.endswith("/index.html"):
            return self.rel[: -len("index.html")]
        return self.rel


@dataclass
class Problem:
    """One finding: its kind (for grouping), and the line that reports it."""

    kind: str
    message: str


def load_pages(site: Path) -> dict[str, Page]:
    """Parse every ``.html`` file under ``site``, keyed by its POSIX path relative to it."""
    pages: dict[str, Page] = {}
    for path in sorted(site.rglob("*.html")):
        parser = PageParser()
        text = path.read_text(encoding="utf-8", errors="replace")
        parser.feed(text)
        parser.close()
        rel = path.relative_to(site).as_posix()
        pages[rel] = Page(rel, parser, _HIDDEN_NAVIGATION.search(text) is not None)
    return pages


def site_base_path(pages: dict[str, Page]) -> str:
    """The URL path the site is served under (``/tensorbridge/``), from the home page."""
    home = pages.get("index.html")
    if home is not None and home.parsed.canonical:
        path = urlsplit(home.parsed.canonical).path or "/"
        return path if path.endswith("/") else path.rsplit("/", 1)[0] + "/"
    return "/"


# -- 1. links ---------------------------------------------------------------------------------


def resolve_target(site: Path, rel: str) -> Path | None:
    """The file a site-relative URL path is served from, or None when there is none."""
    candidate = site / rel
    if rel == "" or rel.endswith("/") or candidate.is_dir():
        candidate = candidate / "index.html"
    return candidate if candidate.is_file() else None


def check_links(site: Path, pages: dict[str, Page], base: str) -> list[Problem]:
    """Internal links must reach an existing file, and their fragment an existing anchor."""
    problems: list[Problem] = []
    origin = "http://site.invalid"
    anchors_of: dict[Path, set[str] | None] = {}
    for page in pages.values():
        page_url = origin + base + page.rel
        seen: set[str] = set()
        for link in page.parsed.links:
            value = link.value
            if value in seen:
                continue
            seen.add(value)
            parts = urlsplit(value)
            if parts.scheme or parts.netloc:
                continue  # http(s):, mailto:, javascript:, data:, //host: not ours to check
            # urljoin also removes "." and ".." segments; climbing above the root stops there.
            path = unquote(urlsplit(urljoin(page_url, value)).path)
            where = f"{page.rel}:{link.line}: {value!r}"
            if path == base.rstrip("/"):
                path = base
            if not path.startswith(base):
                problems.append(Problem("links", f"{where} leaves the site path {base}"))
                continue
            rel = path[len(base) :]
            target = resolve_target(site, rel)
            if target is None:
                shown = rel + "index.html" if rel == "" or rel.endswith("/") else rel
                problems.append(Problem("links", f"{where} points at a missing file: {shown}"))
                continue
            fragment = unquote(parts.fragment)
            # An empty fragment, and "#top" when nothing is called that, mean the page's top.
            if not fragment or fragment.lower() == "top" or target.suffix != ".html":
                continue
            if target not in anchors_of:
                key = target.relative_to(site).as_posix()
                anchors_of[target] = pages[key].parsed.anchors if key in pages else None
            anchors = anchors_of[target]
            if anchors is not None and fragment not in anchors:
                shown = target.relative_to(site).as_posix()
                problems.append(
                    Problem("links", f"{where} names a missing anchor #{fragment} in {shown}")
                )
    return problems


# -- 2. search --------------------------------------------------------------------------------


def check_search(site: Path, pages: dict[str, Page]) -> list[Problem]:
    """The search index must exist, cover every page, and answer the sample queries."""
    index_path = site / SEARCH_INDEX
    if not index_path.is_file():
        return [Problem("search", f"{SEARCH_INDEX} is missing")]
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return [Problem("search", f"{SEARCH_INDEX} does not parse: {error}")]
    docs = index.get("docs") if isinstance(index, dict) else None
    if not isinstance(docs, list):
        return [Problem("search", f"{SEARCH_INDEX} has no 'docs' list")]
    entries = [entry for entry in docs if isinstance(entry, dict)]
    problems: list[Problem] = []
    if len(entries) != len(docs):
        bad = len(docs) - len(entries)
        problems.append(Problem("search", f"{SEARCH_INDEX}: {bad} 'docs' entries are not objects"))

    indexed = {unquote(str(entry.get("location", "")).split("#", 1)[0]) for entry in entries}
    for page in pages.values():
        if page.rel not in SEARCH_EXEMPT_PAGES and page.url not in indexed:
            problems.append(
                Problem("search", f"{page.rel}: no search-index entry for its URL {page.url!r}")
            )

    haystacks = [
        (str(entry.get("title", "")) + "\n" + str(entry.get("text", ""))).lower()
        for entry in entries
    ]
    for query in SEARCH_QUERIES:
        needle = query.lower()
        if not any(needle in haystack for haystack in haystacks):
            problems.append(Problem("search", f"query {query!r} finds nothing in the index"))
    return problems


# -- 3. width ---------------------------------------------------------------------------------


def check_pre_width(pages: dict[str, Page]) -> list[Problem]:
    """No line of a ``<pre>`` block may be longer than ``PRE_MAX_CHARS``."""
    problems: list[Problem] = []
    for page in pages.values():
        for number, pre in enumerate(page.parsed.pres, start=1):
            for line_number, line in enumerate(pre.text.split("\n"), start=1):
                width = len(line.expandtabs(8).rstrip())
                if width > PRE_MAX_CHARS:
                    preview = line.strip()
                    if len(preview) > 60:
                        preview = preview[:57] + "..."
                    problems.append(
                        Problem(
                            "pre-width",
                            f"{page.rel}: <pre> #{number} ({pre.section}) line {line_number} "
                            f"is {width} chars > {PRE_MAX_CHARS}: {preview!r}",
                        )
                    )
    return problems


def cell_width(text: str) -> int:
    """How wide a cell can get squeezed: its longest run of text with no wrap point."""
    collapsed = _SPACES.sub(" ", text).strip(" " + _BREAK)
    tokens = _WRAP_POINTS.split(collapsed)
    return max((min(len(token), TOKEN_MAX_CHARS) for token in tokens), default=0)


def table_widths(table: Table) -> list[int]:
    """The estimated width of each column: its widest cell, cells spanning columns skipped."""
    widths: list[int] = []
    for row in table.rows:
        column = 0
        for text, colspan in row:
            while len(widths) < column + colspan:
                widths.append(0)
            if colspan == 1:
                widths[column] = max(widths[column], cell_width(text))
            column += colspan
    return widths


def check_table_width(pages: dict[str, Page]) -> list[Problem]:
    """No table may be estimated wider than ``TABLE_MAX_CHARS``."""
    problems: list[Problem] = []
    for page in pages.values():
        for number, table in enumerate(page.parsed.tables, start=1):
            widths = table_widths(table)
            total = sum(widths) + TABLE_CELL_PADDING * len(widths)
            budget = TABLE_MAX_CHARS_FULL_WIDTH if page.full_width else TABLE_MAX_CHARS
            if total > budget:
                columns = " + ".join(str(width) for width in widths)
                problems.append(
                    Problem(
                        "table-width",
                        f"{page.rel}: table #{number} ({table.section}) is about {total} chars "
                        f"wide > {budget} (columns {columns}, "
                        f"+{TABLE_CELL_PADDING} each)",
                    )
                )
    return problems


# -- 4. headings ------------------------------------------------------------------------------


def check_h1(pages: dict[str, Page]) -> list[Problem]:
    """Every page has exactly one ``<h1>``."""
    return [
        Problem("h1", f"{page.rel}: {page.parsed.h1_count} <h1> elements, expected exactly 1")
        for page in pages.values()
        if page.parsed.h1_count != 1
    ]


# -- driver -----------------------------------------------------------------------------------


def check_site(site: Path, base: str | None = None) -> list[Problem]:
    """Run every check over the built site in ``site`` and return the problems found."""
    pages = load_pages(site)
    if not pages:
        return [Problem("site", f"{site}: no .html pages found")]
    base_path = base or site_base_path(pages)
    if not base_path.startswith("/"):
        base_path = "/" + base_path
    if not base_path.endswith("/"):
        base_path += "/"
    return [
        *check_links(site, pages, base_path),
        *check_search(site, pages),
        *check_pre_width(pages),
        *check_table_width(pages),
        *check_h1(pages),
    ]


def main(argv: list[str] | None = None) -> int:
    """Check the site directory named on the command line; 0 when fine, 1 when not."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("site_dir", type=Path, help="the directory `mkdocs build` wrote")
    parser.add_argument(
        "--base-path",
        help="the URL path the site is served under (default: from the home page's "
        "canonical link, e.g. /tensorbridge/)",
    )
    args = parser.parse_args(argv)
    site: Path = args.site_dir
    if not site.is_dir():
        print(f"check_site: {site} is not a directory", file=sys.stderr)
        return 1
    problems = check_site(site, args.base_path)
    for problem in problems:
        print(f"{problem.kind}: {problem.message}", file=sys.stderr)
    if problems:
        counts: dict[str, int] = {}
        for problem in problems:
            counts[problem.kind] = counts.get(problem.kind, 0) + 1
        summary = ", ".join(f"{kind} {count}" for kind, count in counts.items())
        print(f"check_site: {len(problems)} problems ({summary})")
        return 1
    print(f"check_site: {site} is fine")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
