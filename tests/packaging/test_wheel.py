"""The wheel ships every ``pivot`` subpackage (a non-editable install must hold the engines)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pivot.paths import REPO_ROOT


def source_packages() -> set[str]:
    """Every folder under pivot/ that holds Python modules, as a dotted name."""
    out = set()
    for py in (REPO_ROOT / "pivot").rglob("*.py"):
        if "__pycache__" not in py.parts:
            out.add(".".join(py.parent.relative_to(REPO_ROOT).parts))
    return out


def test_every_module_folder_is_a_package():
    missing = sorted(p for p in source_packages()
                     if not (REPO_ROOT / p.replace(".", "/") / "__init__.py").is_file())
    assert not missing, f"folders without __init__.py (left out of a wheel): {missing}"


@pytest.mark.slow
def test_wheel_holds_every_subpackage(tmp_path: Path):
    # A copy of the sources, so the build leaves nothing in the clone; the venv's
    # setuptools (--no-build-isolation), so the test needs no download.
    src = tmp_path / "src"
    shutil.copytree(REPO_ROOT / "pivot", src / "pivot",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO_ROOT / f, src / f)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path / "dist"), str(src)], check=True,
                   capture_output=True, text=True)
    (wheel,) = (tmp_path / "dist").glob("pivot-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n.rsplit("/", 1)[0].replace("/", ".") for n in names
               if n.endswith("/__init__.py")}
    missing = sorted(source_packages() - shipped)
    assert not missing, f"{wheel.name} lacks {missing}"
    modules = {n for n in names if n.endswith(".py")}
    sources = {str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "pivot").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert sources <= modules, f"{wheel.name} lacks modules {sorted(sources - modules)}"
