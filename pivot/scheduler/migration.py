"""Shift-time sequence migration: alg. 3 (shift down) and alg. 4 (shift up), app. C.1.

Both reduce to the two operations of alg. 2, Abort and Dispatch. They run on any
``LoadArrays`` backend: the real ``ShiftAwareScheduler``, and the planner's ``WhatIfLoad``
(sec. 7.3), so the planner simulates migration with exactly this code.
"""

from __future__ import annotations

import heapq
import itertools

import numpy as np

from pivot.errors import StateError
from pivot.scheduler import kernels
from pivot.scheduler.actions import Abort, Action, Dispatch
from pivot.scheduler.load import LoadArrays, WhatIfLoad
from pivot.types import ReplicaView


def shift_down_migration(sched: LoadArrays, down: list[str]) -> list[Action]:
    """Alg. 3: Abort(r, All, Q) for every shift-down replica, then Dispatch(Q, R').

    The replicas in ``down`` leave the active set; their sequences keep their generated
    tokens and resume elsewhere after a re-prefill (or wait in the queue).
    """
    if len(set(down)) != len(down):
        raise StateError(f"shift down lists a replica twice: {down}")
    actions: list[Action] = []
    for rid in down:
        actions.extend(sched.abort(rid, "all"))
    sched._remove_replicas(down)
    actions.extend(sched.dispatch())
    return actions


def shift_up_migration(sched: LoadArrays, up: list[ReplicaView],
                       migrate: bool = True) -> list[Action]:
    """Alg. 4: Dispatch(Q, R_up), then migrate the shortest sequence of the replica with
    the highest modeled throughput while the aggregate throughput improves.

    One refinement over the pseudocode: each migration is evaluated before it is carried
    out (the destination is the one Dispatch would pick), so the final, non-improving move
    of alg. 4 is never executed; the modeled aggregate throughput therefore never drops and
    no sequence pays a re-prefill for nothing. The heap is keyed by current throughput and
    refreshed for both ends of a move (alg. 4 refreshes only the source). A sequence that
    moves twice is reported as one Abort at its first replica and one Dispatch at its last.

    Args:
        up: the new replicas; they must be empty.
        migrate: False gives the "+ throughput model" ablation (no migration loop).
    """
    for v in up:
        if v.running or v.num_tokens:
            raise StateError(f"shift-up replica {v.replica_id} must start empty")
    sched.add_replicas(up)
    actions: list[Action] = list(sched.dispatch([v.replica_id for v in up]))
    if not migrate or sched.queue_size():
        # Sequences still wait: every replica is full for the queue's head, so moving a
        # running sequence cannot help.
        return actions

    model = sched.model
    ids = sched._ids
    nseq, ntok, tput = sched._nseq, sched._ntok, sched._tput  # updated in place below
    record = sched.record_actions
    # Per-replica min-heaps of (length, sequence id), built on first use (or kept by the
    # backend from an earlier migration); only the moves below change the running sets
    # while the loop runs, and the loop keeps the heaps in step with them.
    shortest = sched.shortest_heaps()
    origin: dict[int, str] = {}  # first replica a migrated sequence left
    final: dict[int, str] = {}   # where it ends up
    if isinstance(sched, WhatIfLoad) and sched._plain_model and sched.max_seqs is None \
            and not record:
        _migrate_compiled(sched)
        return actions
    version = [0] * len(ids)
    heap = list(zip((-tput).tolist(), itertools.repeat(0), range(len(ids))))
    heapq.heapify(heap)
    for _ in range(int(nseq.sum())):
        while heap and heap[0][1] != version[heap[0][2]]:
            heapq.heappop(heap)
        if not heap:
            break
        neg_t, _, src = heap[0]
        heap_src = shortest.get(src)
        if heap_src is None:
            heap_src = shortest[src] = [(ln, s) for s, ln in sched.running(src).items()]
            heapq.heapify(heap_src)
        if not heap_src:
            break
        length, sid = heap_src[0]
        # Tentatively take it off, pick the destination Dispatch would choose.
        t_src = tput.item(src)
        sched._adjust(src, -1, -length)
        t_src_after = tput.item(src)
        dst = sched.best_replica(length)
        if dst is None or dst == src:
            sched._adjust(src, 1, length)
            break
        t_dst = tput.item(dst)
        t_dst_after = model.throughput(int(nseq.item(dst)) + 1, int(ntok.item(dst)) + length)
        delta = t_src_after - t_src + t_dst_after - t_dst
        if delta <= 0:
            sched._adjust(src, 1, length)
            break
        sched.move_taken(sid, src, dst, length)  # src already counts the sequence off
        heapq.heappop(heap_src)
        if dst in shortest:
            heapq.heappush(shortest[dst], (length, sid))
        if record:
            origin.setdefault(sid, ids[src])
            final[sid] = ids[dst]
        for i in (src, dst):
            version[i] += 1
            heapq.heappush(heap, (-tput.item(i), version[i], i))
    # A sequence may move more than once; the driver sees one abort and one dispatch.
    # Every abort before every dispatch: a driver applies a run of one kind as one round
    # over the replicas, so the moves cost two rounds, not two per sequence.
    moved = [sid for sid, src_id in origin.items() if final[sid] != src_id]
    actions.extend(Abort(sid, origin[sid]) for sid in moved)
    actions.extend(Dispatch(sid, final[sid], resume=True) for sid in moved)
    return actions


def _migrate_compiled(sched: WhatIfLoad) -> None:
    """Alg. 4's migration loop of ``shift_up_migration`` for the planner's what-if load
    under the plain throughput model (no batch cap, no actions), the planner's hottest
    loop, run by ``kernels.migrate_plain``: the same choices, float operations and order
    as the loop above (tests/planner/test_incremental_reference.py), on array heaps
    (``WhatIfLoad._pool``) instead of per-replica lists. The sequence maps follow the
    moves it logs, in order, when next read (``WhatIfLoad.log_moves``)."""
    R = len(sched._ids)
    if sched._pool is None:
        sched._pool = kernels.HeapPool([sched.running(i) for i in range(R)])
        sched._heaps.clear()  # the pool holds them from now on
    pool = sched._pool
    m = sched.model
    budget = int(sched._nseq.sum())
    ht = np.empty(R + 2 * budget + 1)
    hv = np.zeros(R + 2 * budget + 1, dtype=np.int64)
    hi = np.empty(R + 2 * budget + 1, dtype=np.int64)
    ht[:R] = -sched._tput
    hi[:R] = np.arange(R)
    kernels.heapify(ht, hv, hi, R)
    version = np.zeros(R, dtype=np.int64)
    st = np.array([R, budget, 0, 0, 0], dtype=np.int64)
    log = np.empty((budget, 3), dtype=np.int64)
    while True:
        kernels.migrate_plain(m.A, m.B, m.C, m.D, sched.kv_reserve, sched._nseq,
                              sched._ntok, sched._cap, sched._free, sched._tput, sched._num,
                              sched._den, pool.keys, pool.off, pool.size, pool.capy,
                              ht, hv, hi, version, st, log)
        if st[3] != 1:
            break
        pool.grow(int(st[4]))
    sched.log_moves(log[:st[2]])
