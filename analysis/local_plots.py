"""Plots of the cluster driver's measurements (results/local/<what>.json -> .png).

    python analysis/local_plots.py throughput|convergence|trace|overheads|sensitivity
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "results" / "local"


def throughput(d: dict, name: str = "throughput") -> None:
    """Bars of each deployment's mean, a dot per seed -> results/local/<name>.png."""
    runs = d["runs"]
    names = list(dict.fromkeys(r["deployment"] for r in runs))
    mean = d.get("throughput_mean", {})
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(names)), 3.4))
    ax.bar(names, [mean.get(n) or 0 for n in names], color="#9ecae1")
    for i, n in enumerate(names):   # each seed as a dot
        ys = [r["throughput"] or 0 for r in runs if r["deployment"] == n]
        ax.plot([i] * len(ys), ys, "k.", ms=5)
    ax.tick_params(axis="x", labelsize=7, labelrotation=30)
    for label in ax.get_xticklabels():
        label.set_horizontalalignment("right")
    ax.set_ylabel("tokens / s (after step 1)")
    ax.set_title("End-to-end throughput, local CPU, 4 slots")
    fig.tight_layout()
    fig.savefig(OUT / f"{name}.png", dpi=120)


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


def convergence_summary(d: dict, base: str = "colocated", tail: int = 10) -> dict:
    """Fig. 15's criterion: is each deployment's reward-against-steps curve (mean over
    seeds) inside the spread (min..max over seeds) of ``base``'s? Per deployment: the
    share of steps inside it, the mean reward of the last ``tail`` steps (mean and spread
    over seeds) and the last validation accuracy@1 of each seed."""
    by: dict[str, list[dict]] = {}
    for r in d["runs"]:
        by.setdefault(r["deployment"], []).append(r)
    ref = by.get(base, [])
    n = min((len(r["reward"]) for rs in by.values() for r in rs), default=0)
    lo = [min(r["reward"][i] for r in ref) for i in range(n)] if ref else []
    hi = [max(r["reward"][i] for r in ref) for i in range(n)] if ref else []
    out = {"base": base, "steps": n, "tail": tail, "deployments": {}}
    for dep, rs in sorted(by.items()):
        mean = [sum(r["reward"][i] for r in rs) / len(rs) for i in range(n)]
        inside = sum(lo[i] <= mean[i] <= hi[i] for i in range(n)) if ref else None
        tails = [sum(r["reward"][n - tail:n]) / tail for r in rs] if n >= tail else []
        out["deployments"][dep] = {
            "seeds": [r["seed"] for r in rs],
            "steps_inside_base_spread": inside,
            "share_inside_base_spread": inside / n if ref and n else None,
            "tail_reward_mean": sum(tails) / len(tails) if tails else None,
            "tail_reward_spread": [min(tails), max(tails)] if tails else None,
            "final_val_accuracy_at_1": [next((v for v in reversed(r["val_acc"])
                                              if v is not None), None) for r in rs],
            "wall_s": [r["wall_s"] for r in rs]}
    return out


def convergence(d: dict) -> None:
    fig, axes = plt.subplots(2, 2, figsize=(9, 6))
    for r in d["runs"]:
        lab = f"{r['deployment']} s{r['seed']}"
        steps = range(1, len(r["reward"]) + 1)
        axes[0, 0].plot(steps, r["reward"], label=lab)
        axes[0, 1].plot(r["time_s"], r["reward"], label=lab)
        val = [(i + 1, t, v) for i, (t, v) in enumerate(zip(r["time_s"], r["val_acc"]))
               if v is not None]
        if val:
            axes[1, 0].plot([x[0] for x in val], [x[2] for x in val], "o-", label=lab)
            axes[1, 1].plot([x[1] for x in val], [x[2] for x in val], "o-", label=lab)
    for ax in axes[:, 0]:
        ax.set_xlabel("RL step")
    for ax in axes[:, 1]:
        ax.set_xlabel("wall-clock s")
    for ax in axes[0]:
        ax.set_ylabel("mean reward (verifiable + GenRM)")
    for ax in axes[1]:
        ax.set_ylabel("validation accuracy@1")
    axes[0, 0].legend(fontsize=6)
    fig.suptitle("Convergence on the local CPU (fig. 15 analogue)")
    fig.tight_layout()
    fig.savefig(OUT / "convergence.png", dpi=120)
    summary = convergence_summary(d)
    (OUT / "convergence_summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


def trace(d: dict, name: str = "trace") -> None:
    tr = d["runs"][0]["trace"]
    t = [x["time_s"] for x in tr]
    fig, ax = plt.subplots(figsize=(7, 3))
    ys = [[len(x[k]) for x in tr] for k in ("rollout", "reward", "training", "idle")]
    ax.stackplot(t, *ys, labels=["rollout", "reward", "training", "idle"], step="post")
    ax.set_xlabel("wall-clock s")
    ax.set_ylabel("device slots")
    ax.legend(loc="upper right", fontsize=7)
    run = d["runs"][0]
    ax.set_title(f"Allocation trace (fig. 10 analogue), local {run['deployment']} run, "
                 f"seed {run['seed']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(OUT / f"{name}.png", dpi=120)


def sensitivity(d: dict) -> None:
    per = d["per_H"]
    hs = sorted((k for k in per if k.startswith("pivotrl_H")),
                key=lambda k: float(k.removeprefix("pivotrl_H")))
    x = [float(h.removeprefix("pivotrl_H")) for h in hs]
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot(x, [per[h]["throughput_mean"] for h in hs], "o-", label="tokens / s")
    ax.set_xscale("log")
    ax.set_xlabel("H (s)")
    ax.set_ylabel("tokens / s")
    ax2 = ax.twinx()
    ax2.plot(x, [per[h]["shifts_per_step_mean"] for h in hs], "s--", color="C1",
             label="shifts / step")
    ax2.set_ylabel("shifts per step")
    ax.set_title("PivotRL's sensitivity to H, local CPU, 4 slots", fontsize=9)
    fig.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.savefig(OUT / "sensitivity.png", dpi=120)


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "trace" and len(sys.argv) > 2:   # a named trace: <name>.json -> <name>.png
        trace(json.loads((OUT / f"{sys.argv[2]}.json").read_text()), sys.argv[2])
        sys.exit(0)
    data = json.loads((OUT / f"{what}.json").read_text())
    if what.startswith("throughput_"):   # a named throughput run: <name>.png
        throughput(data, what)
        sys.exit(0)
    {"throughput": throughput, "convergence": convergence, "trace": trace,
     "overheads": overheads, "sensitivity": sensitivity}[what](data)
