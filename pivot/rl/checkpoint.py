"""Checkpoints in the run folder: policy, optimizer state, data position, policy version,
the replay buffer of finished-but-untrained trajectories and the allocation.

``<run>/checkpoints/step_<k>/state.pt`` (torch.save of one dict) plus ``latest`` naming
the newest; written to a temporary folder and renamed, so a stop mid-write never leaves a
half checkpoint that ``latest`` points at.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from pivot.errors import ConfigError

log = logging.getLogger(__name__)


def save(run_dir: str | Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Writes ``state`` as the checkpoint after ``step`` trained steps; keeps the newest
    ``keep``."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(state, tmp / "state.pt")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    (root / "latest.tmp").write_text(final.name)
    os.replace(root / "latest.tmp", root / "latest")
    old = sorted(p for p in root.glob("step_*") if p.is_dir())[:-keep] if keep > 0 else []
    for p in old:
        shutil.rmtree(p, ignore_errors=True)
    return final


def latest(run_dir: str | Path) -> Path | None:
    root = Path(run_dir) / "checkpoints"
    name = root / "latest"
    if not name.is_file():
        return None
    path = root / name.read_text().strip()
    return path if (path / "state.pt").is_file() else None


def load(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    f = p / "state.pt" if p.is_dir() else p
    if not f.is_file():
        raise ConfigError(f"checkpoint {p} has no state.pt; pass a checkpoints/step_* folder")
    return torch.load(f, weights_only=False)
