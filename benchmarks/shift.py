"""Shift-down and shift-up times per phase on the local mesh (the paper's fig. 12 split).

Spawns one device slot per proc on this host (``--devices``, default 4), puts a policy
and a GenRM of a few MB each in the Global Parameter Storage (one GPS actor), and repeats: a
rollout replica shifts to reward and back, and training (AdamW state of the policy) shifts
down and up.
Reports each phase's time inside the slot, the controller's end-to-end time per shift
(phases + Monarch calls), and, for comparison, stopping a slot's actor and spawning a
fresh one on the same proc (the design the runtime did not take; see pivot/runtime/slot.py).
Prints a table and writes results/shift_bench.json.

    python benchmarks/shift.py [--devices 4] [--reps 5] [--out results/shift_bench.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import statistics
import time
from pathlib import Path


from pivot.gps.actor import GPSActor
from pivot.gps.layout import ModelMeta, plan_storage
from pivot.runtime.gps_source import GPSParameterSource
from pivot.runtime.mesh import MeshController
from pivot.runtime.provision import spawn_host_service, spawn_on
from pivot.runtime.slot import SlotActor
from pivot.testing.runtime import SlotTrainingContext, seed_batch
from pivot.testing.shifting import InferenceContext, TinyMLP, tiny_mlp_state
from pivot.types import GENRM, POLICY, Role

log = logging.getLogger("bench_shift")

POLICY_SIZES = (256, 1024, 512, 256)   # 0.92 M params, 3.7 MB fp32
GENRM_SIZES = (256, 768, 768, 256)     # 0.99 M params, 3.9 MB fp32


def mb(sd) -> float:
    return sum(v.numel() * v.element_size() for v in sd.values()) / 2**20


def summarize(samples: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    keys = sorted({k for s in samples for k in s})
    return {k: {"mean": statistics.fmean(s.get(k, 0.0) for s in samples),
                "min": min(s.get(k, 0.0) for s in samples),
                "max": max(s.get(k, 0.0) for s in samples)} for k in keys}


def timed(fn, *args):
    t = time.perf_counter()
    res = fn(*args)
    return res, time.perf_counter() - t


def run(devices: int, reps: int, kv_mib: int, threads: int | None) -> dict:
    models = {POLICY: tiny_mlp_state(POLICY_SIZES, 0), GENRM: tiny_mlp_state(GENRM_SIZES, 1)}
    metas = {m: ModelMeta.from_state_dict(m, sd) for m, sd in models.items()}
    storage = plan_storage(list(metas.values()), 1, 1 << 30)
    gps = spawn_host_service("gps", GPSActor, 0, storage, metas)
    source = GPSParameterSource([gps], metas, storage, (0,) * devices)
    for m, sd in models.items():
        source.gps.load(m, sd)
    kv_tokens = kv_mib * 1024  # 1 KiB per token
    factories = {
        Role.ROLLOUT: functools.partial(InferenceContext, Role.ROLLOUT, kv_tokens, 1024),
        Role.REWARD: functools.partial(InferenceContext, Role.REWARD, kv_tokens, 1024),
        Role.TRAINING: functools.partial(SlotTrainingContext, TinyMLP(POLICY_SIZES)),
    }
    ctl, spawn_s = timed(functools.partial(MeshController.local, devices, source, factories,
                                           torch_threads=threads))
    sh = ctl.shifter
    samples: dict[str, list[dict[str, float]]] = {k: [] for k in (
        "rollout_down", "reward_up", "reward_down", "rollout_up", "training_down",
        "training_up")}
    wall: dict[str, list[float]] = {k: [] for k in samples}

    def shift(key, fn, *args):
        res, secs = timed(fn, *args)
        samples[key].append(res.phases)
        wall[key].append(secs)

    sh.shift_up(Role.ROLLOUT, "ro-0", (0,))
    train_devs = tuple(range(1, devices))
    sh.shift_up(Role.TRAINING, "tr-0", train_devs)
    for d in train_devs:
        ctl.trainer(d).train_step(seed_batch(0)).get()
    n = 0
    for _ in range(reps):
        shift("rollout_down", sh.shift_down, f"ro-{n}", Role.REWARD)
        shift("reward_up", sh.shift_up, Role.REWARD, f"rm-{n}", (0,))
        shift("reward_down", sh.shift_down, f"rm-{n}", Role.ROLLOUT)
        n += 1
        shift("rollout_up", sh.shift_up, Role.ROLLOUT, f"ro-{n}", (0,))
        ctl.trainer(1).train_step(seed_batch(n)).get()
        ctl.write_back(1)
        shift("training_down", sh.shift_down, f"tr-{n - 1}", None)
        shift("training_up", sh.shift_up, Role.TRAINING, f"tr-{n}", train_devs)
    opt_mb = ctl.describe(1)["contexts"]["training"]["optimizer_bytes"] / 2**20

    # The alternative design: stop the slot actor and spawn a new one on the same proc.
    sh.shift_down(f"ro-{n}")
    restart = []
    pid = ctl.describe(0)["pid"]
    for i in range(reps):
        t = time.perf_counter()
        ctl.slots[0][0].stop().get()
        ctl.slots[0][0] = spawn_on(ctl.procs[0][0], f"slot0x{i}", SlotActor, 0, 0, source,
                                   factories, threads)
        same_pid = ctl.slots[0][0].describe.call_one().get()["pid"] == pid
        restart.append(time.perf_counter() - t)
        assert same_pid, "the respawned slot is on another process"
    ctl.stop()
    source.gps.close()
    gps.close.call_one().get()
    return {
        "devices": devices, "reps": reps, "torch_threads_per_slot": threads,
        "policy_mb": mb(models[POLICY]), "genrm_mb": mb(models[GENRM]),
        "optimizer_mb_per_slot": opt_mb, "kv_mib": kv_mib,
        "training_devices": len(train_devs),
        "slot_spawn_s": spawn_s,
        "phases_s": {k: summarize(v) for k, v in samples.items()},
        "wall_s": {k: {"mean": statistics.fmean(v), "min": min(v), "max": max(v)}
                   for k, v in wall.items()},
        "stop_and_respawn_slot_s": {"mean": statistics.fmean(restart), "min": min(restart),
                                    "max": max(restart)},
        "note": "phases are measured inside the slot (slowest device); wall_s adds the "
                "controller's Monarch calls. CPU-only machine shared with other jobs.",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--kv-mib", type=int, default=64, help="KV cache per inference slot")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads per slot proc; 0 = torch's default")
    ap.add_argument("--out", default="results/shift_bench.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    res = run(args.devices, args.reps, args.kv_mib, args.threads or None)
    log.warning("policy %.1f MB, GenRM %.1f MB, AdamW state %.1f MB per training slot",
                res["policy_mb"], res["genrm_mb"], res["optimizer_mb_per_slot"])
    for key, phases in res["phases_s"].items():
        w = res["wall_s"][key]
        inner = ", ".join(f"{p} {v['mean'] * 1e3:.2f}" for p, v in phases.items())
        log.warning("%-14s wall %7.2f ms (min %.2f, max %.2f) | phases ms: %s", key,
                    w["mean"] * 1e3, w["min"] * 1e3, w["max"] * 1e3, inner)
    r = res["stop_and_respawn_slot_s"]
    log.warning("stop + respawn a slot actor: %.2f ms (min %.2f, max %.2f)",
                r["mean"] * 1e3, r["min"] * 1e3, r["max"] * 1e3)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    log.warning("wrote %s", out)


if __name__ == "__main__":
    main()
