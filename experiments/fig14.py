"""Fig. 14: PivotRL's throughput and shifts per step against the horizon H (sec. 7.3),
Qwen2.5-7B & Qwen3-30B-A3B.

    python experiments/fig14.py [--seeds 3] [--steps 5] [--prompts 32] [--n N]

PivotRL starts from the split fig. 9 chose at the same regime (results/sim/fig9<tag>.json,
else table 4); H = 60 is the gin default (gin/deployments/pivotrl.gin), so those runs are
fig. 9's PivotRL runs and are taken from its file. Writes results/sim/fig14.json (``--prompts
512 --n 16``: fig14_p512n16.json); the plot is analysis/plot_fig14.py.
"""

from __future__ import annotations

import argparse
import json
import statistics

from pivot.paths import REPO_ROOT as ROOT

from pivot.runners.sim_experiments import chosen_split, fig9_runs, regime, run_or_reuse, wandb_log

GROUP = "qwen7b_30b"
HS = [0.01, 5, 30, 60, 90, 120, 600]
DEFAULT_H = 60.0
"""PivotPlanner.H in gin/deployments/pivotrl.gin (sec. 7.3's default)."""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=None, help="responses per prompt (default: gin)")
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args()
    binds, tag = regime(a.prompts, a.n)
    jobs = [(GROUP, "pivotrl", tuple([*binds,
                                      f"SimDriver.steps = {a.steps}", f"SimDriver.seed = {s}"]
                                     + ([] if h == DEFAULT_H else [f"PivotPlanner.H = {float(h)}"])
                                     + chosen_split(GROUP, "pivotrl", tag)), False)
            for h in HS for s in range(a.seeds)]
    runs = run_or_reuse(jobs, fig9_runs(tag), a.workers)
    rows = []
    for i, h in enumerate(HS):
        rs = runs[i * a.seeds:(i + 1) * a.seeds]
        rows.append({"H": h, "throughput": statistics.mean(r["throughput"] for r in rs),
                     "std": statistics.pstdev(r["throughput"] for r in rs),
                     "shifts_per_step": statistics.mean(r["shifts_per_step"] for r in rs),
                     "runs": [r["throughput"] for r in rs],
                     "reused": sum(bool(r.get("reused")) for r in rs)})
        print(f"H={h:<6} {rows[-1]['throughput']:8.0f} tok/s  "
              f"{rows[-1]['shifts_per_step']:.1f} shifts/step", flush=True)
        wandb_log(f"fig14_H{h}", {"H": h}, rows[-1], group="fig14")
    (ROOT / f"results/sim/fig14{tag}.json").write_text(json.dumps(
        {"group": GROUP, "settings": vars(a), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
