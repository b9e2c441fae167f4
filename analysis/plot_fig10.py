"""Draws fig. 10 (rollout, reward, overall throughput traces with allocations and shift
markers, disaggregated beside PivotRL) from results/sim/fig10.json."""

import json
import sys
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KEYS = [("rollout_tps", "rollout"), ("reward_tps", "reward"), ("overall_tps", "overall (eq. 1)")]


def main(path: str = "results/sim/fig10.json") -> None:
    data = json.loads((ROOT / path).read_text())
    runs = data["runs"]
    fig, axes = plt.subplots(3, len(runs), figsize=(6 * len(runs), 7), sharex="col",
                             squeeze=False)
    for col, run in enumerate(runs):
        t = [s["time"] for s in run["trace"]]
        for row, (k, label) in enumerate(KEYS):
            ax = axes[row][col]
            ax.plot(t, [s[k] / 1e3 for s in run["trace"]], lw=0.8)
            ax.set_ylabel(f"{label}\nK tok/s", fontsize=8)
            for s in run["train_steps"]:
                if run["deployment"] == "pivotrl":
                    ax.axvspan(s[1], s[2], color="pink", alpha=0.4, lw=0)
            for sh in run["shift_log"]:
                ax.axvline(sh["time"], color="k", lw=0.3, alpha=0.5)
        ax0 = axes[0][col]
        ax0.set_title(f"{run['deployment']} ({run['throughput'] / 1e3:.1f} K tok/s, "
                      f"{run['shifts']} shifts)", fontsize=9)
        last = None
        for s in run["trace"]:
            a = s["alloc"]
            lab = f"RO{a['rollout']} RM{a['reward']} TR{a['training']}"
            if lab != last:
                axes[2][col].annotate(lab, (s["time"], 0), fontsize=5, rotation=90,
                                      va="bottom", alpha=0.7)
                last = lab
        axes[2][col].set_xlabel("virtual time (s)")
    fig.suptitle(f"{data['group']}: throughput and allocation (sim)", fontsize=10)
    fig.tight_layout()
    fig.savefig((ROOT / path).with_suffix(".png"), dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:])
