"""Step 4 of the planner: candidate benefit evaluation (sec. 7.3).

Each candidate's post-shift throughput comes from replaying shift-time migration (alg. 3
and 4) with the scheduler's own code on a ``WhatIfLoad`` of each affected role; the
overall throughput is eq. 1's weighted harmonic mean and the benefit is
B = H * (T_candidate - T_current) - phi.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from pivot.scheduler.load import WhatIfLoad
from pivot.scheduler.migration import shift_down_migration, shift_up_migration
from pivot.scheduler.throughput import ThroughputModel
from pivot.types import ReplicaView, RoleLoad


def overall_throughput(n_rollout: int, t_rollout: float, n_reward: int,
                       t_reward: float) -> float:
    """Eq. 1: T = (N_ro + N_rm) / (N_ro / T_ro + N_rm / T_rm).

    A role with sequences but no throughput makes T zero (its latency is unbounded); a
    role with no sequences drops out of the mean. With no sequences at all T is 0.
    """
    n = n_rollout + n_reward
    if n == 0:
        return 0.0
    denom = 0.0
    for ni, ti in ((n_rollout, t_rollout), (n_reward, t_reward)):
        if ni:
            if ti <= 0:
                return 0.0
            denom += ni / ti
    return n / denom


def simulate_shift_up(load: RoleLoad, model: ThroughputModel,
                      new_devices: Sequence[tuple[int, ...]], migrate: bool = True,
                      kv_reserve: int = 0) -> float:
    """T of ``load``'s role after adding empty replicas on ``new_devices`` (alg. 4)."""
    state = WhatIfLoad(load, model, kv_reserve)
    views = [ReplicaView(f"__up{i}", load.role, devs, load.kv_capacity)
             for i, devs in enumerate(new_devices)]
    shift_up_migration(state, views, migrate=migrate)
    return state.aggregate_throughput()


def simulate_shift_down(load: RoleLoad, model: ThroughputModel, replica_ids: Iterable[str],
                        kv_reserve: int = 0) -> float:
    """T of ``load``'s role after evacuating ``replica_ids`` (alg. 3)."""
    state = WhatIfLoad(load, model, kv_reserve)
    shift_down_migration(state, list(replica_ids))
    return state.aggregate_throughput()
