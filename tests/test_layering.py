"""Layering: every import under ``pivot/`` follows the table of docs/design.md
("Layering"), the packages form no cycle, the core loads no engine, the product never
imports the test stand-ins of ``pivot.testing``, and test modules never import each other.

The table is read from the doc, so it has one definition. ``pivot/testing/`` is for tests
and benchmarks only; a module anywhere else under ``pivot/`` that imports it (at top level,
inside a function, or under ``TYPE_CHECKING``) would put a stand-in on a product code path.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections import defaultdict

from pivot.paths import REPO_ROOT

PIVOT = REPO_ROOT / "pivot"
TESTING = PIVOT / "testing"
DESIGN = REPO_ROOT / "docs" / "design.md"
ENGINES = ("vllm", "monarch", "torchtitan", "nixl", "nixl_cu12")
"""Top-level names of the engine libraries; ``torch.distributed`` is checked on its own."""


def imported_modules(source: str, package: str) -> list[tuple[int, str]]:
    """(line, absolute name) of every import in ``source``, a module of ``package``:
    ``from a import b`` yields both ``a`` and ``a.b``; relative imports are resolved."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + [base] if base else parts)
            out.append((node.lineno, base))
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return out


def is_testing(name: str) -> bool:
    return name == "pivot.testing" or name.startswith("pivot.testing.")


def test_no_product_module_imports_pivot_testing():
    offenders = []
    for py in sorted(PIVOT.rglob("*.py")):
        if "__pycache__" in py.parts or py.is_relative_to(TESTING):
            continue
        package = ".".join(py.parent.relative_to(REPO_ROOT).parts)
        for line, name in imported_modules(py.read_text(), package):
            if is_testing(name):
                offenders.append(f"{py.relative_to(REPO_ROOT)}:{line} imports {name}")
    assert not offenders, ("product modules import pivot.testing (tests and benchmarks "
                           "only): " + "; ".join(offenders))


def test_the_walk_sees_every_import_form():
    src = ("import pivot.testing.shifting\n"
           "from pivot import testing\n"
           "import pivot.shifting\n"
           "def f():\n"
           "    from ..testing.rl import fake_loop\n"
           "    from . import contexts\n")
    names = [n for _, n in imported_modules(src, "pivot.shifting")]
    assert [n for n in names if is_testing(n)] == [
        "pivot.testing.shifting", "pivot.testing", "pivot.testing.rl",
        "pivot.testing.rl.fake_loop"]
    assert "pivot.shifting.contexts" in names and "pivot.shifting" in names


def test_no_test_module_imports_another():
    """Shared test helpers live in conftest.py (fixtures) or pivot.testing (module-level
    values), never in a test module another one imports."""
    tests = REPO_ROOT / "tests"
    local = {py.stem for py in tests.rglob("*.py")} | {"tests"}
    offenders = []
    for py in sorted(tests.rglob("*.py")):
        if "__pycache__" in py.parts:
            continue
        package = ".".join(py.parent.relative_to(REPO_ROOT).parts)
        for line, name in imported_modules(py.read_text(), package):
            if name.split(".")[0] in local:
                offenders.append(f"{py.relative_to(REPO_ROOT)}:{line} imports {name}")
    assert not offenders, ("test modules import other test modules (use a conftest.py "
                           "fixture or pivot.testing): " + "; ".join(offenders))


# ---------------------------------------------------------------- the table of the doc
def layering_tables(text: str) -> tuple[list[list[str]], list[list[str]]]:
    """The rows (cells) of the two tables of the doc's "Layering" section: the packages'
    (header ``package``) and the exceptions' (header ``module``; none when the section
    has no such table)."""
    section = text.split("\n## Layering\n", 1)[1].split("\n## ", 1)[0]
    tables: dict[str, list[list[str]]] = {}
    rows: list[list[str]] | None = None
    for line in section.splitlines():
        if not line.startswith("|"):
            rows = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if rows is None:
            rows = tables.setdefault(cells[0], [])
        elif not set(cells[0]) <= set("-: "):
            rows.append(cells)
    return tables["package"], tables.get("module", [])


def names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


