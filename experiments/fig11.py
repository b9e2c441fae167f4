"""Fig. 11: shift-strategy ablation (disaggregated, static, rule-based, PivotRL) and
component ablation (vanilla, + throughput model, + migration = full) for
Qwen2.5-1.5B & GLM-Z1-9B and Qwen2.5-7B & Qwen3-30B-A3B; throughput relative to
disaggregated.

    python experiments/fig11.py [--seeds 3] [--steps 5] [--prompts 32] [--n N]

The static and rule-based strategies start from the disaggregated split, the components
from PivotRL's (chosen in results/sim/fig9<tag>.json of the same regime when present, else
table 4). Runs fig. 9 already made (disaggregated, PivotRL = full, same bindings and seeds)
are taken from its file rather than run again. Writes results/sim/fig11.json
(``--prompts 512 --n 16``: fig11_p512n16.json); the plot is analysis/plot_fig11.py.
"""

from __future__ import annotations

import argparse
import json
import statistics

from pivot.paths import REPO_ROOT as ROOT

from pivot.runners.sim_experiments import chosen_split, fig9_runs, regime, run_or_reuse, wandb_log

GROUPS = ["qwen1.5b_glm9b", "qwen7b_30b"]
STRATEGIES = ["disaggregated", "static", "rule_based", "pivotrl"]
COMPONENTS = ["vanilla", "throughput_model", "full"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=None, help="responses per prompt (default: gin)")
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args()
    binds, tag = regime(a.prompts, a.n)
    deps = STRATEGIES + COMPONENTS
    jobs = []
    for g in GROUPS:
        for d in deps:
            src = "disaggregated" if d in ("static", "rule_based") else (
                "pivotrl" if d in COMPONENTS else d)
            for s in range(a.seeds):
                jobs.append((g, d, tuple([*binds,
                                          f"SimDriver.steps = {a.steps}", f"SimDriver.seed = {s}"]
                                         + chosen_split(g, src, tag)), False))
    runs = run_or_reuse(jobs, fig9_runs(tag), a.workers)
    table = {}
    for g in GROUPS:
        row = {}
        for d in deps:
            xs = [r["throughput"] for r in runs if r["group"] == g and r["deployment"] == d]
            sh = [r["shifts_per_step"] for r in runs
                  if r["group"] == g and r["deployment"] == d]
            row[d] = {"mean": statistics.mean(xs), "std": statistics.pstdev(xs),
                      "shifts_per_step": statistics.mean(sh)}
        base = row["disaggregated"]["mean"]
        for d in deps:
            row[d]["over_disaggregated"] = row[d]["mean"] / base
        row["reused_runs"] = sum(bool(r.get("reused")) for r in runs if r["group"] == g)
        table[g] = row
        print(g, "  ".join(f"{d}={row[d]['over_disaggregated']:.2f}x" for d in deps), flush=True)
    (ROOT / f"results/sim/fig11{tag}.json").write_text(json.dumps(
        {"settings": vars(a), "table": table}, indent=1))
    for g, row in table.items():
        wandb_log(f"fig11_{g}", {"group": g},
                  {f"{d}/over_disaggregated": row[d]["over_disaggregated"] for d in deps},
                  group="fig11")


if __name__ == "__main__":
    main()
