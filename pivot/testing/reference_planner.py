"""The PivotRL planner's candidate construction and evaluation as they were before the
incremental rewrite (verbatim; tests only, see ``pivot.testing``): alg. 1 copying a plan
tuple per transition, and a what-if load that rebuilds its arrays on every shift up or
down. The fast versions in ``pivot.planner`` and ``pivot.scheduler.load`` must match them
bit for bit (tests/planner/test_incremental_reference.py)."""

from __future__ import annotations

import heapq
import time
from typing import Iterable, Mapping, Sequence

import numpy as np

from pivot.errors import StateError
from pivot.planner.evaluate import overall_throughput
from pivot.planner.pivot_planner import PivotPlanner, _keep_replicas
from pivot.planner.shift_pairs import ShiftPair, prepare_shift_pairs, role_throughput
from pivot.scheduler.actions import Abort, Action, Dispatch
from pivot.scheduler.load import LoadArrays
from pivot.scheduler.migration import shift_down_migration, shift_up_migration
from pivot.scheduler.throughput import ThroughputModel
from pivot.types import ReplicaView, Role, RoleLoad, ShiftPlan, WorkloadSnapshot

Choice = tuple[tuple[int, int], ...]


class ReferenceWhatIfLoad(LoadArrays):
    """A role's load reduced to sequence lengths, for the planner's migration simulation.

    Waiting sequences keep their queue order (``RoleLoad.waiting`` is in priority order);
    an aborted sequence re-enters the queue ordered by its sequence id, which matches the
    default priority.

    Unlike the real scheduler it keeps alg. 4's per-replica shortest-sequence heaps between
    migrations (``shortest_heaps``), so the planner's incremental shift up (one more replica
    per candidate) does not rebuild a heap for every replica it takes a sequence from.

    Args:
        record_actions: False for the planner, which only reads throughputs: the
            operations then return empty action lists instead of building them.
    """

    def __init__(self, load: RoleLoad, model: ThroughputModel, kv_reserve: int = 0,
                 record_actions: bool = True) -> None:
        super().__init__(model, kv_reserve)
        self.record_actions = record_actions
        self._base: list[Mapping[int, int]] = [r.running for r in load.replicas]
        self._own: dict[int, dict[int, int]] = {}
        self._heaps: dict[int, list[tuple[int, int]]] = {}
        self._set_arrays([r.replica_id for r in load.replicas],
                         [r.num_seqs for r in load.replicas],
                         [r.num_tokens for r in load.replicas],
                         [r.kv_capacity for r in load.replicas])
        # (key, seq id, length); waiting keys keep the snapshot's order ahead of ties.
        self._queue: list[tuple[tuple[int, int], int, int]] = [
            ((sid, k), sid, length) for k, (sid, length) in enumerate(load.waiting)]
        heapq.heapify(self._queue)

    def running(self, i: int) -> Mapping[int, int]:
        return self._own.get(i, self._base[i])

    def _mut(self, i: int) -> dict[int, int]:
        if i not in self._own:
            self._own[i] = dict(self._base[i])
        return self._own[i]

    def shortest_heaps(self) -> dict[int, list[tuple[int, int]]]:
        """The heaps persist: a heap's top is the minimum (length, id) of its replica's
        running set whatever history built it, so reusing one changes no choice of alg. 4.
        ``dispatch``, ``abort`` and ``_remove_replicas`` keep them in step; ``move`` does
        not, its one caller (alg. 4) updates them for its own moves."""
        return self._heaps

    def queue_size(self) -> int:
        return len(self._queue)

    def add_replicas(self, views: Iterable[ReplicaView]) -> None:
        views = list(views)
        for v in views:
            if v.replica_id in self._index:
                raise StateError(f"replica {v.replica_id} is already active")
        self._base.extend(v.running for v in views)
        self._ids = self._ids + [v.replica_id for v in views]
        for k, v in enumerate(views, start=len(self._ids) - len(views)):
            self._index[v.replica_id] = k
        def grow(a, xs):
            return np.concatenate([a, np.array(xs, dtype=float)])
        self._nseq = grow(self._nseq, [v.num_seqs for v in views])
        self._ntok = grow(self._ntok, [v.num_tokens for v in views])
        self._cap = grow(self._cap, [v.kv_capacity for v in views])
        self._derive()

    def _remove_replicas(self, replica_ids: Iterable[str]) -> None:
        drop = {self._index[r] for r in replica_ids}
        keep = [i for i in range(len(self._ids)) if i not in drop]
        for i in drop:
            if self.running(i):
                raise StateError(f"replica {self._ids[i]} still runs sequences")
        new_index = {old: new for new, old in enumerate(keep)}
        own, base = self._own, self._base
        self._base = [own[i] if i in own else base[i] for i in keep]
        self._own = {}
        self._heaps = {new_index[i]: h for i, h in self._heaps.items() if i in new_index}
        self._ids = [self._ids[i] for i in keep]
        self._index = {rid: i for i, rid in enumerate(self._ids)}
        k = np.array(keep, dtype=int)
        for name in ("_nseq", "_ntok", "_cap", "_free", "_tput", "_num", "_den"):
            setattr(self, name, getattr(self, name)[k])

    def abort(self, replica_id: str, which: str | int = "all") -> list[Abort]:
        i = self._index[replica_id]
        self._heaps.pop(i, None)
        record = self.record_actions
        if which == "all":
            run = self.running(i)
            for sid, length in run.items():
                heapq.heappush(self._queue, ((sid, -1), sid, length))
            out = [Abort(sid, replica_id) for sid in run] if record else []
            self._own[i] = {}
            self._adjust(i, -len(run), -sum(run.values()))
            return out
        run = self._mut(i)
        if which == "shortest":
            targets = [min(run, key=lambda s: (run[s], s))] if run else []
        else:
            targets = [int(which)]
        out = []
        for sid in targets:
            length = run.pop(sid)
            self._adjust(i, -1, -length)
            heapq.heappush(self._queue, ((sid, -1), sid, length))
            if record:
                out.append(Abort(sid, replica_id))
        return out

    def dispatch(self, replica_ids: Iterable[str] | None = None) -> list[Dispatch]:
        mask = self.mask_of(replica_ids)
        out = []
        queue, heaps, own, record = self._queue, self._heaps, self._own, self.record_actions
        while queue:
            _, sid, length = queue[0]
            i = self.best_replica(length, mask)
            if i is None:
                break
            heapq.heappop(queue)
            run = own.get(i)
            if run is None:
                run = own[i] = dict(self._base[i])  # _mut, inlined
            run[sid] = length
            self._adjust(i, 1, length)
            h = heaps.get(i)
            if h is not None:
                heapq.heappush(h, (length, sid))
            if record:
                out.append(Dispatch(sid, self._ids[i]))
        return out

    def move(self, seq_id: int, src: int, dst: int) -> list[Action]:
        length = self._mut(src).pop(seq_id)
        self._adjust(src, -1, -length)
        self._mut(dst)[seq_id] = length
        self._adjust(dst, 1, length)
        return self._moved(seq_id, src, dst)

    def move_taken(self, seq_id: int, src: int, dst: int, length: int) -> list[Action]:
        """``move`` when the arrays already count ``length`` off ``src`` (see LoadArrays)."""
        del self._mut(src)[seq_id]
        self._mut(dst)[seq_id] = length
        self._adjust(dst, 1, length)
        return self._moved(seq_id, src, dst)

    def _moved(self, seq_id: int, src: int, dst: int) -> list[Action]:
        if not self.record_actions:
            return []
        return [Abort(seq_id, self._ids[src]), Dispatch(seq_id, self._ids[dst], resume=True)]