class Layering:
    """The packages' table: ``unit`` of a module, whether an import is allowed."""

    def __init__(self, rows: list[list[str]]):
        self.layer: dict[str, str] = {}
        self.allowed: dict[str, set[str]] = {}
        self.unit_of_name: dict[str, str] = {}
        self.scripts: set[str] = set()
        for cells in rows:
            units, layer, may = names(cells[0]), cells[1], cells[2]
            if all(u.endswith("/") for u in units):
                self.scripts |= {u.rstrip("/") for u in units}
                continue
            unit = units[0]
            self.layer[unit] = layer
            self.unit_of_name.update(dict.fromkeys(units, unit))
            core = re.search(r"\bcore\b", re.sub(r"`[^`]+`", "", may)) is not None
            self.allowed[unit] = set(names(may)) | ({"core"} if core else set())

    def unit(self, module: str) -> str | None:
        """The row of ``pivot.a.b.c``: the longest name of the table that is a prefix of
        ``a.b.c`` (``gps.layout`` before ``gps``); None for ``pivot`` itself or a module no
        row names."""
        parts = module.split(".")[1:]
        for k in range(len(parts), 0, -1):
            if ".".join(parts[:k]) in self.unit_of_name:
                return self.unit_of_name[".".join(parts[:k])]
        return None

    def covers(self, name: str, unit: str) -> bool:
        """Whether an entry of a "may import" cell (a package, a module or ``core``)
        names ``unit``."""
        if name == "core":
            return self.layer[unit] == "core"
        return self.unit_of_name.get(name) == unit or (
            "." not in name and unit.split(".")[0] == name)

    def allows(self, src: str, dst: str) -> bool:
        return src == dst or any(self.covers(n, dst) for n in self.allowed[src])


def package(unit: str) -> str:
    return unit.split(".")[0]


