"""Instrumented runs: allocation over time, idle devices, shifts, and the time each role has
no replica while it has work, for one model group and a few deployments.

    python experiments/instrument.py [--group qwen7b_30b]
        [--deps disaggregated rule_based vanilla pivotrl] [--steps 5] [--prompts 32]

Each deployment runs at the split fig. 9 chose (results/sim/fig9.json; the strategies use
their source deployment's split, as fig. 11 does). Writes
results/sim/instrument_<group>_p<prompts>.json (a summary per deployment plus a thinned
allocation trace) and prints the summary.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

from pivot.paths import REPO_ROOT as ROOT

from pivot.runners.sim_experiments import chosen_split, run_one

SOURCE = {"static": "disaggregated", "rule_based": "disaggregated", "vanilla": "pivotrl",
          "throughput_model": "pivotrl", "full": "pivotrl"}
"""The deployment whose searched split a strategy starts from (as in fig11.py)."""


def summarise(res: dict) -> dict:
    """Time-weighted allocation, idle devices and starved time from a traced result.

    An inference role is "starved" over a sample interval when it has sequences (queued or
    running) at the interval's start and no devices. Training's readiness is not in the
    samples, so for it only device-seconds and its busy fraction are reported."""
    samples = res["trace"]
    devices = res["devices"]
    t0, t1 = res["train_steps"][0][2], res["train_steps"][-1][2]
    dev_s: Counter = Counter()
    starved: Counter = Counter()
    idle_s = span = 0.0
    for a, b in zip(samples, samples[1:]):
        lo, hi = max(a["time"], t0), min(b["time"], t1)
        if hi <= lo:
            continue
        dt = hi - lo
        span += dt
        for role, n in a["alloc"].items():
            dev_s[role] += n * dt
        idle_s += (devices - sum(a["alloc"].values())) * dt
        for role in ("rollout", "reward"):
            if a[f"n_{role}"] > 0 and a["alloc"].get(role, 0) == 0:
                starved[role] += dt
    span = span or 1.0
    train = [s[2] - s[1] for s in res["train_steps"][1:]]
    reasons = Counter(s["reason"].split(":")[0] + ":" + s["up_role"] for s in res["shift_log"])
    return {
        "throughput": res["throughput"], "step_time": res["step_time"], "split": res["split"],
        "mean_devices": {r: v / span for r, v in dev_s.items()},
        "mean_idle_devices": idle_s / span,
        "starved_s_per_step": {r: v / (res["steps"] - 1) for r, v in starved.items()},
        "train_s_per_step": sum(train) / max(1, len(train)),
        "train_busy_fraction": sum(train) / (t1 - t0),
        "shifts_per_step": res["shifts_per_step"], "shift_kinds": dict(reasons),
        "shift_phases": res["shift_phases"],
    }


def thin(samples: list[dict], keep: int = 150) -> list[list]:
    """[time, rollout, reward, training, n_rollout, n_reward] at <= ``keep`` samples."""
    step = max(1, len(samples) // keep)
    return [[round(s["time"], 1), s["alloc"].get("rollout", 0), s["alloc"].get("reward", 0),
             s["alloc"].get("training", 0), s["n_rollout"], s["n_reward"]]
            for s in samples[::step]]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--group", default="qwen7b_30b")
    p.add_argument("--deps", nargs="+", default=["disaggregated", "rule_based", "vanilla",
                                                  "pivotrl"])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    out = {"settings": vars(a), "runs": {}}
    for dep in a.deps:
        b = [f"ModelGroup.prompts_per_step = {a.prompts}", f"SimDriver.steps = {a.steps}",
             f"SimDriver.seed = {a.seed}"] + chosen_split(a.group, SOURCE.get(dep, dep))
        res = run_one((a.group, dep, tuple(b), True))
        s = summarise(res)
        s["alloc_trace"] = thin(res["trace"])
        s["shift_log"] = res["shift_log"][:60]
        out["runs"][dep] = s
        print(f"{dep:<14} thr {s['throughput']:9.0f} step {s['step_time']:7.1f}s split "
              f"{s['split']} devices {({k: round(v, 1) for k, v in s['mean_devices'].items()})}"
              f" idle {s['mean_idle_devices']:.1f} starved/step "
              f"{({k: round(v, 1) for k, v in s['starved_s_per_step'].items()})} train "
              f"{s['train_s_per_step']:.1f}s ({s['train_busy_fraction']:.2f}) shifts/step "
              f"{s['shifts_per_step']:.1f} {s['shift_kinds']}")
    path = ROOT / f"results/sim/instrument_{a.group}_p{a.prompts}.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
