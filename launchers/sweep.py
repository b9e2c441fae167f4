"""Runs the H x shift-strategy grid of sweeps/h_strategy.yaml without a wandb server.

    python launchers/sweep.py                      # the whole grid, results/sim/sweep.json
    python launchers/sweep.py --one --group=qwen7b_30b --strategy=full --H=60   # one point

``wandb agent`` calls the ``--one`` form with the sweep's ${args}; each point logs its
metrics and gin config to wandb (offline unless WANDB_MODE says otherwise). ``H`` only
acts on the planners that take it (PivotPlanner and its ablations); for ``static`` and
``rule_based`` the H values repeat one configuration.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys

from pivot.config.validation import default_of
from pivot.paths import REPO_ROOT as ROOT
from pivot.planner import PivotPlanner

GRID = {"group": ["qwen7b_30b"],
        "strategy": ["full", "vanilla", "throughput_model", "static", "rule_based"],
        "H": [0.01, 5, 30, 60, 90, 120, 600]}
"""Must equal the parameters of sweeps/h_strategy.yaml."""
TAKES_H = {"full", "vanilla", "throughput_model"}


def points(grid: dict = GRID) -> list[dict]:
    """Every grid point, in the order wandb's grid search enumerates (product)."""
    keys = list(grid)
    return [dict(zip(keys, v)) for v in itertools.product(*(grid[k] for k in keys))]


def bindings(point: dict, prompts: int, steps: int, seed: int = 0) -> list[str]:
    b = [f"ModelGroup.prompts_per_step = {prompts}", f"SimDriver.steps = {steps}",
         f"SimDriver.seed = {seed}"]
    if point["strategy"] in TAKES_H:
        b.append(f"PivotPlanner.H = {float(point['H'])}")
    return b


def run_point(point: dict, prompts: int, steps: int) -> dict:
    from pivot.runners.sim_experiments import run_one, wandb_log
    import gin
    b = bindings(point, prompts, steps)
    r = run_one((point["group"], point["strategy"], tuple(b), False))
    metrics = {f"sim/run/{k}": r[k] for k in ("throughput", "step_time", "shifts",
                                             "shifts_per_step", "events_per_s")}
    wandb_log(f"sweep_{point['group']}_{point['strategy']}_H{point['H']}",
              {"gin": gin.operative_config_str(), **point}, metrics, group="h_strategy")
    return {**point, **metrics}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", action="store_true", help="run one point (wandb agent)")
    ap.add_argument("--group", default=GRID["group"][0])
    ap.add_argument("--strategy", default="full")
    ap.add_argument("--H", type=float, default=default_of(PivotPlanner, "H"))
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(run_point({"group": a.group, "strategy": a.strategy, "H": a.H},
                                   a.prompts, a.steps)))
        return 0
    from concurrent.futures import ProcessPoolExecutor
    pts = points()
    with ProcessPoolExecutor(a.workers) as ex:
        rows = list(ex.map(run_point, pts, [a.prompts] * len(pts), [a.steps] * len(pts)))
    out = ROOT / "results/sim/sweep.json"
    out.write_text(json.dumps({"grid": GRID, "rows": rows}, indent=1))
    for r in rows:
        print(f"{r['strategy']:<17} H={r['H']:<6} {r['sim/run/throughput']:9.0f} tok/s "
              f"{r['sim/run/shifts_per_step']:.1f} shifts/step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
