"""The shift-aware scheduler of one inference role (sec. 6, alg. 2).

It owns the role's shared waiting queue and its view of every active replica, and turns
events (a new sequence, a finished one, a shift) into ``Dispatch`` / ``Abort`` actions. It
is engine-agnostic: the real driver, the simulator and the planner's what-if simulation
(sec. 7.3) all run this same code. Shift-time migration (alg. 3 and 4) lives in
``pivot.scheduler.migration`` and is exposed here as ``shift_down`` / ``shift_up``.
"""

from __future__ import annotations

from typing import Iterable, Literal, Mapping

from pivot.errors import StateError
from pivot.scheduler.actions import Abort, Action, Dispatch
from pivot.scheduler.load import LoadArrays
from pivot.scheduler.queue import PriorityFn, WaitingQueue, by_sequence_id
from pivot.scheduler.throughput import ThroughputModel
from pivot.types import ReplicaView, Role, SequenceState

Which = Literal["all", "shortest"] | int


class ShiftAwareScheduler(LoadArrays):
    """Shared queue plus throughput-maximising dispatch across a role's replicas (sec. 6.1).

    Args:
        role: the role it schedules (rollout or reward).
        model: the throughput model; ``BinaryThroughputModel`` for the vanilla ablation.
        priority: the queue's key (default ascending sequence id).
        migrate_on_shift_up: run alg. 4's migration loop after a shift up (the "+
            migration" component of sec. 8.4); if False a new replica only takes waiting
            sequences.
        kv_reserve: extra free tokens a replica must have beyond a sequence's current length
            to be eligible (room to grow); 0 is the paper's rule.
        max_seqs: a replica's batch cap (the engine's ``max_num_seqs``); a replica at it
            is not eligible, so the sequence waits in the shared queue where a shift up
            or migration can reach it; None: no cap (KV capacity only).
    """

    def __init__(self, role: Role, model: ThroughputModel,
                 priority: PriorityFn = by_sequence_id, migrate_on_shift_up: bool = True,
                 kv_reserve: int = 0, max_seqs: int | None = None) -> None:
        if role not in (Role.ROLLOUT, Role.REWARD):
            raise StateError(f"the scheduler serves rollout or reward, not {role}")
        if kv_reserve < 0:
            raise StateError(f"kv_reserve must be >= 0, got {kv_reserve}")
        if max_seqs is not None and max_seqs < 1:
            raise StateError(f"max_seqs must be >= 1 or None, got {max_seqs}")
        super().__init__(model, kv_reserve, max_seqs)
        self.role = role
        self.migrate_on_shift_up = migrate_on_shift_up
        self.queue = WaitingQueue(priority)
        self.seqs: dict[int, SequenceState] = {}
        self.replicas: dict[str, ReplicaView] = {}

    # ----------------------------------------------------------------- replica set
    def _rebuild(self) -> None:
        views = list(self.replicas.values())
        self._set_arrays([v.replica_id for v in views], [v.num_seqs for v in views],
                         [v.num_tokens for v in views], [v.kv_capacity for v in views])

    def add_replicas(self, views: Iterable[ReplicaView]) -> None:
        """Adds replicas (running what their views say) without any migration."""
        for v in views:
            if v.role is not self.role:
                raise StateError(f"replica {v.replica_id} has role {v.role.value}; this "
                                 f"scheduler serves {self.role.value}")
            if v.replica_id in self.replicas:
                raise StateError(f"replica {v.replica_id} is already active")
            v.check()
            for sid, length in v.running.items():
                seq = self.seqs.get(sid)
                if seq is None:
                    raise StateError(f"replica {v.replica_id} runs sequence {sid}, unknown "
                                     f"to the scheduler; submit it first")
                if seq.replica_id is not None or sid in self.queue:
                    where = seq.replica_id or "the waiting queue"
                    raise StateError(f"sequence {sid} is on {where} and on {v.replica_id}")
                seq.replica_id = v.replica_id
            self.replicas[v.replica_id] = v
        self._rebuild()

    def _remove_replicas(self, replica_ids: Iterable[str]) -> None:
        for rid in replica_ids:
            if self.replicas[rid].running:
                raise StateError(f"replica {rid} still runs sequences; abort them first")
            del self.replicas[rid]
        self._rebuild()

    def view(self, replica_id: str) -> ReplicaView:
        try:
            return self.replicas[replica_id]
        except KeyError:
            raise StateError(f"unknown replica {replica_id!r} in {self.role.value}") from None

    # ---------------------------------------------------------------- sequences
    def submit(self, seq: SequenceState) -> None:
        """Puts a new sequence into the shared waiting queue."""
        if seq.seq_id in self.seqs:
            raise StateError(f"sequence {seq.seq_id} was already submitted")
        if seq.prompt_len <= 0 or seq.max_new_tokens < 0 or seq.generated_len < 0:
            raise StateError(f"sequence {seq.seq_id}: prompt_len must be > 0 and "
                             f"max_new_tokens, generated_len >= 0")
        seq.replica_id = None
        self.seqs[seq.seq_id] = seq
        self.queue.push(seq)

    def _place(self, seq: SequenceState, rid: str) -> None:
        v = self.replicas[rid]
        i = self._index[rid]
        length = seq.length
        v.running[seq.seq_id] = length
        v.num_tokens += length
        self._adjust(i, 1, length)
        seq.replica_id = rid

    def _unplace(self, seq_id: int) -> SequenceState:
        seq = self.seqs[seq_id]
        rid = seq.replica_id
        assert rid is not None
        v = self.replicas[rid]
        i = self._index[rid]
        length = v.running.pop(seq_id)
        v.num_tokens -= length
        self._adjust(i, -1, -length)
        seq.replica_id = None
        # its recorded progress (``settle`` records lengths without touching generated_len;
        # a driver may already have set more from its engine: progress only grows)
        seq.generated_len = max(seq.generated_len, length - seq.prompt_len)
        return seq

    def update_lengths(self, replica_id: str, lengths: Mapping[int, int]) -> None:
        """Records the current length (prompt + generated) of running sequences.

        Drivers call it as tokens are generated; it also sets ``generated_len``. The
        replica's load changes once by the total (integer token counts sum exactly, so the
        cached load is the one per-sequence updates would give).
        """
        v = self.view(replica_id)
        i = self._index[replica_id]
        running, seqs = v.running, self.seqs
        delta = 0
        try:
            for sid, length in lengths.items():
                old = running.get(sid)
                if old is None:
                    raise StateError(f"sequence {sid} does not run on {replica_id}")
                seq = seqs[sid]
                if length < seq.prompt_len:
                    raise StateError(f"sequence {sid}: length {length} < prompt "
                                     f"{seq.prompt_len}")
                running[sid] = length
                delta += length - old
                seq.generated_len = length - seq.prompt_len
        finally:
            if delta:
                v.num_tokens += delta
                self._adjust(i, 0, delta)

    def settle(self, replica_id: str, lengths: Iterable[tuple[int, int]] | Mapping[int, int],
               total: int) -> None:
        """Records the current length of some running sequences of ``replica_id`` (pairs
        or a mapping) and sets its N_tok to ``total``, the true sum over *all* of them,
        which a driver that grows every sequence by the same step count knows without
        listing them (dispatch reads only N_seq and N_tok, sec. 6.1). Sequences not
        listed keep older lengths until a later call lists them, so until then the
        view's lengths do not sum to ``num_tokens``: the driver must list every sequence
        before anything reads them (``abort``, migration, the monitor). The simulator's
        preemption lists only its victim, in O(1) instead of O(batch). It leaves
        ``SequenceState.generated_len`` as it was: a sequence's recorded length is its
        progress, and the simulator sets ``generated_len`` from the truth whenever one
        leaves its replica (abort, preemption). With every sequence listed it leaves the
        view as ``update_lengths`` does."""
        v = self.view(replica_id)
        running = v.running
        n = len(running)
        running.update(lengths)
        if len(running) != n:
            raise StateError(f"settle: {len(running) - n} of the listed sequences do not "
                             f"run on {replica_id}")
        delta = total - v.num_tokens
        if delta:
            v.num_tokens = total
            self._adjust(self._index[replica_id], 0, delta)

    def finish(self, seq_id: int) -> SequenceState:
        """Removes a finished sequence; its replica's capacity becomes free."""
        seq = self.seqs.get(seq_id)
        if seq is None:
            raise StateError(f"finish of unknown sequence {seq_id}")
        if seq.replica_id is None:
            raise StateError(f"sequence {seq_id} finished but was not running")
        self._unplace(seq_id)
        del self.seqs[seq_id]
        return seq

    # ------------------------------------------------------------ alg. 2: dispatch
    def dispatch(self, replica_ids: Iterable[str] | None = None) -> list[Dispatch]:
        """Dispatch(Q, R) of alg. 2: pops sequences in priority order onto the replica
        with the largest gain, until the queue is empty or its head fits nowhere.

        Args:
            replica_ids: the candidate set R; all active replicas when None.
        """
        mask = self.mask_of(replica_ids)
        out: list[Dispatch] = []
        while len(self.queue):
            head = self.queue.peek()
            assert head is not None
            i = self.best_replica(head.length, mask)
            if i is None:
                break
            self.queue.pop()
            self._place(head, self._ids[i])
            out.append(Dispatch(head.seq_id, self._ids[i], resume=head.generated_len > 0))
        return out

    # --------------------------------------------------------------- alg. 2: abort
    def abort(self, replica_id: str, which: Which = "all") -> list[Abort]:
        """Abort(r, d, Q) of alg. 2: stops sequences on ``replica_id`` and queues them,
        keeping their generated tokens. ``which`` is "all", "shortest" or a sequence id."""
        v = self.view(replica_id)
        if which == "all":
            targets = list(v.running)
        elif which == "shortest":
            if not v.running:
                return []
            targets = [min(v.running, key=lambda s: (v.running[s], s))]
        elif isinstance(which, int) and not isinstance(which, bool):
            if which not in v.running:
                raise StateError(f"sequence {which} does not run on {replica_id}")
            targets = [which]
        else:
            raise StateError(f"abort selection must be 'all', 'shortest' or a sequence id, "
                             f"got {which!r}")
        out = []
        for sid in targets:
            seq = self._unplace(sid)
            seq.num_aborts += 1
            self.queue.push(seq)
            out.append(Abort(sid, replica_id))
        return out

    # ----------------------------------------- operations the migration code uses
    def running(self, i: int) -> Mapping[int, int]:
        return self.replicas[self._ids[i]].running

    def queue_size(self) -> int:
        return len(self.queue)

    def move(self, seq_id: int, src: int, dst: int) -> list[Action]:
        """Migrates one running sequence: Abort on ``src``, Dispatch to ``dst``."""
        actions: list[Action] = list(self.abort(self._ids[src], seq_id))
        seq = self.queue.remove(seq_id)
        self._place(seq, self._ids[dst])
        actions.append(Dispatch(seq_id, self._ids[dst], resume=seq.generated_len > 0))
        return actions

    # ---------------------------------------------------------------- shift time
    def shift_down(self, replica_ids: Iterable[str]) -> list[Action]:
        """Alg. 3: evacuates the shift-down replicas and re-dispatches onto the rest."""
        from pivot.scheduler.migration import shift_down_migration
        return shift_down_migration(self, list(replica_ids))

    def shift_up(self, views: Iterable[ReplicaView]) -> list[Action]:
        """Alg. 4: adds empty replicas, fills them from the queue, then migrates."""
        from pivot.scheduler.migration import shift_up_migration
        return shift_up_migration(self, list(views), migrate=self.migrate_on_shift_up)

    def lose_replica(self, replica_id: str) -> tuple[list[int], list[Dispatch]]:
        """A replica's process died: a forced shift down (alg. 3) with no engine to ask.

        Its sequences return to the queue with the tokens the driver last recorded for
        them (``SequenceState.generated_*``) and are re-dispatched onto the survivors.

        Returns:
            (requeued sequence ids, the Dispatch actions to carry out).
        """
        view = self.view(replica_id)
        lost = sorted(view.running)
        for sid in lost:
            seq = self._unplace(sid)
            seq.num_aborts += 1
            self.queue.push(seq)
        self._remove_replicas([replica_id])
        return lost, self.dispatch()

    def restore(self, seq_id: int, replica_id: str) -> None:
        """Records ``seq_id`` as running on ``replica_id`` again, wherever the scheduler
        had put it: a migration placed it elsewhere, but failed before its Abort reached
        the engine that still runs it (the driver knows where its engines hold it)."""
        seq = self.seqs.get(seq_id)
        if seq is None:
            raise StateError(f"restore of unknown sequence {seq_id}")
        self.view(replica_id)
        if seq.replica_id == replica_id:
            return
        if seq.replica_id is not None:
            self._unplace(seq_id)
        else:
            self.queue.remove(seq_id)
        self._place(seq, replica_id)

    # ------------------------------------------------------------------- metrics
    @property
    def num_seqs(self) -> int:
        """Running plus waiting sequences (N^Seq of eq. 1)."""
        return len(self.seqs)

    def check_replica(self, replica_id: str) -> None:
        """The part of ``check`` about one replica, in O(its sequences): its view, the
        back-references of the sequences it runs, and its cached load."""
        v = self.view(replica_id)
        v.check()
        for sid in v.running:
            seq = self.seqs.get(sid)
            if seq is None:
                raise StateError(f"replica {replica_id} runs sequence {sid}, unknown to the "
                                 f"scheduler")
            if seq.replica_id != replica_id:
                raise StateError(f"sequence {sid} believes it runs on {seq.replica_id}, not "
                                 f"{replica_id}")
            if sid in self.queue:
                raise StateError(f"sequence {sid} must be either waiting or running "
                                 f"(waiting=True, running=True)")
        i = self._index.get(replica_id)
        if i is None or self._nseq[i] != v.num_seqs or self._ntok[i] != v.num_tokens:
            raise StateError(f"replica {replica_id}: cached load out of sync")

    def check_sequence(self, seq_id: int) -> None:
        """The part of ``check`` about one live sequence, in O(1): it waits in the queue or
        runs on the replica it names, not both and not neither."""
        seq = self.seqs.get(seq_id)
        if seq is None:
            raise StateError(f"sequence {seq_id} is not live")
        rid = seq.replica_id
        v = self.replicas.get(rid) if rid is not None else None
        running = v is not None and seq_id in v.running
        in_q = seq_id in self.queue
        if in_q == running:
            raise StateError(f"sequence {seq_id} must be either waiting or running "
                             f"(waiting={in_q}, running={running})")

    def check(self) -> None:
        """Verifies every invariant; raises StateError naming the first violation."""
        placed: dict[int, str] = {}
        for rid, v in self.replicas.items():
            v.check()
            for sid in v.running:
                if sid in placed:
                    raise StateError(f"sequence {sid} runs on {placed[sid]} and {rid}")
                placed[sid] = rid
                if self.seqs[sid].replica_id != rid:
                    raise StateError(f"sequence {sid} believes it runs on "
                                     f"{self.seqs[sid].replica_id}, not {rid}")
        for sid, seq in self.seqs.items():
            in_q = sid in self.queue
            if in_q == (sid in placed):
                raise StateError(f"sequence {sid} must be either waiting or running "
                                 f"(waiting={in_q}, running={sid in placed})")
        for rid in self._ids:
            i = self._index[rid]
            v = self.replicas[rid]
            if self._nseq[i] != v.num_seqs or self._ntok[i] != v.num_tokens:
                raise StateError(f"replica {rid}: cached load out of sync")
