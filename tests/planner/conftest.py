import random

import pytest

from pivot.scheduler import ThroughputModel
from pivot.types import ReplicaView, Role, RoleLoad, TrainingLoad, WorkloadSnapshot

MODEL = ThroughputModel(A=2e-6, B=0.02, C=4e-4, D=0.005)


def fill(view: ReplicaView, lengths, start_id: int) -> int:
    for length in lengths:
        view.running[start_id] = length
        view.num_tokens += length
        start_id += 1
    return start_id


def make_snapshot(ro_busy=3, rm_seqs=60, waiting=100, training_devices=True, seed=0,
                  batch_ready=False):
    """32 devices on 4 hosts: 8 one-device rollout replicas, 4 four-device reward
    replicas, and 8 devices held by a training that finished its step."""
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


@pytest.fixture
def snapshot():
    return make_snapshot()
