"""Layering: the product never imports the test stand-ins of ``pivot.testing``, and test
modules never import each other.

``pivot/testing/`` is for tests and benchmarks only; a module anywhere else under
``pivot/`` that imports it (at top level, inside a function, or under ``TYPE_CHECKING``)
would put a stand-in on a product code path.
"""

from __future__ import annotations

import ast

from pivot.paths import REPO_ROOT

PIVOT = REPO_ROOT / "pivot"
TESTING = PIVOT / "testing"


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
