"""Per-replica load arrays and the dispatch rule shared by every scheduling backend.

Two backends implement the same operations, so the migration algorithms of
``pivot.scheduler.migration`` run unchanged on both:

- ``ShiftAwareScheduler``: the real scheduler, with ``SequenceState`` objects;
- ``WhatIfLoad``: the planner's scratch copy of a role's load (sec. 7.3), built from a
  ``RoleLoad`` snapshot in O(replicas): per-replica sequence maps are shared with the
  snapshot and copied only when a migration touches them, so evaluating many candidate
  plans stays cheap at 1024 devices. Replicas are added and retired in place (O(changed)),
  and its two hot loops, re-dispatch (alg. 3) and alg. 4's moves, run compiled
  (``pivot.scheduler.kernels``) with the same float operations.
"""

from __future__ import annotations

import heapq
from typing import Iterable, Mapping

import numpy as np

from pivot.errors import StateError
from pivot.scheduler import kernels
from pivot.scheduler.actions import Abort, Action, Dispatch
from pivot.scheduler.throughput import ThroughputModel
from pivot.scheduler.whatif_queue import WhatIfQueue
from pivot.types import ReplicaView, RoleLoad


class LoadArrays:
    """N_seq, N_tok and KV capacity of the active replicas as arrays, plus Dispatch's
    choice of replica (sec. 6.1): the eligible one with the largest gain Delta T_i."""

    def __init__(self, model: ThroughputModel, kv_reserve: int = 0,
                 max_seqs: int | None = None) -> None:
        self.model = model
        self.kv_reserve = kv_reserve
        self.max_seqs = max_seqs
        """Per-replica batch cap (the engine's ``max_num_seqs``): a replica at the cap is
        not eligible, so sequences wait in the shared queue, not in an engine's own."""
        self._ids: list[str] = []
        self._index: dict[str, int] = {}
        self._nseq = np.zeros(0)
        self._ntok = np.zeros(0)
        self._cap = np.zeros(0)
        # The scalar throughput of the base model is inlined in ``_adjust``; subclasses
        # (the ablation's binary model, test doubles) keep their own.
        self._plain_model = type(model).throughput is ThroughputModel.throughput

    record_actions = True
    """False in the planner's scratch copies: their callers only read throughputs, so
    dispatch, abort and move skip building ``Action`` objects and return empty lists."""

    def shortest_heaps(self) -> dict[int, list[tuple[int, int]]]:
        """Per-replica min-heaps of (length, sequence id) for alg. 4's "shortest sequence"
        choice, keyed by replica index. This backend keeps none between calls: alg. 4 builds
        them lazily from ``running`` and keeps them in step with its own moves."""
        return {}

    def _set_arrays(self, ids: list[str], nseq: list[int], ntok: list[int],
                    cap: list[int]) -> None:
        self._ids = ids
        self._index = {rid: i for i, rid in enumerate(ids)}
        self._nseq = np.array(nseq, dtype=float)
        self._ntok = np.array(ntok, dtype=float)
        self._cap = np.array(cap, dtype=float)
        self._derive()

    def _derive(self) -> None:
        """Free KV, T_i and the ``after_terms`` of every replica from N_seq and N_tok."""
        self._free = self._cap - self._ntok
        self._tput = self.model.throughputs(self._nseq, self._ntok)
        self._num, self._den = self.model.after_terms(self._nseq, self._ntok)

    def _adjust(self, i: int, dseq: int, dtok: int) -> None:
        """The one place a replica's load changes; keeps free KV, T_i and the
        ``after_terms`` in step. It is on the planner's hot path, so it works on Python
        floats (numpy scalars are slow) and spells ``max(B, C N)`` as a conditional; the
        operations are the model's own, so the values are bit-identical to them."""
        n = self._nseq.item(i) + dseq
        t = self._ntok.item(i) + dtok
        self._nseq[i] = n
        self._ntok[i] = t
        self._free[i] = self._cap.item(i) - t
        m = self.model
        A, B, C, D = m.A, m.B, m.C, m.D
        if self._plain_model:
            # ThroughputModel.throughput (sec. 6.1): T_i = N / (A N_tok + max(B, C N) + D).
            cn = C * n
            self._tput[i] = n / (A * t + (cn if cn > B else B) + D) if n > 0 else 0.0
        else:
            self._tput[i] = m.throughput(int(n), int(t))
        # after_terms: N + 1 and A N_tok + max(B, C (N + 1)) + D.
        self._num[i] = n + 1.0
        cn = C * (n + 1.0)
        self._den[i] = A * t + (cn if cn > B else B) + D

    def move_taken(self, seq_id: int, src: int, dst: int, length: int) -> list[Action]:
        """``move`` for alg. 4's loop, which has already taken the sequence's ``length``
        off ``src`` in the load arrays (``_adjust(src, -1, -length)``) to evaluate the
        move. This backend undoes that and moves; ``WhatIfLoad`` skips the round trip."""
        self._adjust(src, 1, length)
        return self.move(seq_id, src, dst)

    def mask_of(self, replica_ids: Iterable[str] | None) -> np.ndarray | None:
        if replica_ids is None:
            return None
        mask = np.zeros(len(self._ids), dtype=bool)
        for rid in replica_ids:
            if rid not in self._index:
                raise StateError(f"unknown replica {rid!r}")
            mask[self._index[rid]] = True
        return mask

    def best_replica(self, length: int, mask: np.ndarray | None = None) -> int | None:
        """Index of the eligible replica with the largest gain, or None if none has room.

        Ties go to the lowest index (``argmax``). Usually the unrestricted argmax is
        eligible, and then it is also the first maximum among the eligible replicas, so the
        eligibility arrays are only built when it is not.
        """
        if not self._ids:
            return None
        gains = self.model.gains_from_terms(self._num, self._den, length, self._tput,
                                            self._ntok)
        i = int(gains.argmax())
        if not (self._free[i] < length + self.kv_reserve
                or (self.max_seqs is not None and self._nseq[i] >= self.max_seqs)
                or (mask is not None and not mask[i])):
            return i
        full = self._free < length + self.kv_reserve
        if self.max_seqs is not None:
            full |= self._nseq >= self.max_seqs
        if mask is not None:
            full |= ~mask
        gains[full] = -np.inf
        i = int(gains.argmax())
        return None if full[i] else i

    def throughput_at(self, i: int) -> float:
        return float(self._tput[i])

    def replica_throughput(self, replica_id: str) -> float:
        return self.throughput_at(self._index[replica_id])

    def aggregate_throughput(self) -> float:
        """Sum of the modeled T_i over active replicas (EvaluateThroughput of alg. 4)."""
        return float(self._tput.sum())

    @property
    def replica_ids(self) -> list[str]:
        return list(self._ids)


