"""Draws fig. 11 (shift-strategy and component ablations, throughput over
disaggregated) from results/sim/fig11.json."""

import json
import sys
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PANELS = [("strategies", ["disaggregated", "static", "rule_based", "pivotrl"]),
          ("components", ["disaggregated", "vanilla", "throughput_model", "full"])]


def main(path: str = "results/sim/fig11.json") -> None:
    table = json.loads((ROOT / path).read_text())["table"]
    fig, axes = plt.subplots(2, len(table), figsize=(4.5 * len(table), 5.5), squeeze=False)
    for col, (g, row) in enumerate(table.items()):
        for r, (name, deps) in enumerate(PANELS):
            ax = axes[r][col]
            vals = [row[d]["over_disaggregated"] for d in deps]
            ax.bar(range(len(deps)), vals, color=["#999", "#69c", "#9c6", "#c63"])
            ax.set_xticks(range(len(deps)), [d.replace("_", "\n") for d in deps], fontsize=7)
            for i, v in enumerate(vals):
                ax.text(i, v, f"{v:.2f}x", ha="center", va="bottom", fontsize=7)
            ax.set_ylabel("throughput / disaggregated", fontsize=8)
            ax.set_title(f"{g}: {name}", fontsize=9)
    fig.tight_layout()
    fig.savefig((ROOT / path).with_suffix(".png"), dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:])
