"""Fig. 10: rollout, reward and overall (eq. 1) throughput traces with each role's
allocation and PivotRL's shifts, for every deployment, Qwen2.5-7B & Qwen3-30B-A3B (the
paper's fig. 10) or any other ``--group``.

    python experiments/fig10.py [--steps 5] [--prompts 32] [--n N] [--group G]

Every deployment uses the split fig. 9 chose at the same regime (results/sim/fig9<tag>.json
when present, else table 4). Writes results/sim/fig10<tag>.json for the paper's group,
fig10<tag>_<group>.json for another (trace files: not kept in git past 1 MB); the plot is
analysis/plot_fig10.py, the device-time split analysis/sim_utilization.py.
"""

from __future__ import annotations

import argparse
import json

from pivot.paths import REPO_ROOT as ROOT

from pivot.runners.sim_experiments import chosen_split, regime, run_many, wandb_log

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
    p.add_argument("--group", default=GROUP)
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args()
    binds, tag = regime(a.prompts, a.n)
    base = [*binds, f"SimDriver.steps = {a.steps}",
            f"SimDriver.seed = {a.seed}"]
    jobs = [(a.group, d, tuple(base + chosen_split(a.group, d, tag)), True)
            for d in DEPS]
    runs = run_many(jobs, a.workers)
    keep = ("deployment", "devices", "throughput", "step_time", "split", "shifts", "trace",
            "shift_log", "train_steps", "bindings")
    out = {"group": a.group, "settings": vars(a),
           "runs": [{k: r[k] for k in keep} for r in runs]}
    name = f"fig10{tag}" + ("" if a.group == GROUP else f"_{a.group}")
    (ROOT / f"results/sim/{name}.json").write_text(json.dumps(out))
    for r in runs:
        wandb_log(f"fig10_{r['deployment']}", {"bindings": r["bindings"]},
                  {k: r[k] for k in ("throughput", "step_time", "shifts")}, group="fig10")
        print(f"{r['deployment']}: {r['throughput']:.0f} tok/s, {r['shifts']} shifts, "
              f"{len(r['trace'])} samples")


if __name__ == "__main__":
    main()
