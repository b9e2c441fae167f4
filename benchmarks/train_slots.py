"""Training step time on 1, 2 and 4 device slots of the cluster driver (FSDP2 over gloo).

Four Monarch slots, each capped at ``--cpu_share`` of a core by a cgroup as in a run
(``pivot.cluster.cpu.cgroups``), each holding the training context of the built policy beside a
world-of-one default group (what vLLM leaves in a slot's process; the engines themselves
are left out: idle, they cost no CPU). For each k the training replica shifts up on slots
0..k-1 and runs ``--steps`` GRPO steps through ``ClusterTrainer`` (the driver's port: every
rank gets the batch, trains its rows), after ``--warmup`` unmeasured ones; then it shifts
down. Each step's weights are written back twice, by the run's path (each rank Writes its
own rows where ``FsdpShardLayouts`` applies, as in a run) and by rank 0 after a gather, and
the replica's last shift up is repeated under each Read path, so the two compare within
one run. Writes ``results/local/train_slots.json``.

    .venv/bin/python benchmarks/train_slots.py [--rows 32 128] [--len 96] [--steps 6]
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import statistics
import time
from pathlib import Path

import torch

log = logging.getLogger("bench_train_slots")


class _Control:
    def __init__(self, ctl):
        self.ctl, self.publishes = ctl, 0

    def training_devices(self):
        rid = self.ctl.shifter.training_replica()
        return self.ctl.device_map.replica_devices(rid) if rid else ()


def _batch(rows: int, length: int, vocab: int, seed: int):
    from pivot.rl.batch import TrainBatch

    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(rows, length)
    mask[:, length // 2:] = 1
    return TrainBatch(torch.randint(0, vocab, (rows, length), generator=g), mask,
                      torch.randn(rows, generator=g))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="cache/models/policy")
    ap.add_argument("--rows", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--len", type=int, default=96)
    ap.add_argument("--slots", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--cpu_share", type=float, default=0.5)
    ap.add_argument("--out", default="results/local/train_slots.json")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    from pivot.compat.monarch import ensure_client_tmpdir
    from pivot.gps.actor import GPSActor
    from pivot.gps.layout import ModelMeta, plan_storage
    from pivot.cluster.cpu.cgroups import SlotCpuShares
    from pivot.cluster.control import ClusterTrainer
    from pivot.roles.titan.model import Qwen3Shape
    from pivot.roles.engine.config import read_hf_config, read_hf_weights
    from pivot.runtime.gps_source import FsdpShardLayouts, GPSParameterSource
    from pivot.runtime.mesh import MeshController
    from pivot.runtime.provision import spawn_host_service
    from pivot.testing.trainer import trainer_beside_world_of_one
    from pivot.types import POLICY, Role

    ensure_client_tmpdir(Path("cache/tmp").resolve())
    n = max(a.slots)
    sd = {k: v.float() for k, v in read_hf_weights(a.model).items()}
    metas = {POLICY: ModelMeta.from_state_dict(POLICY, sd)}
    storage = plan_storage(list(metas.values()), 1, 1 << 30)
    gps = spawn_host_service("gps", GPSActor, 0, storage, metas)
    source = GPSParameterSource([gps], metas, storage, (0,) * n)
    source.gps.load(POLICY, sd)
    factory = functools.partial(trainer_beside_world_of_one, a.model, 3e-4, 512, 0, 128)
    kv = int(read_hf_config(a.model)[0]["num_key_value_heads"])
    layouts = FsdpShardLayouts(metas, {POLICY: kv})
    ctl = MeshController.local(n, source, {Role.TRAINING: factory}, layouts=layouts)
    shares = SlotCpuShares(a.cpu_share, name=f"benchtrain{os.getpid()}")
    for d in range(n):
        shares.assign(d, ctl.describe(d)["pid"])
    vocab = Qwen3Shape.from_hf(a.model).vocab_size
    out = {"model": a.model, "len": a.len, "cpu_share": a.cpu_share, "cores": os.cpu_count(),
           "cgroups": shares.available, "results": []}
    version = 0
    try:
        for rows in a.rows:
            for k in a.slots:
                port = ClusterTrainer(ctl, None, _Control(ctl), source, 0)
                devs = tuple(range(k))
                up = ctl.shifter.shift_up(Role.TRAINING, f"training-{rows}-{k}", devs)
                steps, cpu, fetch, write, gathered = [], [], [], [], []
                for i in range(a.warmup + a.steps):
                    m = port.train_batch(_batch(rows, a.len, vocab, i), version)
                    version += 1
                    t = time.perf_counter()
                    ctl.write_back_replica(devs).get()    # the run's path
                    t2 = time.perf_counter()
                    for p in [ctl.write_back_start(d) for d in devs]:   # gather, rank 0
                        p.get()
                    if i >= a.warmup:
                        steps.append(m["trainer/step_s"])
                        cpu.append(m["trainer/thread_cpu_s"])
                        fetch.append(m["trainer/optimizer_fetch_s"])
                        write.append(t2 - t)
                        gathered.append(time.perf_counter() - t2)
                reads = {}
                for name, lay in (("rows", layouts), ("full", None)):
                    ctl.shifter.shift_down(ctl.shifter.training_replica())
                    ctl.layouts = lay
                    again = ctl.shifter.shift_up(Role.TRAINING, f"training-{rows}-{k}-{name}",
                                                 devs)
                    ctx = ctl.describe(devs[0])["contexts"]["training"]
                    reads[name] = {"phases": again.phases, "read": ctx["last_read"],
                                   "bytes_per_rank": ctx["read_bytes"]}
                ctl.layouts = layouts
                ctl.shifter.shift_down(ctl.shifter.training_replica())
                row = {"rows": rows, "slots": k, "step_s": statistics.median(steps),
                       "step_s_min": min(steps), "step_s_max": max(steps),
                       "rank0_cpu_s": statistics.median(cpu),
                       "optimizer_fetch_s": statistics.median(fetch),
                       "write_back_s": statistics.median(write),
                       "write_back_path": "rows" if k > 1 and layouts(Role.TRAINING, devs)
                       else "rank 0",
                       "write_back_gather_rank0_s": statistics.median(gathered),
                       "shift_up_phases": up.phases, "reads": reads}
                out["results"].append(row)
                log.info("rows %d, %d slot(s): step %.3f s (min %.3f, max %.3f), rank-0 CPU "
                         "%.3f s, optimizer fetch %.3f s, write-back %.3f s (%s; gather + "
                         "rank 0: %.3f s), Read per rank %s", rows, k,
                         row["step_s"], row["step_s_min"], row["step_s_max"],
                         row["rank0_cpu_s"], row["optimizer_fetch_s"], row["write_back_s"],
                         row["write_back_path"], row["write_back_gather_rank0_s"],
                         {n: (r["read"], r["bytes_per_rank"]) for n, r in reads.items()})
    finally:
        shares.close()
        ctl.stop()
        source.gps.close()
        gps.close.call_one().get()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    log.info("wrote %s", a.out)


if __name__ == "__main__":
    main()
