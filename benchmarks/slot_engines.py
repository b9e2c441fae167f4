"""Two engines per device slot (policy and GenRM, one asleep): start-up, resident memory
asleep and awake, and per-phase shift times of each role on the real stack (sec. 5.2,
fig. 12's split).

Starts the cluster driver's ``ClusterStack`` (GPS with both models, 4 slots capped at their CPU
share, each with a policy engine, a GenRM engine and a trainer context), then on every
slot, ``--reps`` times: rollout up, rollout down, reward up, reward down, reading the
slot's RSS after each. Resident memory of the whole run is the sum of RSS over this
process and its descendants (/proc), taken with every engine asleep, with every slot's
policy engine awake and with every slot's GenRM engine awake.

    python benchmarks/slot_engines.py [--reps 5] [--out results/slot_engines.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path

log = logging.getLogger("bench_slot_engines")
GB = 1e9


def stats(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "mean": statistics.fmean(xs), "min": min(xs),
            "max": max(xs), "n": len(xs)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default="results/slot_engines.json")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from pivot.config.validation import default_of
    from pivot.cluster.config import OptimizerConfig, RunConfig
    from pivot.cluster.cpu.config import CpuConfig
    from pivot.cluster.group import ClusterGroup
    from pivot.cluster.stack import ClusterStack
    from pivot.roles.engine.memory import process_rss, tree_rss
    from pivot.types import Role

    # a driver's defaults (it passes them to the stack it starts)
    settings = [default_of(RunConfig, "seed"), default_of(OptimizerConfig, "lr"),
                default_of(CpuConfig, "share")]
    stack = ClusterStack(ClusterGroup(), *settings)
    t = time.perf_counter()
    stack.start()
    res: dict = {"start_s": time.perf_counter() - t, "stack_startup_s": stack.startup_s,
                 "slots_up_s": stack.slots_up_s, "engine_start_s": stack.engine_start_s,
                 "devices": stack.group.devices, "cpu_share": stack.cpu_share,
                 "load_average_start": os.getloadavg()}
    ctl, sh = stack.ctl, stack.ctl.shifter
    devs = range(stack.group.devices)
    pids = {d: ctl.describe(d)["pid"] for d in devs}
    res["rss_all_asleep"] = tree_rss(os.getpid())[0]
    res["rss_slot_all_asleep"] = {d: process_rss(pids[d]) for d in devs}
    phases: dict[str, list[dict[str, float]]] = {k: [] for k in (
        "rollout_up", "rollout_down", "reward_up", "reward_down")}
    wall: dict[str, list[float]] = {k: [] for k in phases}
    rss: dict[str, list[int]] = {k: [] for k in phases}
    n = 0
    try:
        for role in (Role.ROLLOUT, Role.REWARD):
            for d in devs:  # every slot's engine of this model awake at once
                sh.shift_up(role, f"all-{role.value}-{d}", (d,))
            res[f"rss_all_{role.value}_awake"] = tree_rss(os.getpid())[0]
            res[f"rss_slot_{role.value}_awake"] = {d: process_rss(pids[d]) for d in devs}
            for d in devs:
                sh.shift_down(f"all-{role.value}-{d}")
        for _ in range(a.reps):
            for d in devs:
                for role in (Role.ROLLOUT, Role.REWARD):
                    rid = f"{role.value}-{n}"
                    n += 1
                    t = time.perf_counter()
                    up = ctl.shift_up(role, rid, (d,))
                    wall[f"{role.value}_up"].append(time.perf_counter() - t)
                    phases[f"{role.value}_up"].append(up.phases)
                    rss[f"{role.value}_up"].append(process_rss(pids[d]))
                    t = time.perf_counter()
                    down = ctl.shift_down(role, rid, (d,))
                    wall[f"{role.value}_down"].append(time.perf_counter() - t)
                    phases[f"{role.value}_down"].append(down.phases)
                    rss[f"{role.value}_down"].append(process_rss(pids[d]))
        res["phases_s"] = {k: {ph: stats([s[ph] for s in v]) for ph in v[0]}
                           for k, v in phases.items()}
        res["controller_wall_s"] = {k: stats(v) for k, v in wall.items()}
        res["slot_rss_after"] = {k: stats([x / GB for x in v]) for k, v in rss.items()}
        res["rss_all_asleep_after_cycles"] = tree_rss(os.getpid())[0]
        res["load_average_end"] = os.getloadavg()
    finally:
        stack.close()
    res["note"] = ("phases inside the slot (CPU-capped); controller_wall_s adds the Monarch "
                   "calls; RSS in bytes unless named in GB; 2-core machine shared with "
                   "other jobs")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=str))
    for k in ("start_s", "slots_up_s", "engine_start_s"):
        print(k, res[k])
    for k in ("rss_all_asleep", "rss_all_rollout_awake", "rss_all_reward_awake",
              "rss_all_asleep_after_cycles"):
        print(f"{k}: {res[k] / GB:.2f} GB")
    for k, v in res["phases_s"].items():
        print(k, "wall %.1f ms |" % (res["controller_wall_s"][k]["median"] * 1e3),
              ", ".join(f"{ph} {s['median'] * 1e3:.1f}" for ph, s in v.items()), "ms (medians)")
    print("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
