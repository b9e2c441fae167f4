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

from pivot.errors import ConfigError, StateError

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
    """Reads one checkpoint: a ``checkpoints/step_*`` folder or its ``state.pt``.

    Raises:
        ConfigError: there is no ``state.pt`` at ``path``.
        StateError: ``state.pt`` is there but does not load (truncated or corrupt, e.g. a
            disk filled or a copy cut short after the atomic rename).
    """
    p = Path(path)
    f = p / "state.pt" if p.is_dir() else p
    if not f.is_file():
        raise ConfigError(f"checkpoint {p} has no state.pt; pass a checkpoints/step_* folder")
    try:
        state = torch.load(f, weights_only=False)
    except Exception as e:  # noqa: BLE001 - torch raises RuntimeError, EOFError, pickle's...
        raise StateError(
            f"checkpoint {f} is corrupt ({type(e).__name__}: {str(e)[:200]}); resume from "
            f"the previous checkpoint (another checkpoints/step_* folder; "
            f"checkpoint.load_latest falls back to it by itself) or start the run afresh"
        ) from e
    if not isinstance(state, dict):
        raise StateError(f"checkpoint {f} holds a {type(state).__name__}, not the state "
                         f"dict checkpoint.save writes; resume from another checkpoint")
    return state


def load_latest(run_dir: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """Loads the newest checkpoint of ``run_dir`` that loads; None when there is none.

    The one ``latest`` points at is tried first, then the older ``step_*`` folders that
    ``save`` kept, newest first. Each checkpoint is a whole state, so an older one is a
    consistent (if earlier) place to resume; skipping a corrupt one is logged.

    Raises:
        StateError: checkpoints exist but none loads (the message lists each).
    """
    root = Path(run_dir) / "checkpoints"
    newest = latest(run_dir)
    older = sorted((p for p in root.glob("step_*") if (p / "state.pt").is_file()),
                   reverse=True)
    order = ([newest] if newest is not None else []) + [p for p in older if p != newest]
    errors: list[str] = []
    for path in order:
        try:
            state = load(path)
        except StateError as e:
            log.warning("skipping checkpoint %s: %s", path, e)
            errors.append(str(e))
            continue
        if errors:
            log.warning("resuming from the older checkpoint %s (%d newer one(s) corrupt)",
                        path, len(errors))
        return path, state
    if errors:
        raise StateError(f"no checkpoint in {root} loads; start the run afresh. "
                         + " | ".join(errors))
    return None
