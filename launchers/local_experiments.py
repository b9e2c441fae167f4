"""The local driver's measurements, one command each (results/local/*.json, *.png).

    python launchers/local_experiments.py throughput [--steps 6]      # 4 deployments, ratios
    python launchers/local_experiments.py convergence [--steps 20]    # fig. 15, 2 seeds
    python launchers/local_experiments.py trace                       # fig. 10 from a real run

Each run is ``launchers/run.py`` on gin/tiny_cpu.gin plus a gin/local/<deployment>.gin
fragment, in its own process (one 4-slot mesh at a time, ~8 GB). Shift and migration
overheads (fig. 12, table 3) come from the shift records of every run. Plots:
``analysis/local_plots.py``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "local"
THROUGHPUT = ("colocated", "disaggregated", "rr_colocated", "pivotrl")
CONVERGENCE = ("colocated", "disaggregated", "pivotrl")


def run_one(dep: str, seed: int, steps: int, extra: list[str]) -> dict:
    run_dir = OUT / "runs" / f"{dep}_s{seed}"
    cmd = [sys.executable, "launchers/run.py", "--gin", "gin/tiny_cpu.gin", "--gin",
           f"gin/local/{dep}.gin", "--run_dir", str(run_dir), "--no_progress",
           "--gin_param", f"LocalDriver.steps = {steps}",
           "--gin_param", f"LocalDriver.seed = {seed}",
           "--gin_param", f"PromptStream.seed = {seed}"]
    for p in extra:
        cmd += ["--gin_param", p]
    subprocess.run(cmd, cwd=ROOT, check=True)
    return json.loads((run_dir / "result.json").read_text())


def summarize(res: dict) -> dict:
    steps = res["steps"]
    return {"deployment": res["deployment"], "seed": res["seed"], "throughput": res["throughput"],
            "wall_s": res["wall_s"], "startup_s": res["startup_s"], "shifts": res["shifts"],
            "max_staleness": res["max_staleness"],
            "reward": [m["reward/mean"] for m in steps], "time_s": [m["time_s"] for m in steps],
            "val_acc": [m.get("val/accuracy_at_1") for m in steps],
            "shift_records": res.get("shift_records", []), "migration": res["migration"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("throughput", "convergence", "trace"))
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--seeds", type=int, nargs="+", default=None)
    p.add_argument("--deployments", nargs="+", default=None)
    a = p.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if a.what == "throughput":
        deps, seeds, steps, extra = a.deployments or THROUGHPUT, a.seeds or [0], a.steps or 6, []
    elif a.what == "convergence":
        deps, seeds, steps = a.deployments or CONVERGENCE, a.seeds or [0, 1], a.steps or 20
        extra = ["LocalDriver.eval_every = 5"]
    else:
        deps, seeds, steps, extra = a.deployments or ["pivotrl"], a.seeds or [0], a.steps or 6, []
    rows = [summarize(run_one(d, s, steps, extra)) for d in deps for s in seeds]
    out = {"what": a.what, "steps": steps, "runs": rows}
    if a.what == "throughput":
        thr = {r["deployment"]: r["throughput"] for r in rows}
        base = {k: thr.get(k) for k in ("disaggregated", "colocated")}
        out["ratios"] = {d: {f"vs_{k}": (t / b if t and b else None) for k, b in base.items()}
                         for d, t in thr.items()}
    (OUT / f"{a.what}.json").write_text(json.dumps(out, indent=1))
    subprocess.run([sys.executable, "analysis/local_plots.py", a.what], cwd=ROOT, check=False)
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
