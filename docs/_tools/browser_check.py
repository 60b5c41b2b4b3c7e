"""Render pages of the built documentation site in headless Chromium and check their width.

Usage::

    python docs/_tools/browser_check.py /tmp/site-check [PAGE ...] [--out DIR]

``check_site.py`` estimates from the HTML whether code blocks and tables fit a 1280-pixel-wide
window; this script asks a real browser. It serves a temporary copy of the site directory
over http on localhost (so the theme's CSS and JavaScript load as they would when deployed),
and for each page (by default the home page, Getting started, the benchmark report and the
conversion API page):

* saves a screenshot at a 1280x900 window, ``<out>/<name>.png``, to look at;
* loads an instrumented copy of the page, written next to it in the temporary copy, whose
  injected script measures horizontal overflow once the page has loaded: whether the
  document is wider than the window (``documentElement.scrollWidth > innerWidth``), and
  which ``table``, ``pre`` and ``img`` elements are wider than their box (``scrollWidth >
  clientWidth``). Material wraps tables in a scrolling ``.md-typeset__scrollwrap`` box and
  scrolls a code block's ``<code>``, not its ``<pre>``, so those boxes are what is measured.
  The script writes its findings as JSON into ``<pre id="tb-width-report">``, which is read
  back from the DOM that ``chromium --dump-dom`` prints.

It prints a summary per page and exits 1 if any page overflows (or could not be measured),
else 0. It needs Debian's ``chromium`` on PATH; without it, it says so and exits 0, so CI
jobs without a browser pass. Only the standard library is used.
"""

from __future__ import annotations

import argparse
import functools
import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# Pages checked when none are named: the pages most likely to hold wide content.
DEFAULT_PAGES = (
    "index.html",
    "getting-started/index.html",
    "bench/report/index.html",
    "api/convert/index.html",
)

# The browser window: the narrowest common desktop width the docs promise to fit.
WINDOW_SIZE = (1280, 900)

# Milliseconds of virtual time Chromium gives a page's scripts before it dumps the DOM.
VIRTUAL_TIME_BUDGET_MS = 5000

# Seconds one Chromium run may take before it is abandoned.
CHROMIUM_TIMEOUT_S = 90

# The element the injected script writes its JSON report into.
REPORT_ID = "tb-width-report"

# The injected script, served from the root of the temporary copy of the site.
SCRIPT_NAME = "__tb_width_check.js"

# Suffix of the instrumented copy written next to each checked page.
INSTRUMENTED_SUFFIX = ".tb-width.html"

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    f"--window-size={WINDOW_SIZE[0]},{WINDOW_SIZE[1]}",
)

MEASURE_SCRIPT = """\
(function () {
  "use strict";
  function sectionOf(el) {
    let section = "(top)";
    for (const h of document.querySelectorAll("h1[id], h2[id], h3[id], h4[id], h5[id], h6[id]")) {
      if (h.compareDocumentPosition(el) & Node.DOCUMENT_POSITION_FOLLOWING) {
        section = "#" + h.id;
      } else {
        break;
      }
    }
    return section;
  }
  function snippet(el) {
    return (el.textContent || el.getAttribute("src") || "").replace(/\\s+/g, " ").trim()
      .slice(0, 60);
  }
  function measure() {
    const root = document.documentElement;
    const report = {
      innerWidth: window.innerWidth,
      scrollWidth: root.scrollWidth,
      documentOverflows: root.scrollWidth > window.innerWidth,
      elements: [],
    };
    const counts = {table: 0, pre: 0, img: 0};
    for (const el of document.querySelectorAll("table, pre, img")) {
      const tag = el.tagName.toLowerCase();
      counts[tag] += 1;
      let box = el;
      if (tag === "table") {
        box = el.closest(".md-typeset__scrollwrap") || el;
      } else if (tag === "pre") {
        box = el.querySelector(":scope > code") || el;
      }
      const rect = el.getBoundingClientRect();
      const scrolls = box.scrollWidth > box.clientWidth;
      const pastWindow = tag === "img" && rect.right > window.innerWidth;
      if (scrolls || pastWindow) {
        report.elements.push({
          tag: tag,
          index: counts[tag],
          section: sectionOf(el),
          measured: box === el ? tag : box.className || box.tagName.toLowerCase(),
          scrollWidth: box.scrollWidth,
          clientWidth: box.clientWidth,
          right: Math.round(rect.right),
          text: snippet(el),
        });
      }
    }
    report.counts = counts;
    const out = document.createElement("pre");
    out.id = "__REPORT_ID__";
    out.textContent = JSON.stringify(report);
    document.body.appendChild(out);
  }
  window.addEventListener("load", function () { setTimeout(measure, 500); });
})();
""".replace("__REPORT_ID__", REPORT_ID)