def reference_construct_candidates(pairs: Sequence[ShiftPair],
                                   K: int) -> dict[int, tuple[float, Choice]]:
    """Alg. 1. Returns {k: (D[k], C[k])} for every reachable 1 <= k <= K.

    O(K * sum r_i) transitions, i.e. O(K I) (app. D.3).
    """
    inf = float("inf")
    D = [0.0] + [inf] * K
    C: list[Choice] = [()] * (K + 1)
    for i, pair in enumerate(pairs):
        D_hat, C_hat = list(D), list(C)
        for j in range(K + 1):
            if D[j] == inf:
                continue
            d = D[j] + pair.penalty
            for e in range(1, min(pair.r, K - j) + 1):
                if d <= D_hat[j + e]:
                    D_hat[j + e] = d
                    C_hat[j + e] = C[j] + ((i, e),)
        D, C = D_hat, C_hat
    return {k: (D[k], C[k]) for k in range(1, K + 1) if D[k] < inf}


class ReferenceIncrementalShiftUp:
    """Evaluates the shift-up side of candidates in increasing shift-up count k.

    New replicas of a role are identical and start empty, so the post-shift state depends
    on k only (sec. 7.2). Candidate k + j continues from candidate k's migrated state with
    j more empty replicas, running the same alg. 4 code; this makes evaluating all K
    candidates cost about one migration to K replicas instead of K of them. The warm start
    can settle in a slightly different local optimum than a cold alg. 4 run (within 1% in
    tests/planner/test_evaluate.py); the executor's real migration is always cold.

    The what-if state builds no actions and keeps alg. 4's shortest-sequence heaps from
    one candidate to the next (``WhatIfLoad.shortest_heaps``), so a step costs about its
    own moves; tests/planner/test_evaluate_reference.py checks that every step's
    throughput is bit-identical to the real scheduler running the same migrations.
    """

    def __init__(self, load: RoleLoad, model: ThroughputModel, migrate: bool = True,
                 kv_reserve: int = 0) -> None:
        self._load, self._model, self._migrate = load, model, migrate
        self._state = ReferenceWhatIfLoad(load, model, kv_reserve, record_actions=False)
        self._k = 0

    def throughput_with(self, new_devices: Sequence[tuple[int, ...]]) -> float:
        k = len(new_devices)
        if k < self._k:
            raise ValueError("candidates must be evaluated in increasing k")
        views = [ReplicaView(f"__up{i}", self._load.role, devs, self._load.kv_capacity)
                 for i, devs in enumerate(new_devices[self._k:], start=self._k)]
        if views:
            shift_up_migration(self._state, views, migrate=self._migrate)
        self._k = k
        return self._state.aggregate_throughput()


