"""The package's layers, computed from the sources: no import cycles, imports point one way.

The graph is read with :mod:`ast`, not by importing anything: every ``import`` and
``from ... import`` of a ``tensorbridge`` module, at module level *and* inside
functions (a function-level import is still a dependency, only a later one),
relative imports resolved, imports under ``if TYPE_CHECKING:`` left out (they never
run). ``from pkg import name`` depends on ``pkg.name`` when that is a module, else on
``pkg``. Importing ``a.b.c`` also runs the ``__init__`` of each package above it, so
an import depends on those packages too, except the importer's own (already being
imported when it runs): ``dcp._hf_layout`` importing ``io.safetensors_header``
depends on ``io``, and ``io/__init__.py`` importing ``dcp._hf_layout`` would close a
cycle. Imports by a string (``importlib.import_module(name)``, the top-level
package's lazy names, the format registry's module names) are not in the graph.

The rules (the layering of ``docs/dev/design.md``, bottom up):

* no cycle, module- or function-level;
* the core (``dtypes``, ``_memory``, ``_plan``, ``convert``, ``tree``) imports
  nothing of ``io``, ``quant`` or ``diagnostics``, and reaches, through any chain of
  imports, none of ``io`` and ``diagnostics`` and of ``quant`` only the kernels
  (:data:`KERNELS`: ``to_numpy`` of a torchao ``MXTensor`` runs the mxfp8 kernel);
* the kernels reach neither ``io`` nor ``quant``'s upper modules (``api``,
  ``detect``, ``write``), nor the public converter: ``quant.base.as_torch``
  bit-casts through ``_memory``;
* ``io`` imports nothing of ``quant`` but its kernels (the GGUF reader's ggml blocks in
  ``quant.ggml``; its other reach into them is through ``_quantized``, which refuses or
  dequantizes subclasses when saving), and ``quant`` nothing of ``io``: what both use
  (the file handle type, the write pipeline, atomic writes, the key rules, confined file
  reads) is the top-level package's shared infrastructure (:data:`SHARED`), which
  imports neither;
* no module imports another package's private module (``pkg._mod`` from outside
  ``pkg``): the private modules of ``tensorbridge`` itself are the shared ones, open
  to every layer;
* ``open(..., dequantize=)`` lives above both, in ``_open``: the one module that
  imports ``quant.api``'s ``DequantizedFile`` for ``io.open``.

The same sources are held to one more rule of ``docs/dev/design.md``: no function
over :data:`MAX_FUNCTION_LINES` lines of code without the reason in its docstring
(``long because ...`` / ``long on purpose: ...``).

Run as a script (``python tests/test_layers.py``) it prints the graph's cycles.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "tensorbridge"
PACKAGE = "tensorbridge"

CORE = (
    "dtypes",
    "_memory",
    "_plan",
    "_plan_base",
    "_plan_numpy",
    "_plan_numpy_runs",
    "_plan_torch",
    "_ml_cast",
    "convert",
    "tree",
    "_tree_paths",
    "_tree_passes",
)
# quant's lower layer: the registry, the interface and the scheme modules (and the
# package, which loads its public names lazily)
KERNELS = (
    "quant",
    "quant.registry",
    "quant.base",
    "quant.codes",
    "quant.fp8_block",
    "quant.fp8_scaled",
    "quant.mx",
    "quant.nvfp4",
    "quant.gptq",
    "quant.awq",
    "quant.ct_packed",
    "quant.ggml",
)
# quant's upper layer: checkpoints (names and configs), the public API, writing
QUANT_UPPER = ("quant.api", "quant.detect", "quant.write")
# The infrastructure every layer shares, each concern under its own name at the top
# of the package (docs/dev/design.md, "The layers"): io, quant, dcp, checkpoint and the
# command line import these, never one another's private modules.
SHARED = (
    "_tensorfile",  # TensorFile, Deferred, row_of
    "_pipeline",  # computed chunks made by worker threads while the writer writes
    "_chunks",  # iter_bytes: a value's bytes a chunk at a time
    "_atomic",  # atomic_write, StagedFiles, destination errors, the fsync helpers
    "_commit",  # the atomic commit of a multi-file checkpoint
    "_locks",  # concurrent saves' claims and commit locks
    "_filemap",  # mapped and descriptor reads, unchanged-file checks
    "_files",  # confined, bounded file reads
    "_keys",  # the dotted-name rules, flatten / rebuild
    "_packed",  # packed dtypes' pseudo rows
    "packing",  # sub-byte layouts: torch's, ONNX's, GGUF's (public: the table of them)
    "_progress",  # progress_bar
    "_entry_points",  # an entry point group, read from the installed distributions
)

# Edges (importer, imported) that still break a rule, each with its reason. Empty
# means the rules hold; a new entry needs a reason and the change that removes it.
KNOWN: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` at ``line``; ``lazy`` when inside a function."""

    source: str
    target: str
    line: int
    lazy: bool


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement that can run, with whether it is inside a function."""

    def walk(node: ast.AST, lazy: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, lazy
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for other in child.orelse:
                    yield from walk(ast.Module(body=[other], type_ignores=[]), lazy)
            else:
                inner = lazy or isinstance(
                    child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
                )
                yield from walk(child, inner)

    yield from walk(tree, False)


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def edges(mods: dict[str, Path] | None = None) -> list[Edge]:
    """Every dependency between the package's modules (see the module docstring)."""
    mods = modules() if mods is None else mods
    found: list[Edge] = []
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        here = name if is_pkg else name.rpartition(".")[0]
        for node, lazy in _imports(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = here.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    where = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    where = node.module or ""
                for alias in node.names:
                    sub = f"{where}.{alias.name}"
                    targets.append(sub if sub in mods else where)
            for target in targets:
                if target.split(".")[0] != PACKAGE:
                    continue
                while target not in mods:  # ``import tensorbridge.a.b as x`` of a name
                    target = target.rpartition(".")[0]
                own = set(_ancestors(name)) | ({name} if is_pkg else set())
                for t in [*_ancestors(target), target]:
                    if t not in own and t != name:
                        found.append(Edge(name, t, node.lineno, lazy))
    return found


def graph(es: Iterable[Edge]) -> dict[str, set[str]]:
    g: dict[str, set[str]] = {}
    for e in es:
        g.setdefault(e.source, set()).add(e.target)
    return g


def cycles(g: dict[str, set[str]], limit: int = 10_000) -> list[list[str]]:
    """Elementary cycles of ``g`` (each from its smallest module), at most ``limit``."""
    found: list[list[str]] = []
    nodes = sorted(set(g) | {t for ts in g.values() for t in ts})
    for start in nodes:
        stack = [(start, iter(sorted(g.get(start, ()))))]
        path = [start]
        on_path = {start}
        while stack and len(found) < limit:
            _, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                on_path.discard(path.pop())
            elif nxt == start:
                found.append([*path, start])
            elif nxt > start and nxt not in on_path:
                stack.append((nxt, iter(sorted(g.get(nxt, ())))))
                path.append(nxt)
                on_path.add(nxt)
    return found


def reach(g: dict[str, set[str]], start: str) -> dict[str, str]:
    """Every module ``start`` loads, directly or not -> the module that imports it."""
    seen = {start: ""}
    todo = [start]
    while todo:
        node = todo.pop()
        for t in sorted(g.get(node, ())):
            if t not in seen:
                seen[t] = node
                todo.append(t)
    return seen


def chain(seen: dict[str, str], end: str) -> str:
    links = [end]
    while seen[links[-1]]:
        links.append(seen[links[-1]])
    return " -> ".join(short(m) for m in reversed(links))


def short(name: str) -> str:
    return name.removeprefix(PACKAGE + ".")


def full(name: str) -> str:
    return f"{PACKAGE}.{name}"


def under(name: str, package: str) -> bool:
    return name == full(package) or name.startswith(full(package) + ".")


ALL = edges()


def _without_known(es: Iterable[Edge]) -> list[Edge]:
    return [e for e in es if (short(e.source), short(e.target)) not in KNOWN]


def _cycle_text(found: list[list[str]]) -> str:
    return "\n".join(" -> ".join(short(m) for m in c) for c in found[:10])


def test_the_graph_sees_imports_at_both_levels() -> None:
    """The reader finds what it must: a module-level import, a function-level one, a
    package's ``__init__`` run by importing its module, and not a TYPE_CHECKING one."""
    got = {(short(e.source), short(e.target), e.lazy) for e in ALL}
    assert ("_plan_base", "dtypes", False) in got and ("_plan_base", "_memory", True) in got
    assert ("_quantized", "quant.registry", True) in got
    assert ("quant.detect", "quant.base", False) in got
    assert ("dcp._hf_layout", "io", False) in got  # io/__init__ runs before its module
    assert ("_open", "io", False) not in got  # TensorFile: only for mypy


def test_no_import_cycle_at_module_level() -> None:
    found = cycles(graph(e for e in _without_known(ALL) if not e.lazy))
    assert not found, "import cycles (module level):\n" + _cycle_text(found)


def test_no_import_cycle_counting_function_level_imports() -> None:
    found = cycles(graph(_without_known(ALL)))
    assert not found, "import cycles (function-level imports included):\n" + _cycle_text(found)


@pytest.mark.parametrize("core", CORE)
def test_the_core_imports_no_io_quant_or_diagnostics(core: str) -> None:
    direct = {short(e.target) for e in ALL if e.source == full(core)}
    assert not [m for m in direct if m.split(".")[0] in ("io", "quant", "diagnostics")]


@pytest.mark.parametrize("core", CORE)
def test_the_core_reaches_only_quant_kernels(core: str) -> None:
    seen = reach(graph(_without_known(ALL)), full(core))
    bad = [
        m
        for m in seen
        if under(m, "io")
        or under(m, "diagnostics")
        or (under(m, "quant") and short(m) not in KERNELS)
    ]
    assert not bad, "; ".join(chain(seen, m) for m in bad[:3])


@pytest.mark.parametrize("kernel", KERNELS)
def test_scheme_kernels_reach_neither_io_nor_the_api(kernel: str) -> None:
    seen = reach(graph(_without_known(ALL)), full(kernel))
    bad = [
        m
        for m in seen
        if under(m, "io")
        or short(m) in (*QUANT_UPPER, "convert", "_open")
        or under(m, "diagnostics")
    ]
    assert not bad, "; ".join(chain(seen, m) for m in bad[:3])


def test_as_torch_bit_casts_through_memory_not_the_converter() -> None:
    g = graph(ALL)
    assert full("_memory") in g[full("quant.base")]
    assert full("convert") not in reach(g, full("quant.base"))


def test_io_and_quant_do_not_import_each_other() -> None:
    """io imports nothing of quant but its kernels, quant nothing of io: both use the
    shared infrastructure."""
    wrong = []
    for e in _without_known(ALL):
        if under(e.source, "io") and under(e.target, "quant") and short(e.target) not in KERNELS:
            wrong.append(e)
        if under(e.source, "quant") and under(e.target, "io"):
            wrong.append(e)
    text = [f"{short(e.source)}:{e.line} imports {short(e.target)}" for e in wrong]
    assert not wrong, "; ".join(text)


def private_package_imports(es: Iterable[Edge]) -> list[Edge]:
    """Imports of a package's private module (``pkg._mod``) from outside ``pkg``.

    The top-level package's own private modules (``tensorbridge._x``) are the shared
    infrastructure, open to every module, and are not counted.
    """
    wrong = []
    for e in es:
        package, _, last = short(e.target).rpartition(".")
        if package and last.startswith("_") and not under(e.source, package):
            wrong.append(e)
    return wrong


def test_no_module_imports_another_packages_private_module() -> None:
    """The command line asks ``tensorbridge.io`` for detection and the registry, quant
    takes the file handle from ``tensorbridge._tensorfile``: never ``io._detect`` or
    ``io._common``."""
    wrong = private_package_imports(ALL)
    text = sorted({f"{short(e.source)}:{e.line} imports {short(e.target)}" for e in wrong})
    assert not wrong, "; ".join(text)


def test_the_private_import_check_sees_a_cross_package_import() -> None:
    """The check finds what it must: ``quant.api`` importing ``io._common`` is one; ``io``
    or ``io.npz`` importing ``io._common`` and ``quant.api`` importing ``_tensorfile`` are
    not."""
    edge = Edge(full("quant.api"), full("io._common"), 1, False)
    own = Edge(full("io"), full("io._common"), 1, False)
    inside = Edge(full("io.npz"), full("io._common"), 1, False)
    shared = Edge(full("quant.api"), full("_tensorfile"), 1, False)
    assert private_package_imports([edge, own, inside, shared]) == [edge]


@pytest.mark.parametrize("module", SHARED)
def test_the_shared_infrastructure_reaches_no_format_or_command(module: str) -> None:
    """Each SHARED module is at the top of the package and loads nothing of io, dcp,
    diagnostics or the command line, and of quant only the kernels (like the core,
    whose plans it uses): every layer can import it."""
    assert full(module) in modules()
    seen = reach(graph(ALL), full(module))
    layers = ("io", "dcp", "diagnostics", "cli")
    bad = [
        t
        for t in seen
        if any(under(t, p) for p in layers) or (under(t, "quant") and short(t) not in KERNELS)
    ]
    assert not bad, "; ".join(chain(seen, t) for t in bad[:3])


def test_the_dequantizing_open_lives_above_io_and_quant() -> None:
    """``_open`` is the only module of io's reach that imports quant's upper layer, and
    io imports it only inside ``open``."""
    importers = {short(e.source) for e in ALL if short(e.target) == "_open"}
    assert importers == {"io"}
    assert all(e.lazy for e in ALL if short(e.target) == "_open")
    into_upper = {
        short(e.source)
        for e in ALL
        if short(e.target) in QUANT_UPPER and not under(e.source, "quant")
    }
    assert not into_upper & {"io", *(short(m) for m in modules() if under(m, "io"))}
    assert "_open" in into_upper


def test_loading_the_kernels_loads_no_file_format() -> None:
    """What the graph says, at run time: the modules ``to_numpy`` of a torchao subclass
    loads to dequantize it (``_quantized`` and the scheme registry) load nothing of io."""
    code = (
        "import sys, tensorbridge._quantized, tensorbridge.quant.registry\n"
        "print(sorted(m for m in sys.modules if m.startswith(('tensorbridge.io', "
        "'tensorbridge.diagnostics', 'tensorbridge.quant.api', 'tensorbridge.quant.detect'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"


def test_known_edges_are_still_there() -> None:
    """An entry of KNOWN that no longer exists is removed from the list, not kept."""
    present = {(short(e.source), short(e.target)) for e in ALL}
    assert not [k for k in KNOWN if k not in present]


# --- long functions ----------------------------------------------------------------------------

# A function's length is its code: the lines from the first statement after its docstring
# to its end (comments, blank lines and nested functions included). The docstring is not
# counted: a public function carries Args / Raises and a doctest, and documentation that
# grows is no reason to split code. Over the limit, the docstring says why the function
# reads best whole (one decision table, one opcode loop): ``long because`` or ``long on
# purpose``, then the reason.
MAX_FUNCTION_LINES = 80
LONG_REASON = re.compile(r"\blong\s+(?:because|on\s+purpose)\b", re.IGNORECASE)
# Functions still over the limit without a reason, each with the change that removes it.
# Empty means the rule holds.
KNOWN_LONG: dict[str, str] = {}


@dataclass(frozen=True)
class Function:
    """A function of the sources: ``module:Qual.name``, its code lines, its docstring."""

    name: str
    lines: int
    doc: str | None

    @property
    def explained(self) -> bool:
        return self.doc is not None and LONG_REASON.search(self.doc) is not None


def functions_of(tree: ast.AST, module: str) -> list[Function]:
    """Every function and method of ``tree`` (nested ones too), measured as above."""
    found: list[Function] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(child)
                body = child.body[1:] if doc is not None else child.body
                end = child.end_lineno or child.lineno
                lines = end - body[0].lineno + 1 if body else 0
                name = f"{prefix}{child.name}"
                found.append(Function(f"{module}:{name}", lines, doc))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def long_functions(mods: dict[str, Path] | None = None) -> list[Function]:
    """The functions of the sources over :data:`MAX_FUNCTION_LINES` with no reason given."""
    mods = modules() if mods is None else mods
    return [
        fn
        for name, path in mods.items()
        for fn in functions_of(ast.parse(path.read_text(), str(path)), short(name))
        if fn.lines > MAX_FUNCTION_LINES and not fn.explained
    ]


def test_no_function_is_long_without_a_reason() -> None:
    """Split a long function along its concerns, or say in its docstring why it reads
    best whole (``long because ...``)."""
    found = [fn for fn in long_functions() if fn.name not in KNOWN_LONG]
    text = [f"{fn.name} ({fn.lines} lines)" for fn in found]
    assert not found, "functions over 80 lines with no reason in the docstring: " + "; ".join(text)


def test_the_length_check_counts_code_not_docstrings() -> None:
    """The measure finds what it must: 81 lines of code without a reason is long, with
    one it is not, and a long docstring over short code is not."""
    body = "".join(f"    x{i} = {i}\n" for i in range(81))
    source = (
        f'def bare():\n    """Adds."""\n{body}\n'
        f'def said():\n    """Adds: long because it is one table.\n\n    Read it down."""\n{body}\n'
        'def documented():\n    """' + "Adds.\n" * 100 + '    """\n    return 1\n\n'
        "class Box:\n    def method(self):\n" + body.replace("    ", "        ")
    )
    got = {fn.name: fn for fn in functions_of(ast.parse(source), "m")}
    assert [got[n].lines for n in ("m:bare", "m:said", "m:documented", "m:Box.method")] == [
        81,
        81,
        1,
        81,
    ]
    long = [fn.name for fn in got.values() if fn.lines > MAX_FUNCTION_LINES and not fn.explained]
    assert long == ["m:bare", "m:Box.method"]


def test_known_long_functions_are_still_long() -> None:
    """An entry of KNOWN_LONG that is no longer long is removed from the list, not kept."""
    still = {fn.name for fn in long_functions()}
    assert not [k for k in KNOWN_LONG if k not in still]


if __name__ == "__main__":  # pragma: no cover - a developer's view of the graph
    g_all, g_top = graph(ALL), graph(e for e in ALL if not e.lazy)
    for label, g in (("module level", g_top), ("function level included", g_all)):
        found = cycles(g)
        print(f"{label}: {len(found)} cycles")
        for c in found[: int(sys.argv[1]) if len(sys.argv) > 1 else 20]:
            print("   ", " -> ".join(short(m) for m in c))
