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
                      kv_reserve: int = 0, max_seqs: int | None = None) -> float:
    """T of ``load``'s role after adding empty replicas on ``new_devices`` (alg. 4)."""
    state = WhatIfLoad(load, model, kv_reserve, record_actions=False, max_seqs=max_seqs)
    views = [ReplicaView(f"__up{i}", load.role, devs, load.kv_capacity)
             for i, devs in enumerate(new_devices)]
    shift_up_migration(state, views, migrate=migrate)
    return state.aggregate_throughput()


def simulate_shift_down(load: RoleLoad, model: ThroughputModel, replica_ids: Iterable[str],
                        kv_reserve: int = 0, max_seqs: int | None = None) -> float:
    """T of ``load``'s role after evacuating ``replica_ids`` (alg. 3)."""
    state = WhatIfLoad(load, model, kv_reserve, record_actions=False, max_seqs=max_seqs)
    shift_down_migration(state, list(replica_ids))
    return state.aggregate_throughput()


class IncrementalShiftUp:
    """Evaluates the shift-up side of candidates in increasing shift-up count k.

    New replicas of a role are identical and start empty, so the post-shift state depends
    on k only (sec. 7.2). Candidate k + j continues from candidate k's migrated state with
    j more empty replicas, running the same alg. 4 code; this makes evaluating all K
    candidates cost about one migration to K replicas instead of K of them. The warm start
    can settle in a slightly different local optimum than a cold alg. 4 run (within 1% in
    tests/planner/test_evaluate.py); the executor's real migration is always cold.

    The what-if state builds no actions and keeps alg. 4's shortest-sequence heaps from
    one candidate to the next (``WhatIfLoad.shortest_heaps``, or its array pool for the
    compiled loop of ``pivot.scheduler.kernels``), so a step costs about its own moves;
    tests/planner/test_evaluate_reference.py checks that every step's throughput is
    bit-identical to the real scheduler running the same migrations.
    """

    def __init__(self, load: RoleLoad, model: ThroughputModel, migrate: bool = True,
                 kv_reserve: int = 0, max_seqs: int | None = None) -> None:
        self._load, self._model, self._migrate = load, model, migrate
        self._state = WhatIfLoad(load, model, kv_reserve, record_actions=False,
                                 max_seqs=max_seqs)
        self._k = 0

    def throughput_with(self, new_devices: Sequence[tuple[int, ...]]) -> float:
        """T of the role with one new replica on each of ``new_devices``."""
        return self._extend(len(new_devices), lambda i: new_devices[i])

    def throughput_with_count(self, k: int) -> float:
        """``throughput_with`` for ``k`` new replicas: they are identical and empty, so
        their devices do not enter the model; the planner names them only for the plan
        it picks."""
        return self._extend(k, lambda i: ())

    def _extend(self, k: int, devices) -> float:
        if k < self._k:
            raise ValueError("candidates must be evaluated in increasing k")
        views = [ReplicaView(f"__up{i}", self._load.role, devices(i), self._load.kv_capacity)
                 for i in range(self._k, k)]
        if views:
            shift_up_migration(self._state, views, migrate=self._migrate)
        self._k = k
        return self._state.aggregate_throughput()


class IncrementalShiftDown:
    """Evaluates the shift-down side of candidates; when a candidate's donors contain the
    previous candidate's (the usual case, as pairs are taken cheapest first), it evacuates
    only the extra donors, otherwise it restarts from the snapshot. Evacuating in steps
    dispatches in a slightly different order than evacuating the union at once (within 1%
    in tests)."""

    def __init__(self, load: RoleLoad, model: ThroughputModel, kv_reserve: int = 0,
                 max_seqs: int | None = None) -> None:
        self._load, self._model, self._reserve, self._cap = load, model, kv_reserve, max_seqs
        self._state: WhatIfLoad | None = None
        self._done: set[str] = set()

    def throughput_without(self, replica_ids: Iterable[str]) -> float:
        ids = list(replica_ids)
        if self._state is None or not self._done.issubset(ids):
            self._state = WhatIfLoad(self._load, self._model, self._reserve,
                                     record_actions=False, max_seqs=self._cap)
            self._done = set()
        extra = [r for r in ids if r not in self._done]
        if extra:
            shift_down_migration(self._state, extra)
            self._done.update(extra)
        return self._state.aggregate_throughput()
