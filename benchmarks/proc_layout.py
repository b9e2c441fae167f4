"""A process per slot against a process per role on each slot (``Backend.proc_per_role``,
the ``cuda`` layout): start-up, resident memory and colocated step time on this machine.

On GPUs each slot needs a process per role (vLLM keeps its sleep allocator and parallel
groups once per process); on the CPU a slot may hold every role in one process, which is
the ``cpu`` default. This script runs the same colocated job on both layouts, one after the
other in one run, so the cost of the GPU layout can be read as ratios here:

    python benchmarks/proc_layout.py [--devices 2] [--steps 4]
        [--out results/local/proc_layout.json]
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

GB = 1e9
GROUP = dict(n=2, max_response_tokens=64, max_judge_tokens=64)


def run_layout(per_role: bool, devices: int, steps: int, run_dir: Path) -> dict:
    from pivot.config.validation import default_of
    from pivot.cluster.config import OptimizerConfig, PlannerCosts, RunConfig
    from pivot.cluster.cpu.config import CpuConfig
    from pivot.cluster.driver import ClusterDriver
    from pivot.gin_files import configured, configured_deployment
    from pivot.cluster.group import ClusterGroup
    from pivot.cluster.stack import ClusterStack
    from pivot.rl.data import PromptStream
    from pivot.roles.engine.memory import process_rss, tree_rss
    from pivot.runtime.backend import Backend

    group = ClusterGroup(**GROUP, devices=devices,
                       backend=Backend("cpu", proc_per_role=per_role))
    # a driver's defaults (it passes them to the stack it starts)
    settings = [default_of(RunConfig, "seed"), default_of(OptimizerConfig, "lr"),
                default_of(CpuConfig, "share")]
    t = time.perf_counter()
    stack = ClusterStack(group, *settings).start()
    start_s = time.perf_counter() - t
    d = ClusterDriver(group, configured_deployment("colocated"),
                      PromptStream(prompts_per_step=2, num_val=4),
                      run_config=RunConfig(steps=steps, run_dir=str(run_dir), eval_every=-1),
                      costs=configured(PlannerCosts), stack=stack)
    try:
        ctl = stack.ctl
        pids = [p for x in range(devices) for p in ctl.describe(x)["pids"]]
        out = {"procs": len(pids), "start_s": start_s,
               "rss_all_start_gb": tree_rss(os.getpid())[0] / GB,
               "rss_slot_procs_start_gb": sum(process_rss(p) for p in pids) / GB}
        res = d.run()
        times = [m["time_s"] for m in res.steps]
        step_s = [b - a for a, b in zip(times, times[1:])]
        out.update({"step_s_median": statistics.median(step_s), "step_s": step_s,
                    "rss_all_end_gb": tree_rss(os.getpid())[0] / GB,
                    "rss_slot_procs_end_gb": sum(process_rss(p) for p in pids) / GB,
                    "shifts": len(res.shifts)})
        if res.shifts:
            out["shift_total_s_median"] = statistics.median(s["total_s"] for s in res.shifts)
        return out
    finally:
        d.close()
        stack.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--out", default="results/local/proc_layout.json")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    out = Path(a.out)
    res: dict = {"devices": a.devices, "steps": a.steps, "group": GROUP,
                 "load_average_start": os.getloadavg()}
    for name, per_role in (("one_per_slot", False), ("one_per_role", True)):
        run_dir = out.parent / "runs" / f"proc_layout_{name}"
        res[name] = run_layout(per_role, a.devices, a.steps, run_dir)
        print(name, {k: (round(v, 3) if isinstance(v, float) else v)
                     for k, v in res[name].items() if k != "step_s"}, flush=True)
    one, per = res["one_per_slot"], res["one_per_role"]
    res["ratios_role_over_slot"] = {
        k: per[k] / one[k] for k in ("start_s", "rss_slot_procs_start_gb",
                                     "rss_slot_procs_end_gb", "step_s_median")}
    res["load_average_end"] = os.getloadavg()
    res["note"] = ("2-core machine; both layouts in one run, one after the other; RSS sums "
                   "the slot procs (rss_all adds the client, GPS and engine helpers)")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=str))
    print("per-role / per-slot:", {k: round(v, 2) for k, v in
                                   res["ratios_role_over_slot"].items()})
    print("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
