"""A synthetic workload snapshot for planner tests (tests and benchmarks only; see
``pivot.testing``): module-level values, so hypothesis strategies can build on them."""

from __future__ import annotations

import random

from pivot.scheduler import ThroughputModel
from pivot.types import ReplicaView, Role, RoleLoad, TrainingLoad, WorkloadSnapshot

MODEL = ThroughputModel(A=2e-6, B=0.02, C=4e-4, D=0.005)
"""The throughput model of both inference roles in ``make_snapshot``'s workload."""


def fill(view: ReplicaView, lengths, start_id: int) -> int:
    """Runs sequences of ``lengths`` tokens on ``view``, ids from ``start_id``; returns the
    next free id."""
    for length in lengths:
        view.running[start_id] = length
        view.num_tokens += length
        start_id += 1
    return start_id


def make_snapshot(ro_busy=3, rm_seqs=60, waiting=100, training_devices=True, seed=0,
                  batch_ready=False) -> WorkloadSnapshot:
    """32 devices on 4 hosts: 8 one-device rollout replicas, 4 four-device reward
    replicas, and 8 devices held by a training that finished its step.

    Args:
        ro_busy: rollout replicas running 5 sequences each (the rest are empty).
        rm_seqs: sequences per reward replica (fewer if its KV cache is full).
        waiting: reward sequences in the queue.
        training_devices: training holds devices 24-31 (else they are idle).
        seed: the sequence lengths' seed.
        batch_ready: training's next batch is ready.
    """
    rng = random.Random(seed)
    ro = [ReplicaView(f"ro{i}", Role.ROLLOUT, (i,), 200_000) for i in range(8)]
    sid = 0
    for r in ro[:ro_busy]:
        sid = fill(r, [rng.randint(500, 3000) for _ in range(5)], sid)
    rm = [ReplicaView(f"rm{i}", Role.REWARD, tuple(range(8 + 4 * i, 12 + 4 * i)), 400_000)
          for i in range(4)]
    for r in rm:
        for _ in range(rm_seqs):
            length = rng.randint(1000, 5000)
            if r.num_tokens + length > r.kv_capacity:
                break
            sid = fill(r, [length], sid)
    wait = [(sid + i, 3000) for i in range(waiting)]
    tr = TrainingLoad(8, tuple(range(24, 32)) if training_devices else (),
                      batch_ready=batch_ready)
    idle = () if training_devices else tuple(range(24, 32))
    return WorkloadSnapshot(
        0.0, RoleLoad(Role.ROLLOUT, ro, [], 1, 200_000, 32, tau_shift=1.0),
        RoleLoad(Role.REWARD, rm, wait, 4, 400_000, 8, tau_shift=1.0), tr,
        tuple(d // 8 for d in range(32)), idle_devices=idle)