_REPORT_RE = re.compile(rf'<pre id="{REPORT_ID}">(.*?)</pre>', re.DOTALL)


@dataclass
class PageResult:
    """What was found for one page."""

    page: str
    screenshot: Path | None
    report: dict[str, Any] | None
    error: str | None = None

    @property
    def overflows(self) -> bool:
        """True when the page is wider than the window or holds an element that scrolls."""
        if self.report is None:
            return False
        return bool(self.report.get("documentOverflows")) or bool(self.report.get("elements"))


class _QuietHandler(SimpleHTTPRequestHandler):
    """Serves files without logging every request to stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def serve(directory: Path) -> Iterator[str]:
    """Serve ``directory`` over http on localhost in a thread; yield its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def screenshot_name(page: str) -> str:
    """A file name for a page's screenshot: ``bench/report/index.html`` gives ``bench-report``."""
    stem = page.removesuffix("index.html").removesuffix(".html").strip("/")
    return stem.replace("/", "-") or "index"


def instrument(copy_root: Path, page: str) -> str:
    """Write an instrumented copy of ``page`` next to it; return its path in the copy."""
    source = copy_root / page
    text = source.read_text(encoding="utf-8")
    depth = page.count("/")
    tag = f'<script src="{"../" * depth}{SCRIPT_NAME}"></script>'
    index = text.lower().rfind("</body>")
    text = text[:index] + tag + text[index:] if index >= 0 else text + tag
    instrumented = page.removesuffix(".html") + INSTRUMENTED_SUFFIX
    (copy_root / instrumented).write_text(text, encoding="utf-8")
    return instrumented