class WhatIfLoad(LoadArrays):
    """A role's load reduced to sequence lengths, for the planner's migration simulation.

    Waiting sequences leave by sequence id, the default priority's order, and an aborted
    sequence re-enters the queue at its id (``pivot.scheduler.whatif_queue``, which reads
    the snapshot's queue only as far as it is consumed).

    Unlike the real scheduler it keeps alg. 4's per-replica shortest-sequence heaps between
    migrations (``shortest_heaps``), so the planner's incremental shift up (one more replica
    per candidate) does not rebuild a heap for every replica it takes a sequence from.

    Args:
        kv_reserve / max_seqs: the dispatch rule (``LoadArrays``); the planner passes
            the real scheduler's (``RoleLoad.kv_reserve`` / ``max_seqs``) when it models
            it (``PivotPlanner.scheduler_rule``), else none.
        record_actions: False for the planner, which only reads throughputs: the
            operations then return empty action lists instead of building them.
    """

    def __init__(self, load: RoleLoad, model: ThroughputModel, kv_reserve: int = 0,
                 record_actions: bool = True, max_seqs: int | None = None) -> None:
        super().__init__(model, kv_reserve, max_seqs)
        self.record_actions = record_actions
        self._base: list[Mapping[int, int]] = [r.running for r in load.replicas]
        self._own: dict[int, dict[int, int]] = {}
        self._pending: list[tuple[np.ndarray, ...]] = []
        """Placements (``_dispatch_plain``) and moves (``_migrate_compiled``) not yet
        written to the sequence maps, in order: (replica, seq id, length) of each placed
        sequence, or (rows of (length << 32 | seq id, source, destination),); arrays, so
        that keeping them leaves nothing for the garbage collector to walk. The planner's
        shift-up evaluation only reads the load arrays and the heap pool, so the maps are
        brought up to date (``_flush``, the same dict operations in the same order) only
        when something reads or changes them."""
        self._heaps: dict[int, list[tuple[int, int]]] = {}
        self._alive: np.ndarray | None = None
        """Live replicas, once one was removed (``_remove_replicas``)."""
        self._pool: kernels.HeapPool | None = None
        """The shortest-sequence heaps of every replica in array form, for the compiled
        alg. 4 loop (``migration._migrate_compiled``): built on its first use, kept in
        step by dispatches and by the loop itself, dropped by anything else that changes
        a running set (it is rebuilt from them when next needed)."""
        self._set_arrays([r.replica_id for r in load.replicas],
                         [r.num_seqs for r in load.replicas],
                         [r.num_tokens for r in load.replicas],
                         [r.kv_capacity for r in load.replicas])
        # waiting and aborted (seq id, length) pairs, popped by id
        self._queue = WhatIfQueue(load.waiting)

    def running(self, i: int) -> Mapping[int, int]:
        if self._pending:
            self._flush()
        return self._own.get(i, self._base[i])

    def _mut(self, i: int) -> dict[int, int]:
        if self._pending:
            self._flush()
        if i not in self._own:
            self._own[i] = dict(self._base[i])
        return self._own[i]

    def _flush(self) -> None:
        """Writes the pending placements and moves into the sequence maps, in order."""
        pending, self._pending = self._pending, []
        own, base = self._own, self._base
        for arrays in pending:
            if len(arrays) == 3:
                for i, sid, length in zip(*(a.tolist() for a in arrays)):
                    run = own.get(i)
                    if run is None:
                        run = own[i] = dict(base[i])
                    run[sid] = length
                continue
            for key, src, dst in arrays[0].tolist():
                sid, length = key & 0xFFFFFFFF, key >> 32
                run = own.get(src)
                if run is None:
                    run = own[src] = dict(base[src])
                del run[sid]
                run = own.get(dst)
                if run is None:
                    run = own[dst] = dict(base[dst])
                run[sid] = length

    def log_moves(self, rows: np.ndarray) -> None:
        """Records alg. 4's compiled moves, rows of (key, source, destination), for
        ``_flush``."""
        if len(rows):
            self._pending.append((rows,))

    def shortest_heaps(self) -> dict[int, list[tuple[int, int]]]:
        """The heaps persist: a heap's top is the minimum (length, id) of its replica's
        running set whatever history built it, so reusing one changes no choice of alg. 4.
        ``dispatch``, ``abort`` and ``_remove_replicas`` keep them in step; ``move`` does
        not, its one caller (alg. 4) updates them for its own moves."""
        return self._heaps

    def queue_size(self) -> int:
        return len(self._queue)

    def add_replicas(self, views: Iterable[ReplicaView]) -> None:
        """Appends replicas; only their own entries are derived (the others' are kept in
        step by ``_adjust``), so adding one costs O(1) Python work, not O(replicas)."""
        views = list(views)
        for v in views:
            if v.replica_id in self._index:
                raise StateError(f"replica {v.replica_id} is already active")
        self._base.extend(v.running for v in views)
        start = len(self._ids)
        self._ids = self._ids + [v.replica_id for v in views]
        for k, v in enumerate(views, start=start):
            self._index[v.replica_id] = k
        nseq = np.array([v.num_seqs for v in views], dtype=float)
        ntok = np.array([v.num_tokens for v in views], dtype=float)
        cap = np.array([v.kv_capacity for v in views], dtype=float)
        num, den = self.model.after_terms(nseq, ntok)
        for name, new in (("_nseq", nseq), ("_ntok", ntok), ("_cap", cap),
                          ("_free", cap - ntok), ("_tput", self.model.throughputs(nseq, ntok)),
                          ("_num", num), ("_den", den)):
            setattr(self, name, np.concatenate([getattr(self, name), new]))
        if self._alive is not None:
            self._alive = np.concatenate([self._alive, np.ones(len(views), dtype=bool)])
        if self._pool is not None:
            if any(v.running for v in views):
                self._pool = None
            else:
                self._pool.add(len(views))

    def _remove_replicas(self, replica_ids: Iterable[str]) -> None:
        """Retires empty replicas in place: their index stays, with no free KV and a gain
        of -inf (never chosen), and ``aggregate_throughput`` sums the live ones only, so a
        removal costs O(removed) instead of re-indexing every array. Choices and sums are
        those of the compacted arrays: ties still go to the lowest live index, a retired
        replica is never eligible (``best_replica`` returns None when none is live) and the
        live throughputs are summed in the same order."""
        ids = list(replica_ids)
        drop = [self._index[r] for r in ids]
        for i in drop:
            if self.running(i):
                raise StateError(f"replica {self._ids[i]} still runs sequences")
        if self._alive is None:
            self._alive = np.ones(len(self._ids), dtype=bool)
        self._pool = None
        for rid, i in zip(ids, drop):
            del self._index[rid]
            self._alive[i] = False
            self._free[i] = -np.inf
            self._num[i] = -np.inf
            self._heaps.pop(i, None)
            self._own.pop(i, None)
            self._base[i] = {}

    def aggregate_throughput(self) -> float:
        if self._alive is None:
            return float(self._tput.sum())
        return float(self._tput[self._alive].sum())

    @property
    def replica_ids(self) -> list[str]:
        if self._alive is None:
            return list(self._ids)
        return [rid for rid, alive in zip(self._ids, self._alive.tolist()) if alive]

    def abort(self, replica_id: str, which: str | int = "all") -> list[Abort]:
        i = self._index[replica_id]
        if self._pending:
            self._flush()
        self._heaps.pop(i, None)
        self._pool = None
        record = self.record_actions
        if which == "all":
            run = self.running(i)
            self._queue.push_many(run)
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
            self._queue.push(sid, length)
            if record:
                out.append(Abort(sid, replica_id))
        return out

    def dispatch(self, replica_ids: Iterable[str] | None = None) -> list[Dispatch]:
        mask = self.mask_of(replica_ids)
        if self._plain_model and self.max_seqs is None and not self.record_actions:
            self._dispatch_plain(mask)
            return []
        if self._pending:
            self._flush()
        out = []
        queue, heaps, own, record = self._queue, self._heaps, self._own, self.record_actions
        while queue:
            sid, length = queue.peek()
            i = self.best_replica(length, mask)
            if i is None:
                break
            queue.pop()
            run = own.get(i)
            if run is None:
                run = own[i] = dict(self._base[i])  # _mut, inlined
            run[sid] = length
            self._adjust(i, 1, length)
            h = heaps.get(i)
            if h is not None:
                heapq.heappush(h, (length, sid))
            if self._pool is not None:
                self._pool.push(i, length, sid)
            if record:
                out.append(Dispatch(sid, self._ids[i]))
        return out

    def _dispatch_plain(self, mask: np.ndarray | None) -> None:
        """``dispatch`` under the plain throughput model, with no batch cap and no
        actions: the planner's re-dispatch of evacuated donors (alg. 3) and its filling of
        new replicas from the queue (alg. 4), its hottest loops. Chunks of the queue, in
        key order, go through ``kernels.dispatch_plain`` (the same choices and load values
        as ``best_replica`` and ``_adjust``); the sequence maps and heaps follow in the
        same order, and a chunk's unplaced tail goes back to the queue (its keys are
        unique, so the queue pops in the same order as if it had never left)."""
        if not self._ids:
            return
        m = self.model
        queue, heaps = self._queue, self._heaps
        pool = self._pool
        allowed = np.ones(len(self._ids), dtype=np.bool_) if mask is None else mask
        push = heapq.heappush
        size = 16
        while queue:
            chunk = queue.take(size)
            size = min(4 * size, 1024)
            lengths = np.fromiter((e[1] for e in chunk), dtype=np.int64, count=len(chunk))
            out = np.empty(len(chunk), dtype=np.int64)
            placed = kernels.dispatch_plain(lengths, self.kv_reserve, m.A, m.B, m.C, m.D,
                                            self._nseq, self._ntok, self._cap, self._free,
                                            self._tput, self._num, self._den, out,
                                            allowed)
            self._pending.append((out[:placed], np.fromiter(
                (e[0] for e in chunk[:placed]), dtype=np.int64, count=placed),
                lengths[:placed]))
            if heaps or pool is not None:
                for (sid, length), i in zip(chunk, out[:placed].tolist()):
                    h = heaps.get(i)
                    if h is not None:
                        push(h, (length, sid))
                    if pool is not None:
                        pool.push(i, length, sid)
            if placed < len(chunk):
                queue.untake(chunk, placed)
                return

    def move(self, seq_id: int, src: int, dst: int) -> list[Action]:
        self._pool = None
        length = self._mut(src).pop(seq_id)
        self._adjust(src, -1, -length)
        self._mut(dst)[seq_id] = length
        self._adjust(dst, 1, length)
        return self._moved(seq_id, src, dst)

    def move_taken(self, seq_id: int, src: int, dst: int, length: int) -> list[Action]:
        """``move`` when the arrays already count ``length`` off ``src`` (see LoadArrays)."""
        self._pool = None
        del self._mut(src)[seq_id]
        self._mut(dst)[seq_id] = length
        self._adjust(dst, 1, length)
        return self._moved(seq_id, src, dst)

    def _moved(self, seq_id: int, src: int, dst: int) -> list[Action]:
        if not self.record_actions:
            return []
        return [Abort(seq_id, self._ids[src]), Dispatch(seq_id, self._ids[dst], resume=True)]
