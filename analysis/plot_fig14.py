"""Draws fig. 14 (throughput and shifts per step against H) from results/sim/fig14.json."""

import json
import sys
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main(path: str = "results/sim/fig14.json") -> None:
    data = json.loads((ROOT / path).read_text())
    rows = data["rows"]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.bar(x, [r["throughput"] / 1e3 for r in rows], yerr=[r["std"] / 1e3 for r in rows],
           color="#69c")
    ax.set_xticks(x, [str(r["H"]) for r in rows])
    ax.set_xlabel("H (s)")
    ax.set_ylabel("K tokens/s")
    ax2 = ax.twinx()
    ax2.plot(x, [r["shifts_per_step"] for r in rows], "o-", color="#c63")
    ax2.set_ylabel("shifts per step")
    ax.set_title(f"{data['group']}: sensitivity to H (sim)", fontsize=9)
    fig.tight_layout()
    fig.savefig((ROOT / path).with_suffix(".png"), dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:])
