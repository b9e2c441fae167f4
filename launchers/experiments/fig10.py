"""Fig. 10: rollout, reward and overall (eq. 1) throughput traces with each role's
allocation and PivotRL's shifts, for every deployment, Qwen2.5-7B & Qwen3-30B-A3B.

    python launchers/experiments/fig10.py [--steps 5] [--prompts 32] [--n N]

Disaggregated uses the split chosen in results/sim/fig9.json when present (else table 4).
Writes results/sim/fig10.json; the plot is analysis/plot_fig10.py.
"""

from __future__ import annotations

import argparse
import json

from pivot.paths import REPO_ROOT as ROOT

from pivot.sim.experiments import chosen_split, regime, run_many, wandb_log

GROUP = "qwen7b_30b"
DEPS = ("colocated", "disaggregated", "rr_colocated", "pivotrl")
"""Every deployment keeps its trace (analysis/sim_utilization.py splits their device-time);
the figure draws them side by side, the paper's disaggregated beside PivotRL included."""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=None, help="responses per prompt (default: gin)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    binds, tag = regime(a.prompts, a.n)
    base = [*binds, f"SimDriver.steps = {a.steps}",
            f"SimDriver.seed = {a.seed}"]
    jobs = [(GROUP, d, tuple(base + chosen_split(GROUP, d, tag)), True)
            for d in DEPS]
    runs = run_many(jobs)
    keep = ("deployment", "devices", "throughput", "step_time", "split", "shifts", "trace",
            "shift_log", "train_steps", "bindings")
    out = {"group": GROUP, "settings": vars(a), "runs": [{k: r[k] for k in keep} for r in runs]}
    (ROOT / f"results/sim/fig10{tag}.json").write_text(json.dumps(out))
    for r in runs:
        wandb_log(f"fig10_{r['deployment']}", {"bindings": r["bindings"]},
                  {k: r[k] for k in ("throughput", "step_time", "shifts")}, group="fig10")
        print(f"{r['deployment']}: {r['throughput']:.0f} tok/s, {r['shifts']} shifts, "
              f"{len(r['trace'])} samples")


if __name__ == "__main__":
    main()
