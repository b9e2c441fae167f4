"""A clone stands on its own: no absolute paths, no folders beside it, docs it points to exist."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pivot.paths import REPO_ROOT

PRODUCT = ("pivot", "gin", "launchers", "tests", "analysis", "sweeps")
ABSOLUTE = re.compile(r"^/(?!(proc|sys|dev)(/|$))([\w.-]+/[\w.{}-]+|(work|home|root|tmp|opt|mnt|"
                      r"data|scratch|Users|usr|var|srv)(/|$))")
"""An absolute path to a machine's folder; the kernel's interfaces (/proc, /sys, /dev) are
allowed. Fragments of f-strings are not paths on their own and are skipped."""
OUTSIDE = re.compile(r"\.\./shared|/work/|/home/|/root/|/Users/|(?<![\w/])(DESIGN|STACK)\.md")


def product_files(*suffixes: str) -> list[Path]:
    out = []
    for top in PRODUCT:
        for p in (REPO_ROOT / top).rglob("*"):
            if p.is_file() and p.suffix in suffixes and "__pycache__" not in p.parts:
                out.append(p)
    return out


def test_no_absolute_path_in_python():
    bad = []
    for py in product_files(".py"):
        tree = ast.parse(py.read_text(), str(py))
        fragments = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr)
                     for v in n.values}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and id(node) not in fragments and ABSOLUTE.match(node.value):
                bad.append(f"{py.relative_to(REPO_ROOT)}:{node.lineno}: {node.value!r}")
    assert not bad, "absolute paths in the product:\n" + "\n".join(bad)


def test_nothing_points_outside_the_repository():
    bad = []
    for f in product_files(".py", ".gin", ".yaml", ".sh", ".toml", ".md"):
        if f == Path(__file__):
            continue
        for i, line in enumerate(f.read_text().splitlines(), 1):
            if OUTSIDE.search(line):
                bad.append(f"{f.relative_to(REPO_ROOT)}:{i}: {line.strip()}")
    assert not bad, "references to files outside the repository:\n" + "\n".join(bad)


def test_docs_the_code_points_to_exist():
    ref = re.compile(r"(?<![\w/.])((?:docs|third_party)/[\w./*-]*\w)")
    missing = set()
    pages = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
    for f in product_files(".py", ".gin") + pages:
        for m in ref.finditer(f.read_text()):
            if not list(REPO_ROOT.glob(m.group(1))):
                missing.add(f"{f.relative_to(REPO_ROOT)}: {m.group(1)}")
    assert not missing, "\n".join(sorted(missing))


def test_third_party_files_have_origin_and_licence():
    index = (REPO_ROOT / "third_party" / "README.md").read_text()
    for p in (REPO_ROOT / "third_party").rglob("*"):
        if p.is_file() and p != REPO_ROOT / "third_party" / "README.md":
            assert f"`{p.relative_to(REPO_ROOT / 'third_party')}`" in index, \
                f"third_party/README.md does not list {p.name} with its origin and licence"


def clone_files() -> list[str]:
    """What a clone holds: tracked files and untracked ones git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO_ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [f for f in out.splitlines() if (REPO_ROOT / f).is_file()]


@pytest.mark.slow
def test_sim_model_group_runs_from_a_lone_clone(tmp_path: Path):
    clone = tmp_path / "clone"
    for f in clone_files():
        (clone / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / f, clone / f)
    env = dict(os.environ, PYTHONPATH=str(clone), WANDB_MODE="disabled")
    which = subprocess.run([sys.executable, "-c", "import pivot; print(pivot.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert which.stdout.startswith(str(clone)), which.stdout  # the clone's code, not ours
    r = subprocess.run([sys.executable, "launchers/run.py", "--gin", "gin/qwen7b_30b.gin",
                        "--gin_param", "SimDriver.steps = 2", "--no_progress"],
                       cwd=clone, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert list((clone / "runs").glob("*/result.json")), "the run wrote no result.json"