class ReferenceIncrementalShiftDown:
    """Evaluates the shift-down side of candidates; when a candidate's donors contain the
    previous candidate's (the usual case, as pairs are taken cheapest first), it evacuates
    only the extra donors, otherwise it restarts from the snapshot. Evacuating in steps
    dispatches in a slightly different order than evacuating the union at once (within 1%
    in tests)."""

    def __init__(self, load: RoleLoad, model: ThroughputModel, kv_reserve: int = 0) -> None:
        self._load, self._model, self._reserve = load, model, kv_reserve
        self._state: ReferenceWhatIfLoad | None = None
        self._done: set[str] = set()

    def throughput_without(self, replica_ids: Iterable[str]) -> float:
        ids = list(replica_ids)
        if self._state is None or not self._done.issubset(ids):
            self._state = ReferenceWhatIfLoad(self._load, self._model, self._reserve,
                                              record_actions=False)
            self._done = set()
        extra = [r for r in ids if r not in self._done]
        if extra:
            shift_down_migration(self._state, extra)
            self._done.update(extra)
        return self._state.aggregate_throughput()


class ReferencePivotPlanner(PivotPlanner):
    """``PivotPlanner`` with the former candidate construction and evaluation."""

    def _plan_inference(self, snap: WorkloadSnapshot, up: Role, t0: float,
                        idle_only: bool = False) -> ShiftPlan | None:
        up_load = snap.role_load(up)
        other = Role.REWARD if up is Role.ROLLOUT else Role.ROLLOUT
        down_load = snap.role_load(other)
        pairs = prepare_shift_pairs(snap, up, self.models)
        if idle_only:
            pairs = [p for p in pairs if all(d.role is None for d in p.down)]
        if self.min_replicas:
            pairs = _keep_replicas(pairs, other, len(down_load.replicas) - self.min_replicas)
        K = min(up_load.max_replicas - len(up_load.replicas), sum(p.r for p in pairs))
        t1 = time.perf_counter()
        cands = reference_construct_candidates(pairs, K) if K > 0 else {}
        t2 = time.perf_counter()

        n = {Role.ROLLOUT: snap.rollout.num_seqs, Role.REWARD: snap.reward.num_seqs}
        t_now = {r: role_throughput(snap.role_load(r), self.models[r]) for r in n}
        t_cur = overall_throughput(n[Role.ROLLOUT], t_now[Role.ROLLOUT],
                                   n[Role.REWARD], t_now[Role.REWARD])
        best: ShiftPlan | None = None
        up_sim = ReferenceIncrementalShiftUp(up_load, self.models[up], self.migrate)
        down_sim = ReferenceIncrementalShiftDown(down_load, self.models[other])
        for k in sorted(cands):
            phi, choice = cands[k]
            down, up_devs = self._assemble(pairs, choice)
            t_after = dict(t_now)
            t_after[up] = up_sim.throughput_with(up_devs)
            donors = [d.replica_id for d in down if d.role is other]
            if donors:
                t_after[other] = down_sim.throughput_without(donors)
            t_cand = overall_throughput(n[Role.ROLLOUT], t_after[Role.ROLLOUT],
                                        n[Role.REWARD], t_after[Role.REWARD])
            gain = self.H * (t_cand - t_cur)
            benefit = gain - phi
            if benefit > 0 and (best is None or benefit > best.benefit):
                best = ShiftPlan(up, down, up_devs, penalty=phi, gain=gain, benefit=benefit,
                                 t_current=t_cur, t_candidate=t_cand,
                                 reason=f"{up.value} +{k} replicas, {len(donors)} "
                                        f"{other.value} replicas down")
        t3 = time.perf_counter()
        self.last_timings = {"preprocess": t1 - t0, "construct": t2 - t1, "simulate": t3 - t2}
        if best is not None:
            best.timings.update(self.last_timings)
        return best
