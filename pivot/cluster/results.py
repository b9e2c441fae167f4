"""What a measurement of the cluster driver (``experiments/local.py``) records, read back by
``analysis/``: a summary (``results/local/<what>.json``) has a row per run, and each run's
whole result is in ``results/local/runs/<tag>_<label>_s<seed>/result.json``.

A row records what analysis needs: its ``label`` (``deployment``: the ``Deployment.name``,
then its split if it was given one, e.g. ``disaggregated_1_2_1``), the ``name``, the
``split``, the ``training_slots`` and ``devices``, the ``gin_files`` and ``bindings`` that
reproduce it. Summaries written before rows carried these hold only the label, then a name
of a small language (``pivotrl_rule_train2_min0``); ``legacy_row`` reads those, and only
those.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pivot.errors import ConfigError
from pivot.paths import REPO_ROOT
from pivot.spec.deployment import training_slots

OUT = REPO_ROOT / "results" / "local"
STATIC_BASELINES = ("disaggregated", "rr_colocated")
"""The baselines with a static split, whose best split ratios are taken against (app. E)."""


def load_summary(path: str | Path) -> tuple[dict, str, str]:
    """A summary (a path relative to the repository root, or absolute): its contents, its
    tag (its run folders' prefix) and the suffix of the files derived from it (``""`` for
    the main run, else ``_<tag>``)."""
    p = Path(path)
    src = json.loads((p if p.is_absolute() else REPO_ROOT / p).read_text())
    tag = src.get("tag", src["what"])
    return src, tag, "" if tag == "throughput" else f"_{tag}"


def run_result(tag: str, row: dict, out: Path = OUT) -> dict:
    """The whole result of a summary row's run (its trace and shift records too); the
    summaries keep the per-step rows only, so they stay small enough for git."""
    f = out / "runs" / f"{tag}_{row['deployment']}_s{row['seed']}" / "result.json"
    if not f.is_file():
        raise ConfigError(f"{f} is missing: run `experiments/local.py {tag}` "
                          f"here first (run folders are not kept in git)")
    return json.loads(f.read_text())


def legacy_row(label: str) -> dict:
    """The ``name`` and ``training_devices`` (``Deployment.training_devices``: -1 every
    slot, 0 the group's) that a label of a summary written before rows recorded them
    stands for. Those labels were ``colocated``, ``disaggregated[_<r>_<w>_<t>]``,
    ``disaggregated_1_2``, ``rr_colocated[_<t>]``, a strategy's name, or
    ``pivotrl[_H<s>|_min<k>|_train<k>|_rule|_home]...``."""
    parts = label.split("_")
    if label == "colocated":
        return {"name": label, "training_devices": -1}
    if label.startswith("rr_colocated"):
        tail = label.removeprefix("rr_colocated").lstrip("_")
        return {"name": "rr_colocated", "training_devices": int(tail) if tail.isdigit() else 0}
    if parts[0] == "disaggregated":
        t = int(parts[3]) if len(parts) == 4 and parts[3].isdigit() else 0
        return {"name": "disaggregated", "training_devices": t}
    if parts[0] == "pivotrl":
        train = [int(p[5:]) for p in parts[1:] if re.fullmatch(r"train\d+", p)]
        return {"name": "pivotrl", "training_devices": train[-1] if train else 0}
    return {"name": label, "training_devices": 0}


def row_name(row: dict) -> str:
    """The row's ``Deployment.name``."""
    return row["name"] if "name" in row else legacy_row(row["deployment"])["name"]


def row_training_slots(row: dict, devices: int, group_default: int) -> int:
    """Slots the row's run trained on; for a legacy row from its label, on ``devices``
    slots with the group's ``group_default`` (``ClusterGroup.training_devices``)."""
    if "training_slots" in row:
        return row["training_slots"]
    return training_slots(legacy_row(row["deployment"])["training_devices"], devices,
                          group_default)


def _bound_int(bindings: list[str], name: str) -> int | None:
    out = None
    for b in bindings:
        m = re.fullmatch(rf"\s*{re.escape(name)}\s*=\s*(\d+)\s*", b)
        if m:
            out = int(m.group(1))
    return out


def summary_devices(summary: dict) -> int:
    """The slots of a summary's runs: recorded, or (a legacy summary) its
    ``ClusterGroup.devices`` binding, else the default group's 4."""
    if "devices" in summary:
        return summary["devices"]
    return _bound_int(summary.get("gin_params") or [], "ClusterGroup.devices") or 4


def summary_training_default(summary: dict) -> int:
    """``ClusterGroup.training_devices`` of a legacy summary's runs (its binding, else the
    default 1); a summary whose rows record ``training_slots`` does not need it."""
    return _bound_int(summary.get("gin_params") or [], "ClusterGroup.training_devices") or 1