def product_modules():
    """(path, module name, its package for relative imports) of every module under
    ``pivot/``."""
    for py in sorted(PIVOT.rglob("*.py")):
        if "__pycache__" in py.parts:
            continue
        parts = py.relative_to(REPO_ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield py, name, ".".join(py.parent.relative_to(REPO_ROOT).parts)


def pivot_imports(layering: Layering):
    """(path, line, source unit, target unit, imported name) of every import of another
    unit under ``pivot/``."""
    for py, name, pkg in product_modules():
        src, seen = layering.unit(name), set()
        if src is None:   # no row: the row test names it
            continue
        for line, target in imported_modules(py.read_text(), pkg):
            dst = layering.unit(target) if target.startswith("pivot.") else None
            if dst is not None and dst != src and (line, dst) not in seen:
                seen.add((line, dst))   # ``from a import b``: a once, not a and a.b
                yield py, line, src, dst, target


LAYERING_ROWS, EXCEPTION_ROWS = layering_tables(DESIGN.read_text())
LAYERING = Layering(LAYERING_ROWS)
EXCEPTIONS = {(names(c[0])[0], names(c[1])[0]) for c in EXCEPTION_ROWS}
"""(module path, package) of the imports the doc lists as exceptions, pending a move."""


def exempt(py, dst: str) -> bool:
    return (str(py.relative_to(REPO_ROOT)), package(dst)) in EXCEPTIONS


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle ``[a, b, ..., a]`` of ``graph``, or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        path.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return path[path.index(w):] + [w]
            if w not in state and (found := visit(w)):
                return found
        state[v] = 2
        path.pop()
        return None

    for v in sorted(graph):
        if v not in state and (found := visit(v)):
            return found
    return None


def test_the_table_parser_reads_rows_modules_and_core():
    rows = ("x\n## Layering\ntext\n\n| package | layer | may import |\n|---|---|---|\n"
            "| `a` | core | |\n| `b.m`, `b.n` | core | `a` |\n| `b` | edge | core |\n"
            "| `c` | edge | core, `b` |\n| `s/` | top | anything |\n\n"
            "| module | imports | why |\n|---|---|---|\n| `pivot/a/x.py` | `c` | later |\n"
            "## Next\n| not | this | one |\n")
    pkgs, exceptions = layering_tables(rows)
    t = Layering(pkgs)
    assert (t.unit("pivot.b.n.deep"), t.unit("pivot.b.other"), t.unit("pivot")) == (
        "b.m", "b", None)
    assert t.allows("b", "b.m") and t.allows("b", "a") and not t.allows("b.m", "b")
    assert t.allows("c", "b") and t.allows("c", "b.m") and not t.allows("a", "b.m")
    assert t.scripts == {"s"} and exceptions == [["`pivot/a/x.py`", "`c`", "later"]]


def test_every_package_under_pivot_has_a_row_in_the_layering_table():
    missing = sorted({name for _, name, _ in product_modules()
                      if name != "pivot" and LAYERING.unit(name) is None})
    assert not missing, (f"modules with no row in docs/design.md \"Layering\" (add their "
                         f"package and what it may import): {missing}")
    unknown = sorted({n for allowed in LAYERING.allowed.values() for n in allowed
                      if n != "core" and n not in LAYERING.unit_of_name})
    assert not unknown, f"the table's \"may import\" cells name no row: {unknown}"
    layers = {u: layer for u, layer in LAYERING.layer.items()
              if layer not in ("core", "edge", "top")}
    assert not layers, f"layers other than core, edge and top: {layers}"


def test_every_import_under_pivot_is_an_edge_the_layering_table_allows():
    offenders, used = [], set()
    for py, line, src, dst, target in pivot_imports(LAYERING):
        if LAYERING.allows(src, dst):
            continue
        if exempt(py, dst):
            used.add((str(py.relative_to(REPO_ROOT)), package(dst)))
            continue
        offenders.append(f"{py.relative_to(REPO_ROOT)}:{line} imports {target}: "
                         f"{src} -> {dst} is not allowed")
    assert not offenders, ("imports the layering table of docs/design.md does not allow "
                           "(move the code down, or the import up): " + "; ".join(offenders))
    stale = sorted(EXCEPTIONS - used)
    assert not stale, (f"exceptions of docs/design.md \"Layering\" that no import needs "
                       f"any more; remove their rows: {stale}")


def test_no_module_under_pivot_imports_the_scripts_or_the_tests():
    tops = LAYERING.scripts | {"tests"}
    offenders = [f"{py.relative_to(REPO_ROOT)}:{line} imports {target}"
                 for py, _, pkg in product_modules()
                 for line, target in imported_modules(py.read_text(), pkg)
                 if target.split(".")[0] in tops]
    assert not offenders, "the scripts sit above pivot/: " + "; ".join(offenders)


def test_the_layering_table_allows_no_package_cycle():
    graph: dict[str, set[str]] = defaultdict(set)
    for src in LAYERING.allowed:
        for dst in LAYERING.layer:
            if package(src) != package(dst) and LAYERING.allows(src, dst):
                graph[package(src)].add(package(dst))
    cycle = find_cycle(graph)
    assert cycle is None, f"the table allows the package cycle {' -> '.join(cycle)}"


def test_no_package_imports_itself_through_others():
    """The packages' import graph (package = second component of the module name), with
    only the doc's exceptions left out, has no cycle."""
    graph: dict[str, set[str]] = defaultdict(set)
    where: dict[tuple[str, str], str] = {}
    for py, line, src, dst, target in pivot_imports(LAYERING):
        a, b = package(src), package(dst)
        if a != b and not exempt(py, dst):
            graph[a].add(b)
            where.setdefault((a, b), f"{py.relative_to(REPO_ROOT)}:{line} imports {target}")
    cycle = find_cycle(graph)
    assert cycle is None, (f"package cycle {' -> '.join(cycle)}: " + "; ".join(
        where[e] for e in zip(cycle, cycle[1:])))


def is_core(module: str) -> bool:
    unit = LAYERING.unit(module)
    return unit is not None and LAYERING.layer[unit] == "core"


def core_modules() -> list[str]:
    return [name for _, name, _ in product_modules() if is_core(name)]


def is_engine(name: str) -> bool:
    return name.split(".")[0] in ENGINES or name == "torch.distributed" or \
        name.startswith("torch.distributed.")


def test_no_core_module_imports_an_engine_by_name():
    offenders = []
    for py, name, pkg in product_modules():
        if not is_core(name):
            continue
        offenders += [f"{py.relative_to(REPO_ROOT)}:{line} imports {target}"
                      for line, target in imported_modules(py.read_text(), pkg)
                      if is_engine(target)]
    assert not offenders, "core modules import an engine: " + "; ".join(offenders)


_LOAD = """
import importlib, json, sys
import torch
before = set(sys.modules)
blame = {}
for name in sys.argv[1:]:
    importlib.import_module(name)
    for m in set(sys.modules) - before:
        blame.setdefault(m, name)
print(json.dumps(blame))
"""


def test_importing_every_core_module_loads_no_engine():
    """In a fresh interpreter (the test session's own imports do not count): after a plain
    ``import torch`` (which on torch 2.13 already loads ``torch.distributed``), importing
    every core module loads no module of vLLM, Monarch, torchtitan, NIXL, and no further
    ``torch.distributed`` module."""
    mods = core_modules()
    assert "pivot.sim.driver" in mods and "pivot.gps.layout" in mods
    out = subprocess.run([sys.executable, "-c", _LOAD, *mods], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    blame = json.loads(out.stdout.strip().splitlines()[-1])
    loaded = sorted(f"{m} (first by {by})" for m, by in blame.items() if is_engine(m))
    assert not loaded, "importing the core loads engine modules: " + "; ".join(loaded)

