"""Plots of the local driver's measurements (results/local/<what>.json -> .png).

    python analysis/local_plots.py throughput|convergence|trace
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "results" / "local"


def throughput(d: dict) -> None:
    runs = d["runs"]
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.bar([r["deployment"] for r in runs], [r["throughput"] or 0 for r in runs])
    ax.set_ylabel("tokens / s (after step 1)")
    ax.set_title("End-to-end throughput, local CPU, 4 slots")
    fig.tight_layout()
    fig.savefig(OUT / "throughput.png", dpi=120)


def overheads(d: dict) -> None:
    keys = sorted(d["phases"])
    phases = sorted({ph for k in keys for ph in d["phases"][k] if ph != "total"})
    fig, ax = plt.subplots(figsize=(7, 3.2))
    bottom = [0.0] * len(keys)
    for ph in phases:
        vals = [d["phases"][k].get(ph, {}).get("median_s", 0.0) for k in keys]
        ax.bar(keys, vals, bottom=bottom, label=ph)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("seconds (median per shift)")
    ax.set_title("Shift overheads per phase and role (fig. 12 analogue), local CPU")
    ax.legend(fontsize=6)
    plt.setp(ax.get_xticklabels(), rotation=20, fontsize=7)
    fig.tight_layout()
    fig.savefig(OUT / "overheads.png", dpi=120)


def convergence(d: dict) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for r in d["runs"]:
        lab = f"{r['deployment']} s{r['seed']}"
        axes[0].plot(range(1, len(r["reward"]) + 1), r["reward"], label=lab)
        axes[1].plot(r["time_s"], r["reward"], label=lab)
    axes[0].set_xlabel("RL step")
    axes[1].set_xlabel("wall-clock s")
    for ax in axes:
        ax.set_ylabel("mean reward")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(OUT / "convergence.png", dpi=120)


def trace(d: dict) -> None:
    tr = d["runs"][0]["trace"]
    t = [x["time_s"] for x in tr]
    fig, ax = plt.subplots(figsize=(7, 3))
    ys = [[len(x[k]) for x in tr] for k in ("rollout", "reward", "training", "idle")]
    ax.stackplot(t, *ys, labels=["rollout", "reward", "training", "idle"], step="post")
    ax.set_xlabel("wall-clock s")
    ax.set_ylabel("device slots")
    ax.legend(loc="upper right", fontsize=7)
    ax.set_title("Allocation trace (fig. 10 analogue), local PivotRL run")
    fig.tight_layout()
    fig.savefig(OUT / "trace.png", dpi=120)


if __name__ == "__main__":
    what = sys.argv[1]
    data = json.loads((OUT / f"{what}.json").read_text())
    {"throughput": throughput, "convergence": convergence, "trace": trace,
     "overheads": overheads}[what](data)
