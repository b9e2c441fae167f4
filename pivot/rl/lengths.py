"""Length distributions of responses and judgements over a run (the long tail, sec. 2.2).

Each step's metrics carry the lengths of the batch it trained (``rollout/response_lens``,
``reward/judge_lens``); these are their quantiles over the first and the last steps of a
run, and the tail ratio p99 / p50 that says whether a batch has long stragglers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

KEYS = {"response": "rollout/response_lens", "judgement": "reward/judge_lens"}


def quantiles(lengths: Sequence[int]) -> dict[str, float] | None:
    """p50 / p90 / p99 / max / mean of ``lengths`` and the tail ratio p99 / p50."""
    if not lengths:
        return None
    a = np.asarray(lengths, dtype=float)
    p50, p90, p99 = (float(x) for x in np.percentile(a, [50, 90, 99]))
    return {"n": int(a.size), "p50": p50, "p90": p90, "p99": p99, "max": float(a.max()),
            "mean": float(a.mean()), "p99_over_p50": p99 / p50 if p50 > 0 else None}


def length_report(steps: Sequence[dict[str, Any]], window: int = 3) -> dict[str, Any]:
    """Quantiles of each kind over the first and the last ``window`` steps (all steps when
    the run is shorter than two windows, reported as both)."""
    out: dict[str, Any] = {"window_steps": window}
    k = min(window, max(1, len(steps) // 2))
    for kind, key in KEYS.items():
        rows = [m for m in steps if key in m]
        out[kind] = {"start": quantiles([x for m in rows[:k] for x in m[key]]),
                     "end": quantiles([x for m in rows[-k:] for x in m[key]])}
    return out
