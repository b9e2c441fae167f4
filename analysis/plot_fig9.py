"""Draws fig. 9 (end-to-end throughput per deployment and group, with each bar's
rollout/reward/training split) from results/sim/fig9.json."""

import json
import sys
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main(path: str = "results/sim/fig9.json") -> None:
    data = json.loads((ROOT / path).read_text())["table"]
    deps = ["colocated", "disaggregated", "rr_colocated", "pivotrl"]
    fig, axes = plt.subplots(1, len(data), figsize=(4 * len(data), 3.2), squeeze=False)
    axes = axes[0]
    for ax, (g, row) in zip(axes, data.items()):
        means = [row[d]["mean"] / 1e3 for d in deps]
        stds = [row[d]["std"] / 1e3 for d in deps]
        ax.bar(range(len(deps)), means, yerr=stds, color=["#999", "#69c", "#9c6", "#c63"])
        ax.set_xticks(range(len(deps)), [d.replace("_", "\n") for d in deps], fontsize=7)
        ax.set_title(g, fontsize=9)
        ax.set_ylabel("K tokens/s")
        for i, d in enumerate(deps):
            sp = row[d].get("split")
            if sp:
                ax.text(i, 0, "/".join(str(x) for x in sp), ha="center", va="bottom",
                        fontsize=5, rotation=90, color="white")
        for i, d in enumerate(deps[:-1]):
            ax.text(i, means[i], f"({row['speedup_over_' + d]:.2f}x)", ha="center",
                    va="bottom", fontsize=7)
    fig.tight_layout()
    fig.savefig((ROOT / path).with_suffix(".png"), dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:])
