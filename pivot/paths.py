"""Paths inside the repository, resolved from this file (never from the working directory).

The product reads only what the repository holds: ``third_party/`` (public data with its
origin and licence), ``gin/`` (configs) and ``docs/``.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
THIRD_PARTY = REPO_ROOT / "third_party"
CALIBRATION_DIR = THIRD_PARTY / "calibration"
GIN_DIR = REPO_ROOT / "gin"
