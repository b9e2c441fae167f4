"""Planner and migration-decision overhead at 16-1024 devices (the paper's tables 2 and 3).

Builds a realistic load for the 7B/30B group's shapes (one-device rollout replicas,
four-device reward replicas, 8 devices per host), runs the PivotRL planner on it, and
reports its time split into pre-processing, candidate construction and simulation (wall
time) and its total CPU time (the planner is single-threaded, so CPU time is what it costs
when the machine is shared), plus the scheduler's decision time per migrated sequence for
Abort and Dispatch. Prints a table and writes results/planner_bench.json.

    python benchmarks/planner.py [--devices 16 32 ...] [--trials 5]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from pivot.planner import PivotPlanner
from pivot.scheduler import ShiftAwareScheduler, ThroughputModel
from pivot.types import (ReplicaView, Role, RoleLoad, SequenceState, TrainingLoad,
                         WorkloadSnapshot)

# Per-replica decode profiles of the 7B (TP1) and 30B-A3B (EP4) models on H100, from the
# ITL fits of third_party/calibration/README.md (8B: 8.6 + 0.086 N ms; 30B-A3B EP2: 15.8 +
# 0.063 N ms), with a KV-read term of 1e-8 s per cached token. Only their shapes matter here.
ROLLOUT = ThroughputModel(A=1e-8, B=0.0, C=0.086e-3, D=8.6e-3)
REWARD = ThroughputModel(A=1e-8, B=0.0, C=0.063e-3, D=15.8e-3)
KV_ROLLOUT, KV_REWARD = 400_000, 1_600_000


def build_state(devices: int, seed: int):
    """Rollout owns 3/8 of the devices, reward 1/2, training 1/8 (step done, holding)."""
    rng = random.Random(seed)
    n_ro = devices * 3 // 8
    n_rm = devices // 2 // 4
    hosts = tuple(d // 8 for d in range(devices))
    sid = 0

    def load(role, n, size, kv, seqs, cap_len):
        nonlocal sid
        sched = ShiftAwareScheduler(role, ROLLOUT if role is Role.ROLLOUT else REWARD)
        base = 0 if role is Role.ROLLOUT else n_ro
        sched.add_replicas([ReplicaView(f"{role.value}{i}", role,
                                        tuple(range(base + i * size, base + (i + 1) * size)),
                                        kv) for i in range(n)])
        for _ in range(n * seqs):
            sched.submit(SequenceState(sid, "x", rng.randint(200, 2000), 15_000,
                                       generated_len=rng.randint(500, cap_len)))
            sid += 1
        sched.dispatch()
        return sched

    ro = load(Role.ROLLOUT, n_ro, 1, KV_ROLLOUT, rng.randint(5, 30), 8000)
    rm = load(Role.REWARD, n_rm, 4, KV_REWARD, rng.randint(40, 80), 12000)
    tr_devs = tuple(range(n_ro + 4 * n_rm, devices))
    snap = WorkloadSnapshot(
        0.0,
        RoleLoad(Role.ROLLOUT, [v.copy() for v in ro.replicas.values()],
                 [(s.seq_id, s.length) for s in ro.queue], 1, KV_ROLLOUT, devices, 1.5),
        RoleLoad(Role.REWARD, [v.copy() for v in rm.replicas.values()],
                 [(s.seq_id, s.length) for s in rm.queue], 4, KV_REWARD, devices // 4, 3.0),
        TrainingLoad(len(tr_devs), tr_devs), hosts)
    return snap, ro, rm


def bench(devices: int, trials: int) -> dict:
    parts = {"preprocess": [], "construct": [], "simulate": [], "total": [], "total_cpu": []}
    abort_us, dispatch_us, planned = [], [], 0
    for seed in range(trials):
        snap, ro, rm = build_state(devices, seed)
        planner = PivotPlanner(ROLLOUT, REWARD, H=60)
        t0, c0 = time.perf_counter(), time.process_time()
        plan = planner.plan(snap)
        total, cpu = time.perf_counter() - t0, time.process_time() - c0
        planned += plan is not None
        for k, v in planner.last_timings.items():
            parts[k].append(v)
        parts["total"].append(total)
        parts["total_cpu"].append(cpu)
        # Migration decision cost: shift a quarter of rollout down, then back up.
        victims = list(ro.replicas)[: max(1, len(ro.replicas) // 4)]
        moved = sum(ro.replicas[v].num_seqs for v in victims)
        views = [ro.replicas[v] for v in victims]
        t0 = time.perf_counter()
        for v in victims:
            ro.abort(v, "all")
        t1 = time.perf_counter()
        ro._remove_replicas(victims)
        ro.dispatch()
        t2 = time.perf_counter()
        abort_us.append(1e6 * (t1 - t0) / max(moved, 1))
        dispatch_us.append(1e6 * (t2 - t1) / max(moved, 1))
        ro.shift_up([ReplicaView(v.replica_id, Role.ROLLOUT, v.devices, v.kv_capacity)
                     for v in views])
    def ms(xs):
        return 1e3 * statistics.mean(xs), 1e3 * (statistics.pstdev(xs) if len(xs) > 1 else 0)
    return {
        "devices": devices,
        "trials": trials,
        "plans_found": planned,
        **{f"{k}_ms": ms(v)[0] for k, v in parts.items()},
        **{f"{k}_ms_std": ms(v)[1] for k, v in parts.items()},
        "abort_us_per_seq": statistics.mean(abort_us),
        "dispatch_us_per_seq": statistics.mean(dispatch_us),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, nargs="+",
                    default=[16, 32, 64, 128, 256, 512, 1024])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--out", default="results/planner_bench.json")
    args = ap.parse_args()
    rows = [bench(d, args.trials) for d in args.devices]
    head = (f"{'devices':>8} {'pre ms':>8} {'cons ms':>8} {'sim ms':>8} {'total ms':>9} "
            f"{'cpu ms':>8} {'abort us/seq':>13} {'dispatch us/seq':>16}")
    print(head)
    for r in rows:
        print(f"{r['devices']:>8} {r['preprocess_ms']:>8.2f} {r['construct_ms']:>8.2f} "
              f"{r['simulate_ms']:>8.2f} {r['total_ms']:>9.2f} {r['total_cpu_ms']:>8.2f} "
              f"{r['abort_us_per_seq']:>13.1f} "
              f"{r['dispatch_us_per_seq']:>16.1f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": rows, "targets_ms": {"128": 20, "1024": 200}},
                                         indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
