"""Fig. 9: end-to-end throughput of the four deployments for the four model groups.

    python launchers/experiments/fig9.py [--seeds 3] [--steps 5] [--prompts 32]

Writes results/sim/fig9.json (mean, std per cell and PivotRL's speedups); the plot is
analysis/plot_fig9.py. Splits are table 4's (the split search is not run here).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GROUPS = ["qwen1.5b_glm9b", "qwen7b_30b", "qwen32b_30b", "qwen72b_122b"]
DEPS = ["colocated", "disaggregated", "rr_colocated", "pivotrl"]


def one(args):
    group, dep, seed, steps, prompts = args
    import os
    os.chdir(ROOT)
    from pivot.config import gin_setup
    gin_setup.parse([f"gin/{group}.gin", f"gin/deployments/{dep}.gin"],
                    [f"SimDriver.seed = {seed}", f"SimDriver.steps = {steps}",
                     f"ModelGroup.prompts_per_step = {prompts}"])
    r = gin_setup.build().run()
    return r.to_dict()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args()
    jobs = [(g, d, s, a.steps, a.prompts) for g in GROUPS for d in DEPS for s in range(a.seeds)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(a.workers) as ex:
        runs = list(ex.map(one, jobs))
    wall = time.perf_counter() - t0
    table = {}
    for g in GROUPS:
        row = {}
        for d in DEPS:
            xs = [r["throughput"] for r in runs if r["group"] == g and r["deployment"] == d]
            row[d] = {"mean": statistics.mean(xs), "std": statistics.pstdev(xs), "runs": xs}
        for d in DEPS[:-1]:
            row[f"speedup_over_{d}"] = row["pivotrl"]["mean"] / row[d]["mean"]
        table[g] = row
    ev = sum(r["events"] for r in runs) / sum(r["wall_s"] for r in runs)
    out = {"settings": vars(a), "wall_s": wall, "events_per_s": ev, "table": table,
           "runs": runs}
    Path("results/sim").mkdir(parents=True, exist_ok=True)
    (ROOT / "results/sim/fig9.json").write_text(json.dumps(out, indent=1))
    for g in GROUPS:
        r = table[g]
        print(g, "  ".join(f"{d}={r[d]['mean']:.0f}±{r[d]['std']:.0f}" for d in DEPS),
              "  speedup:", "  ".join(f"{d}={r['speedup_over_' + d]:.2f}x" for d in DEPS[:-1]))
    print(f"wall {wall:.0f} s, {ev:.0f} events/s")


if __name__ == "__main__":
    main()
