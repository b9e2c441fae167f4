"""Fig. 9: end-to-end throughput of the four deployments for the four model groups.

    python experiments/fig9.py [--seeds 3] [--steps 5] [--prompts 32] [--n N]

First searches every deployment's split (app. E / table 4: "for each baseline, we tune its
resource configuration"; ``pivot.sim.search``, the same coordinate search over the training
share, and the reward share where the split is static, for every deployment, PivotRL's
initial split included) with seed 0 and ``--search_steps`` steps (default ``--steps``, so
the search ranks splits by the very runs the table measures and reuses seed 0's run), then
runs the chosen splits with every seed. A searched split's run stops as soon as its
throughput is proven below the best measured so far (``SimDriver.stop_below``; recorded
under ``pruned`` with its bound; ``--no_prune`` runs them to the end): the chosen splits
are the same. Writes results/sim/fig9.json (``--prompts 512 --n
16``: fig9_p512n16.json; mean, std per cell, PivotRL's speedups, the chosen splits and every
split tried). Groups accumulate: a run of some ``--groups`` replaces those groups in an
existing file measured with the same settings and keeps the others (different settings:
the file starts afresh). The plot is analysis/plot_fig9.py.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from pivot.paths import REPO_ROOT as ROOT

from pivot.runners.sim_experiments import GROUPS, regime, run_many, search, wandb_log

DEPS = ["colocated", "disaggregated", "rr_colocated", "pivotrl"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=None, help="responses per prompt (default: gin)")
    p.add_argument("--search_steps", type=int, default=None, help="default: --steps")
    p.add_argument("--no_search", action="store_true", help="use table 4's splits")
    p.add_argument("--groups", nargs="*", default=GROUPS)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--no_prune", action="store_true",
                   help="run every searched split to the end (default: stop a split's run "
                        "once it is proven below the best so far; same chosen splits)")
    p.add_argument("--out", default=None,
                   help="result file name under results/sim (default fig9<regime tag>.json)")
    a = p.parse_args()
    if a.search_steps is None:
        a.search_steps = a.steps
    t0 = time.perf_counter()
    splits, searches, reuse = {}, {}, {}
    base, tag = regime(a.prompts, a.n)
    for g in a.groups:
        for d in DEPS[1:]:
            if a.no_search:
                splits[(g, d)] = []
                continue
            tried: dict = {}
            res = search(g, d, base + ["SimDriver.seed = 0",
                                       f"SimDriver.steps = {a.search_steps}"], a.workers,
                         runs=tried, prune=not a.no_prune)
            splits[(g, d)] = res.best.bindings()
            if a.search_steps == a.steps:
                # seed 0 at the chosen split is a run the search already made
                reuse[(g, d)] = tried[res.best]
            searches[f"{g}/{d}"] = res.to_dict()
            print(f"{g} {d}: best split {res.best} ({res.best_throughput:.0f} tok/s, "
                  f"{len(res.tried)} tried, {len(res.pruned)} of them stopped early)",
                  flush=True)
        splits[(g, "colocated")] = []
    t_search = time.perf_counter() - t0
    jobs = [(g, d, tuple(base + splits[(g, d)] + [f"SimDriver.seed = {s}",
                                                   f"SimDriver.steps = {a.steps}"]), False)
            for g in a.groups for d in DEPS for s in range(a.seeds)]
    todo = [j for j in jobs if not (j[2][-2] == "SimDriver.seed = 0" and (j[0], j[1]) in reuse)]
    done = iter(run_many(todo, a.workers))
    runs = []
    for j in jobs:
        if j in todo:
            runs.append(next(done))
        else:
            runs.append({**reuse[(j[0], j[1])], "bindings": list(j[2])})
    wall = time.perf_counter() - t0
    table = {}
    for g in a.groups:
        row = {}
        for d in DEPS:
            rs = [r for r in runs if r["group"] == g and r["deployment"] == d]
            xs = [r["throughput"] for r in rs]
            row[d] = {"mean": statistics.mean(xs), "std": statistics.pstdev(xs), "runs": xs,
                      "split": list(rs[0]["split"]) + [rs[0]["train_steps"] and
                                                       _train_devices(rs[0])],
                      "step_time": statistics.mean(r["step_time"] for r in rs)}
        for d in DEPS[:-1]:
            row[f"speedup_over_{d}"] = row["pivotrl"]["mean"] / row[d]["mean"]
        table[g] = row
    events = sum(r["events"] for r in runs)
    sim_wall = sum(r["wall_s"] for r in runs)
    out = {"settings": vars(a), "wall_s": wall, "search_wall_s": t_search,
           "events": events, "events_per_s": events / sim_wall, "table": table,
           "searches": searches, "runs": runs,
           "walls": {",".join(a.groups): {"wall_s": wall, "search_wall_s": t_search}}}
    (ROOT / "results/sim").mkdir(parents=True, exist_ok=True)
    path = ROOT / "results/sim" / (a.out or f"fig9{tag}.json")
    if path.is_file():
        out = merge(json.loads(path.read_text()), out)
    path.write_text(json.dumps(out, indent=1))
    for r in runs:
        wandb_log(f"fig9_{r['group']}_{r['deployment']}_s{r['seed']}",
                  {"bindings": r["bindings"], "group": r["group"],
                   "deployment": r["deployment"], "seed": r["seed"]},
                  {k: r[k] for k in ("throughput", "step_time", "shifts", "events_per_s")},
                  group="fig9")
    for g in a.groups:
        r = table[g]
        print(g, "  ".join(f"{d}={r[d]['mean']:.0f}±{r[d]['std']:.0f}" for d in DEPS),
              "  speedup:", "  ".join(f"{d}={r['speedup_over_' + d]:.2f}x" for d in DEPS[:-1]))
    print(f"wall {wall:.0f} s (search {t_search:.0f} s), {out['events_per_s']:.0f} events/s")


SAME = ("seeds", "steps", "prompts", "n", "search_steps", "no_search")
"""Settings two fig. 9 files must share for their groups to sit in one table."""


def merge(old: dict, new: dict) -> dict:
    """``new``'s groups replace those in ``old`` and the others stay, when both were
    measured with the same settings (``SAME``); else ``new`` alone."""
    if any(old.get("settings", {}).get(k) != new["settings"].get(k) for k in SAME):
        print("fig9: settings differ from the existing file's; it starts afresh")
        return new
    groups = new["settings"]["groups"]
    kept = [g for g in old["settings"]["groups"] if g not in groups]
    runs = [r for r in old["runs"] if r["group"] in kept] + new["runs"]
    walls = {**old.get("walls", {"": {"wall_s": old["wall_s"],
                                      "search_wall_s": old["search_wall_s"]}}),
             **new["walls"]}
    sim_wall = sum(r["wall_s"] for r in runs)
    order = [g for g in GROUPS if g in kept + groups]
    return {**new, "settings": {**new["settings"], "groups": order},
            "wall_s": sum(w["wall_s"] for w in walls.values()),
            "search_wall_s": sum(w["search_wall_s"] for w in walls.values()),
            "events": sum(r["events"] for r in runs),
            "events_per_s": sum(r["events"] for r in runs) / sim_wall,
            "table": {g: ({**old["table"], **new["table"]})[g] for g in order},
            "searches": {k: v for k, v in {**old["searches"], **new["searches"]}.items()
                         if k.split("/")[0] in order},
            "runs": runs, "walls": walls}


def _train_devices(r: dict) -> int:
    """Training devices of a run (from its bindings, else the group's default)."""
    for b in r["bindings"]:
        if b.startswith("TrainingProfile.devices"):
            return int(b.split("=")[1])
    return -1


if __name__ == "__main__":
    main()
