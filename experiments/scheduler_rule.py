"""PivotRL with the planner's what-if under the real scheduler's dispatch rule
(``PivotPlanner.scheduler_rule``: the engines' batch cap and KV reserve) against the paper's
what-if, on the simulator, at each group's fig. 9 PivotRL split; ratios per seed.

    python experiments/scheduler_rule.py [--groups G ...] [--seeds 3]
                                                   [--prompts 512] [--n 16] [--workers 1]

The paper's-rule runs are fig. 9's own (results/sim/fig9<tag>.json) where the regime and
bindings match, else run here. Writes results/sim/scheduler_rule<tag>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics

from pivot.paths import REPO_ROOT as ROOT
from pivot.runners.sim_experiments import chosen_split, fig9_runs, regime, run_or_reuse

GROUPS = ["qwen1.5b_glm9b", "qwen7b_30b", "qwen32b_30b", "qwen72b_122b"]
RULE = "PivotPlanner.scheduler_rule = True"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", nargs="+", default=GROUPS)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--prompts", type=int, default=512)
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--workers", type=int, default=1)
    a = p.parse_args()
    binds, tag = regime(a.prompts, a.n)
    jobs = []
    for g in a.groups:
        for s in range(a.seeds):
            base = [*binds, f"SimDriver.steps = {a.steps}", f"SimDriver.seed = {s}",
                    *chosen_split(g, "pivotrl", tag)]
            jobs += [(g, "pivotrl", tuple(base), False),
                     (g, "pivotrl", tuple([*base, RULE]), False)]
    runs = run_or_reuse(jobs, fig9_runs(tag), a.workers)
    table = {}
    for g in a.groups:
        mine = [r for r in runs if r["group"] == g]
        paper = [r for r in mine if RULE not in r["bindings"]]
        rule = [r for r in mine if RULE in r["bindings"]]
        ratios = [b["throughput"] / a_["throughput"] for a_, b in zip(paper, rule)]
        table[g] = {
            "paper_rule": statistics.mean(r["throughput"] for r in paper),
            "scheduler_rule": statistics.mean(r["throughput"] for r in rule),
            "ratio_per_seed": ratios, "ratio": statistics.mean(ratios),
            "shifts_per_step": [statistics.mean(r["shifts_per_step"] for r in x)
                                for x in (paper, rule)],
            "wall_s": [sum(r.get("wall_s", 0.0) for r in x) for x in (paper, rule)],
        }
        print(f"{g}: scheduler rule / paper's what-if = {table[g]['ratio']:.3f} "
              f"(per seed {', '.join(f'{x:.3f}' for x in ratios)}); shifts a step "
              f"{table[g]['shifts_per_step'][0]:.1f} -> {table[g]['shifts_per_step'][1]:.1f}",
              flush=True)
    out = ROOT / f"results/sim/scheduler_rule{tag}.json"
    out.write_text(json.dumps({"settings": vars(a), "table": table}, indent=1))
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
