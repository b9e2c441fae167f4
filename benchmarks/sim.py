"""How the `sim` driver's cost grows with the work (docs/design.md: linearly).

Runs PivotRL on the 7B/30B group (table 1) against sequences per step (256, 2K, 8K, 32K:
32 x 8, 256 x 8, 512 x 16, 2048 x 16 at 128 devices) and against devices (128, 256, 512,
1024 at the paper's 512 x 16), with training on a quarter of the cluster (table 4's 8 of
32) and the pool split evenly at the start. Reports each run's wall time, simulator events
and events/s, and the planner's time per tick (median, p99) measured inside the run, over
all ticks and over the busy ones (some sequence running or waiting; in the others the
cluster waits on training and the planner returns at once).
Each run is a fresh process; a small run first compiles the planner's kernels. Writes
results/sim/scaling.json and the log-log plot results/sim/scaling.png; prints a table.

    python benchmarks/sim.py [--steps 3] [--repeats 1] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

from pivot.paths import REPO_ROOT as ROOT
from pivot.runners.sim_experiments import run_one

GROUP = "qwen7b_30b"
SEQS = [(32, 8), (256, 8), (512, 16), (2048, 16)]
DEVICES = [128, 256, 512, 1024]


def bindings(devices: int, prompts: int, n: int, steps: int) -> tuple[str, ...]:
    return (f"ModelGroup.devices = {devices}", f"TrainingProfile.devices = {devices // 4}",
            f"PIVOT_ROLLOUT = {devices // 2}", f"PIVOT_REWARD = {devices // 2}",
            f"ModelGroup.prompts_per_step = {prompts}", f"ModelGroup.n = {n}",
            f"SimDriver.steps = {steps}")


def measure(devices: int, prompts: int, n: int, steps: int, repeats: int) -> dict:
    """One configuration, ``repeats`` fresh processes; medians of the wall times."""
    runs = []
    for _ in range(repeats):
        with ProcessPoolExecutor(1) as ex:
            run_ex = ex.submit(run_one, (GROUP, "pivotrl",
                                         bindings(devices, prompts, n, steps), False))
            runs.append(run_ex.result())
    wall = statistics.median(r["wall_s"] for r in runs)
    r = runs[0]
    pl = r["planner"]
    return {"devices": devices, "prompts": prompts, "n": n, "seqs_per_step": prompts * n,
            "steps": steps, "wall_s": wall, "walls_s": [x["wall_s"] for x in runs],
            "events": r["events"], "events_per_s": r["events"] / wall,
            "virtual_s": r["virtual_s"], "throughput": r["throughput"],
            "planner_calls": pl["calls"],
            "planner_median_ms": 1e3 * statistics.median(x["planner"]["median_wall_s"]
                                                         for x in runs),
            "planner_p99_ms": 1e3 * statistics.median(x["planner"]["p99_wall_s"]
                                                      for x in runs),
            "planner_busy_ticks": pl["busy_calls"],
            "planner_busy_median_ms": 1e3 * statistics.median(
                x["planner"]["busy_median_wall_s"] for x in runs),
            "planner_busy_p99_ms": 1e3 * statistics.median(x["planner"]["busy_p99_wall_s"]
                                                           for x in runs),
            "planner_mean_ms": 1e3 * pl["mean_wall_s"],
            "planner_share": pl["calls"] * pl["mean_wall_s"] / r["wall_s"]}


def plot(rows: dict, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, x, label in ((axes[0], "by_seqs", "seqs_per_step",
                               "sequences per step (128 devices)"),
                              (axes[1], "by_devices", "devices", "devices (512 x 16)")):
        xs = [r[x] for r in rows[key]]
        walls = [r["wall_s"] for r in rows[key]]
        ax.loglog(xs, walls, "o-", label="wall s")
        ax.loglog(xs, [r["events"] / 1e3 for r in rows[key]], "s--", label="k events")
        ax.loglog(xs, [walls[0] * v / xs[0] for v in xs], ":", color="grey",
                  label="linear from the first")
        ax.set_xlabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    axes[0].set_ylabel("wall s / k events")
    fig.suptitle(f"sim driver cost, {GROUP} PivotRL, {rows['settings']['steps']} steps")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="the two smallest of each sweep")
    a = p.parse_args()
    seqs, devices = (SEQS[:2], DEVICES[:2]) if a.quick else (SEQS, DEVICES)
    t0 = time.perf_counter()
    measure(32, 32, 8, 2, 1)  # compiles and caches the planner's kernels
    by_seqs = [measure(128, pr, n, a.steps, a.repeats) for pr, n in seqs]
    by_dev = [measure(d, 512, 16, a.steps, a.repeats) for d in devices]
    out = {"settings": {**vars(a), "group": GROUP, "deployment": "pivotrl"},
           "wall_s": time.perf_counter() - t0, "by_seqs": by_seqs, "by_devices": by_dev}
    (ROOT / "results/sim").mkdir(parents=True, exist_ok=True)
    (ROOT / "results/sim/scaling.json").write_text(json.dumps(out, indent=1))
    plot(out, ROOT / "results/sim/scaling.png")
    print(f"{'devices':>7} {'seqs/step':>9} {'wall s':>7} {'events':>7} {'events/s':>8} "
          f"{'ticks':>6} {'med ms':>7} {'p99 ms':>7} {'busy':>5} {'busy med':>8} "
          f"{'busy p99':>8} {'planner share':>13}")
    for r in by_seqs + by_dev:
        print(f"{r['devices']:>7} {r['seqs_per_step']:>9} {r['wall_s']:>7.1f} "
              f"{r['events']:>7} {r['events_per_s']:>8.0f} {r['planner_calls']:>6} "
              f"{r['planner_median_ms']:>7.2f} {r['planner_p99_ms']:>7.1f} "
              f"{r['planner_busy_ticks']:>5} {r['planner_busy_median_ms']:>8.2f} "
              f"{r['planner_busy_p99_ms']:>8.1f} {r['planner_share']:>13.2f}")
    print(f"total {out['wall_s']:.0f} s; results/sim/scaling.json, results/sim/scaling.png")


if __name__ == "__main__":
    main()
