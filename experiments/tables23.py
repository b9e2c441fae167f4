"""Tables 2 and 3: planner time split (pre-processing, construction, simulation, from
``planner.last_timings``) and per-sequence migration time (abort, dispatch, re-prefill,
from the executor's ``MigrationStats``) of simulated PivotRL runs at 16-128 devices, and
with ``--large`` at 256-1024 devices.

    python experiments/tables23.py [--large] [--steps 3]

Load scales with the cluster (prompts per step = devices / 2); training devices keep the
group's table-4 fraction. Planner times are this machine's wall-clock seconds of the real
planner; migration seconds are the simulator's modelled costs (abort / dispatch actions
cost ``SimCluster.abort_action_s`` / ``dispatch_action_s`` each, an assumption; re-prefill
is the prefill model). Writes results/sim/tables23[_large].json.
"""

from __future__ import annotations

import argparse
import json

from pivot.paths import REPO_ROOT as ROOT

from pivot.runners.sim_experiments import run_many, wandb_log

GROUPS = {"qwen1.5b_glm9b": 0.5, "qwen7b_30b": 0.25}
"""Group -> training fraction of the cluster (table 4: 16 of 32, 8 of 32)."""


def row(r: dict) -> dict:
    pl, m = r["planner"], r["migration"]
    split = pl["split_mean_s"]
    return {"group": r["group"], "devices": r["devices"], "planner_calls": pl["calls"],
            **{f"planner_{k}_s": v for k, v in split.items()},
            "planner_total_s": sum(split.values()), "planner_max_wall_s": pl["max_wall_s"],
            "planner_median_wall_s": pl["median_wall_s"], "planner_p99_wall_s": pl["p99_wall_s"],
            "planner_busy_median_wall_s": pl["busy_median_wall_s"],
            "planner_busy_p99_wall_s": pl["busy_p99_wall_s"],
            "aborted": m["aborted"], "dispatched": m["dispatched"],
            "abort_per_seq_s": m["abort_s"] / max(1, m["aborted"]),
            "dispatch_per_seq_s": m["dispatch_s"] / max(1, m["dispatched"]),
            "reprefill_per_seq_s": m["reprefill_s"] / max(1, m["dispatched"]),
            "wall_s": r["wall_s"], "events_per_s": r["events_per_s"]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--large", action="store_true", help="256-1024 devices")
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    sizes = [256, 512, 1024] if a.large else [16, 32, 64, 128]
    jobs = []
    for g, frac in GROUPS.items():
        for n in sizes:
            tr = max(4, int(n * frac) // 4 * 4)
            jobs.append((g, "pivotrl", (f"ModelGroup.devices = {n}",
                                        f"TrainingProfile.devices = {tr}",
                                        f"PIVOT_ROLLOUT = {n // 2}", f"PIVOT_REWARD = {n // 2}",
                                        f"ModelGroup.prompts_per_step = {n // 2}",
                                        f"SimDriver.steps = {a.steps}"), False))
    rows = [row(r) for r in run_many(jobs)]
    name = "tables23_large" if a.large else "tables23"
    (ROOT / f"results/sim/{name}.json").write_text(json.dumps(
        {"settings": vars(a), "rows": rows}, indent=1))
    print("group            devices  pre(s)  constr(s)  sim(s)  total(s) | abort  dispatch  "
          "re-prefill (s/seq)  events/s")
    for x in rows:
        print(f"{x['group']:<16} {x['devices']:>5}  {x['planner_preprocess_s']:.4f}  "
              f"{x['planner_construct_s']:.4f}  {x['planner_simulate_s']:.4f}  "
              f"{x['planner_total_s']:.4f} | {x['abort_per_seq_s']:.4f}  "
              f"{x['dispatch_per_seq_s']:.4f}  {x['reprefill_per_seq_s']:.4f}  "
              f"{x['events_per_s']:.0f}")
        wandb_log(f"{name}_{x['group']}_{x['devices']}", {"group": x["group"]}, x,
                  group=name)


if __name__ == "__main__":
    main()