def run_chromium(chromium: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run Chromium once with the common flags and a throwaway profile directory."""
    with tempfile.TemporaryDirectory(prefix="tb-chromium-") as profile:
        command = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
        return subprocess.run(
            command, capture_output=True, text=True, timeout=CHROMIUM_TIMEOUT_S, check=False
        )


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def check_page(chromium: str, copy_root: Path, base_url: str, page: str, out: Path) -> PageResult:
    """Screenshot ``page`` and measure its overflow through an instrumented copy."""
    if not (copy_root / page).is_file():
        return PageResult(page, None, None, f"{page} is not in the site")
    shot = out / f"{screenshot_name(page)}.png"
    result = PageResult(page, None, None)
    try:
        run = run_chromium(chromium, f"--screenshot={shot}", base_url + page)
        if shot.is_file():
            result.screenshot = shot
        else:
            result.error = f"no screenshot: {_last_line(run.stderr)}"
        instrumented = instrument(copy_root, page)
        run = run_chromium(
            chromium,
            f"--virtual-time-budget={VIRTUAL_TIME_BUDGET_MS}",
            "--dump-dom",
            base_url + instrumented,
        )
    except subprocess.TimeoutExpired:
        result.error = f"chromium took over {CHROMIUM_TIMEOUT_S} s"
        return result
    match = _REPORT_RE.search(run.stdout)
    if match is None:
        result.error = f"no width report in the dumped DOM: {_last_line(run.stderr)}"
        return result
    try:
        result.report = json.loads(html.unescape(match.group(1)))
    except json.JSONDecodeError as error:
        result.error = f"width report does not parse: {error}"
    return result


# What a reader types into the search box; each must find at least one page.
SEARCH_QUERIES = ("bfloat16", "overwrite")
# The search index loads in a web worker: give it longer than a page's layout.
SEARCH_TIME_BUDGET_MS = 20000
SEARCH_ATTEMPTS = 4
_SEARCH_META_RE = re.compile(r'<div class="md-search-result__meta">\s*([^<]*)<')


def check_search(chromium: str, base_url: str, query: str) -> str | None:
    """Open the home page with ``?q=query`` (Material runs the search box on it); None if it
    lists matching documents, else what it showed instead.

    The index loads in a web worker, which headless Chromium's virtual time does not wait
    for, so a run may dump the page while it still says "Initializing search": each query
    gets ``SEARCH_ATTEMPTS`` tries, and only a search that never answers is a failure.
    """
    problem: str | None = "not tried"
    for _ in range(SEARCH_ATTEMPTS):
        problem = _search_once(chromium, base_url, query)
        if problem is None:
            return None
    return problem


def _search_once(chromium: str, base_url: str, query: str) -> str | None:
    try:
        run = run_chromium(
            chromium,
            f"--virtual-time-budget={SEARCH_TIME_BUDGET_MS}",
            "--dump-dom",
            f"{base_url}?q={query}",
        )
    except subprocess.TimeoutExpired:
        return f"chromium took over {CHROMIUM_TIMEOUT_S} s"
    match = _SEARCH_META_RE.search(run.stdout)
    meta = match.group(1).strip() if match else "(no search results panel)"
    found = re.match(r"(\d+) matching document", meta)
    if meta.startswith("1 matching document") or (found and int(found.group(1)) > 0):
        return None
    return meta


def describe(result: PageResult) -> list[str]:
    """The summary lines printed for one page."""
    if result.report is None:
        return [f"ERROR    {result.page}: {result.error}"]
    report = result.report
    counts = report.get("counts", {})
    status = "OVERFLOW" if result.overflows else "OK"
    document = f"document {report.get('scrollWidth')} px in a {report.get('innerWidth')} px window"
    checked = ", ".join(f"{counts.get(tag, 0)} {tag}" for tag in ("table", "pre", "img"))
    elements = report.get("elements", [])
    lines = [
        f"{status:<8} {result.page}: {document}; {len(elements)} of {checked} overflow; "
        f"screenshot {result.screenshot or '(none)'}"
    ]
    if report.get("documentOverflows"):
        lines.append(f"         the page scrolls sideways: {document}")
    for element in elements:
        lines.append(
            f"         {element['tag']} #{element['index']} ({element['section']}): "
            f"{element['measured']} scrollWidth {element['scrollWidth']} > clientWidth "
            f"{element['clientWidth']} (right edge {element['right']} px): {element['text']!r}"
        )
    if result.error:
        lines.append(f"         note: {result.error}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Check the named pages of the built site; 0 when none overflows, 1 otherwise."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("site_dir", type=Path, help="the directory `mkdocs build` wrote")
    parser.add_argument(
        "pages",
        nargs="*",
        default=list(DEFAULT_PAGES),
        help="pages to check, relative to the site directory (default: %(default)s)",
    )
    parser.add_argument(
        "--out", type=Path, help="where screenshots go (default: a new temporary directory)"
    )
    args = parser.parse_args(argv)

    chromium = shutil.which("chromium")
    if chromium is None:
        print("browser_check: skipped, no `chromium` on PATH (apt-get install chromium)")
        return 0
    site: Path = args.site_dir
    if not site.is_dir():
        print(f"browser_check: {site} is not a directory", file=sys.stderr)
        return 1
    out: Path = args.out or Path(tempfile.mkdtemp(prefix="tb-browser-check-"))
    out.mkdir(parents=True, exist_ok=True)

    results: list[PageResult] = []
    with tempfile.TemporaryDirectory(prefix="tb-site-copy-") as tmp:
        copy_root = Path(tmp) / "site"
        shutil.copytree(site, copy_root)
        (copy_root / SCRIPT_NAME).write_text(MEASURE_SCRIPT, encoding="utf-8")
        with serve(copy_root) as base_url:
            for page in args.pages:
                results.append(check_page(chromium, copy_root, base_url, page, out.resolve()))
            searches = {query: check_search(chromium, base_url, query) for query in SEARCH_QUERIES}

    for result in results:
        for line in describe(result):
            print(line)
    for query, problem in searches.items():
        print(
            f"{'OK' if problem is None else 'NO HITS':<8} search box: {query!r}"
            + (f": {problem}" if problem else "")
        )
    failed = [result for result in results if result.overflows or result.report is None]
    bad_search = [query for query, problem in searches.items() if problem is not None]
    print(
        f"browser_check: {len(results)} pages, {len(failed)} failing; search box: "
        f"{len(searches) - len(bad_search)} of {len(searches)} queries answered; screenshots "
        f"in {out}"
    )
    if bad_search:  # the worker's timing under headless Chromium varies: a warning, not a failure
        print(
            "browser_check: warning: the search box did not answer "
            + ", ".join(repr(q) for q in bad_search)
            + " in time; check_site.py verifies the search index itself"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
