"""Where a simulated run's device time goes, per deployment (the sim's counterpart of
analysis/local_utilization.py; sec. 3's throughput headroom, fig. 10's allocation).

Device-seconds from the end of the first training step to the end of the last (the window
the throughput is measured over) split into:

- ``train``: training's devices while a step computes (exact, from the step intervals);
- ``train_wait``: training holds its devices but waits for its next batch;
- ``infer``: rollout or reward devices whose replica has sequences;
- ``infer_empty``: rollout or reward devices whose replica has none;
- ``idle``: devices no role holds;
- ``shifting``: devices inside a shift.

The allocation and per-role busy devices are sampled at every planner tick and every shift
(``pivot.sim.metrics.Tracer``) and held until the next sample. Usage:

    python analysis/sim_utilization.py results/sim/fig10_p512n16.json [...]

Reads runs that kept their trace (fig. 10's runs; ``experiments/simrun`` jobs
with trace=True) and writes ``<input>_utilization.json`` beside each input.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

STATES = ("train", "train_wait", "infer", "infer_empty", "idle", "shifting")


def _training_busy(steps: list[list[float]], lo: float, hi: float) -> float:
    """Seconds of [lo, hi) inside a training step (``train_steps``: step, start, end)."""
    return sum(max(0.0, min(hi, e) - max(lo, s)) for _, s, e in steps)


def utilization(run: dict) -> dict[str, float]:
    """Fractions of device-time per state over the run's throughput window."""
    trace, steps = run["trace"], run["train_steps"]
    if len(steps) < 2 or not trace:
        return {}
    t0, t1 = steps[0][2], steps[-1][2]
    devices = run.get("devices") or sum(trace[0]["alloc"].values()) + trace[0].get("idle", 0)
    acc = dict.fromkeys(STATES, 0.0)
    for a, b in zip(trace, trace[1:] + [{"time": t1}]):
        lo, hi = max(a["time"], t0), min(b["time"], t1)
        if hi <= lo:
            continue
        dt = hi - lo
        alloc = a["alloc"]
        n_train = alloc.get("training", 0)
        busy_frac = _training_busy(steps, lo, hi) / dt if n_train else 0.0
        acc["train"] += n_train * busy_frac * dt
        acc["train_wait"] += n_train * (1 - busy_frac) * dt
        for role in ("rollout", "reward"):
            n = alloc.get(role, 0)
            if "busy" in a:
                b_ = min(n, a["busy"].get(role, 0))
            else:   # older traces: a role with sequences counts all its devices busy
                b_ = n if a.get(f"n_{role}", 0) > 0 else 0
            acc["infer"] += b_ * dt
            acc["infer_empty"] += (n - b_) * dt
        idle = a.get("idle", 0)
        acc["idle"] += idle * dt
        acc["shifting"] += max(0, devices - sum(alloc.values()) - idle) * dt
    total = sum(acc.values()) or 1.0
    return {k: v / total for k, v in acc.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("paths", nargs="+")
    a = p.parse_args()
    for path in map(Path, a.paths):
        data = json.loads(path.read_text())
        out = {}
        for run in data["runs"]:
            u = utilization(run)
            out[run["deployment"]] = u
            print(f"{path.name} {run['deployment']:<14}",
                  "  ".join(f"{k} {v:5.1%}" for k, v in u.items()))
        dest = path.with_name(path.stem + "_utilization.json")
        dest.write_text(json.dumps(out, indent=1))
        print(f"wrote {dest}")


if __name__ == "__main__":
    main()
