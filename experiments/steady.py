"""How much of fig. 9's throughput is the pipeline fill: each deployment at the split fig. 9
chose, run for more steps, measured over fig. 9's window (from the end of step 0) and over a
window that leaves the fill out (from the end of step ``staleness``).

    python experiments/steady.py [--prompts 512 --n 16] [--steps 11] [--groups G ...]

Fig. 9 measures 5 steps from the end of training step 0. With staleness 2 (disaggregated,
rr-colocated, PivotRL; sec. 8.1) rollout and reward of steps 1 and 2 run while step 0 waits
for its batch, so that window credits the fill to the measured steps; colocated (staleness
0) has none. ``pivot.sim.metrics.window_throughput`` gives both windows. Writes
results/sim/steady<tag>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics

from pivot.paths import REPO_ROOT as ROOT

from pivot.runners.sim_experiments import GROUPS, chosen_split, regime, run_many
from pivot.sim.metrics import window_throughput

DEPS = ["colocated", "disaggregated", "rr_colocated", "pivotrl"]
STALENESS = {"colocated": 0, "disaggregated": 2, "rr_colocated": 2, "pivotrl": 2}
"""Deployment.staleness of gin/deployments/*.gin."""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, default=512)
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--steps", type=int, default=11)
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--groups", nargs="*", default=GROUPS)
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args()
    binds, tag = regime(a.prompts, a.n)
    jobs = [(g, d, tuple([*binds, f"SimDriver.steps = {a.steps}", f"SimDriver.seed = {s}"]
                         + chosen_split(g, d, tag)), False)
            for g in a.groups for d in DEPS for s in range(a.seeds)]
    runs = run_many(jobs, a.workers)
    table: dict = {}
    for g in a.groups:
        row = {}
        for d in DEPS:
            rs = [r for r in runs if r["group"] == g and r["deployment"] == d]
            first = STALENESS[d] + 1
            row[d] = {
                "fig9_window": statistics.mean(r["throughput"] for r in rs),
                "steady": statistics.mean(window_throughput(r["step_processed"],
                                                            r["train_steps"], first)
                                          for r in rs),
                "first_step": first,
                "step_ends": [[round(s[2]) for s in r["train_steps"]] for r in rs],
                "train_s": statistics.mean(statistics.mean(e - b for _, b, e in r["train_steps"])
                                           for r in rs)}
        for d in DEPS[:-1]:
            row[f"speedup_over_{d}"] = {k: row["pivotrl"][k] / row[d][k]
                                        for k in ("fig9_window", "steady")}
        table[g] = row
        print(g, "  ".join(f"{d}: {row[d]['fig9_window']:.0f} / {row[d]['steady']:.0f}"
                           for d in DEPS), flush=True)
    out = {"settings": vars(a), "table": table,
           "runs": [{k: r[k] for k in ("group", "deployment", "seed", "throughput",
                                       "train_steps", "step_processed", "shifts", "wall_s",
                                       "bindings")} for r in runs]}
    path = ROOT / f"results/sim/steady{tag}.json"
    if path.is_file():
        old = json.loads(path.read_text())
        if all(old["settings"].get(k) == out["settings"][k]
               for k in ("prompts", "n", "steps", "seeds")):
            out["table"] = {**old["table"], **out["table"]}
            out["runs"] = [r for r in old["runs"] if r["group"] not in a.groups] + out["runs"]
    path.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
