"""The discrete-event cluster: simulated replicas and training behind the control plane's
ports, in virtual time (docs/design.md, "sim" driver).

``SimCluster`` implements both ports of ``pivot.shifting.executor``: the ``SlotBackend`` of
the ``Shifter`` (``shift_down`` / ``shift_up`` return modeled phase seconds) and the
``ReplicaPort`` (``apply`` carries out the schedulers' Abort / Dispatch actions). The
schedulers, planner, monitor and executor are the real ones; this module only advances
replicas (``pivot.sim.replica``) and training between events.

Virtual time and the executor: ``ShiftExecutor.execute`` is synchronous and reads the
clock, which does not move during the call, so a plan takes effect at one instant. Shift
costs are carried by the replicas instead: a donor's devices are free only after its
shift-down phases, a new replica decodes only after its devices are free plus its shift-up
phases, and training starts after its shift up.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from dataclasses import dataclass, field

from pivot.errors import ConfigError, StateError
from pivot.scheduler.actions import Abort, Dispatch
from pivot.scheduler.scheduler import ShiftAwareScheduler
from pivot.shifting.executor import MigrationStats
from pivot.shifting.shifter import ShiftResult
from pivot.spec.profile import ModelProfile, ShiftCost, TrainingProfile
from pivot.sim.replica import SimReplica
from pivot.sim.workflow import Workflow
from pivot.types import Role

log = logging.getLogger(__name__)

REPLICA, TICK, TRAIN_START, TRAIN_DONE = range(4)


class VirtualClock:
    """The injectable clock of the device map and executor: the event loop's time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class TrainingState:
    """Training as a whole (sec. 5.2): its devices, readiness and the running step."""

    replica_id: str | None = None
    devices: tuple[int, ...] = ()
    ready_at: float = 0.0
    busy: bool = False
    step_end: float = 0.0
    step_times: list[tuple[int, float, float]] = field(default_factory=list)
    """(step, start, end) of every training step."""


@dataclass
class SimCluster:
    """Replicas, training and the event heap.

    Args:
        profiles: model of each inference role (reward may be absent: verifiable only).
        training_profile / shift_cost: the time models.
        schedulers: the real shift-aware scheduler of each inference role.
        workflow: the RL workload (true lengths, staleness, batches).
        abort_action_s / dispatch_action_s: engine-side cost per migration action.
    """

    profiles: dict[Role, ModelProfile]
    training_profile: TrainingProfile
    shift_cost: ShiftCost
    schedulers: dict[Role, ShiftAwareScheduler]
    workflow: Workflow
    clock: VirtualClock
    abort_action_s: float = 0.002
    dispatch_action_s: float = 0.002
    replicas: dict[str, SimReplica] = field(default_factory=dict)
    training: TrainingState = field(default_factory=TrainingState)
    free_at: dict[int, float] = field(default_factory=dict)
    """Device -> virtual time its last shift down completes."""
    free_at_max: float = 0.0
    """The latest of ``free_at`` (a device's new value is never before its old one: it
    shifted up after it was free and down again later)."""
    free_provisioning: bool = False
    """Initial placement costs nothing (cold start is not part of the measured steps)."""
    events: int = 0
    heap: list = field(default_factory=list)
    _seq: itertools.count = field(default_factory=itertools.count)
    _dirty: set = field(default_factory=set)
    _next: dict = field(default_factory=dict)
    _synced: dict = field(default_factory=dict)
    """Replica -> its decode steps when its scheduler view last got the true lengths."""
    _stale: dict = field(default_factory=dict)
    """Replica -> its decode steps when its view was last settled lazily (a preemption or
    a tick): from then until ``_sync_lengths`` lists it, the view holds N_tok as if every
    sequence had been listed at those steps (as the former, eager code did), but older
    per-sequence lengths (``_finish_stale``)."""
    lazy_lengths = True
    """A preemption settles only its victim's length and the replica's total in the
    scheduler's view, and a tick only the totals (O(1) a replica); the per-sequence
    lengths are listed (O(batch)) when something reads them (``list_stale``). False:
    every preemption and tick lists them, as before. The runs are identical
    (tests/sim/test_incremental_tick.py)."""
    tokens_by_role: dict[Role, int] = field(default_factory=lambda: {r: 0 for r in Role})
    rollout_end: dict[int, float] = field(default_factory=dict)
    """Step -> virtual time its last response finished (the end of its generation)."""
    _instant: list = field(default_factory=lambda: [None, 0])
    """(virtual time, replica, its decode steps) of the last preemption and how many
    preemptions that replica had at that instant without decoding (``_preempt``)."""

    @property
    def now(self) -> float:
        return self.clock.now

    def push(self, t: float, kind: int, key: object = None) -> None:
        heapq.heappush(self.heap, (t, next(self._seq), kind, key))

    # ------------------------------------------------------------ SlotBackend port
    def shift_down(self, role: Role, replica_id: str, devices: tuple[int, ...]) -> ShiftResult:
        if role is Role.TRAINING:
            if self.training.busy:
                raise StateError("training shifted down while a step runs")
            phases = self.shift_cost.training_down(self.profiles[Role.ROLLOUT], len(devices))
            self.training = TrainingState(step_times=self.training.step_times)
        else:
            rep = self.replicas.pop(replica_id)
            self._synced.pop(replica_id, None)
            self._stale.pop(replica_id, None)
            if rep.num_seqs:
                raise StateError(f"{replica_id} shifted down with {rep.num_seqs} sequences; "
                                 f"migration must empty it first")
            self.tokens_by_role[role] += rep.generated
            phases = self.shift_cost.inference_down(self.profiles[role])
        done = self.now + (0.0 if self.free_provisioning else sum(phases.values()))
        for d in devices:
            self.free_at[d] = done
        self.free_at_max = max(self.free_at_max, done)
        return ShiftResult(phases)

    def shift_up(self, role: Role, replica_id: str, devices: tuple[int, ...]) -> ShiftResult:
        start = max([self.now] + [self.free_at.get(d, 0.0) for d in devices])
        if role is Role.TRAINING:
            phases = self.shift_cost.training_up(self.profiles[Role.ROLLOUT], len(devices))
            ready = start + (0.0 if self.free_provisioning else sum(phases.values()))
            self.training = TrainingState(replica_id, tuple(devices), ready,
                                          step_times=self.training.step_times)
            self.push(ready, TRAIN_START)
            return ShiftResult(phases)
        prof = self.profiles[role]
        if len(devices) != prof.devices:
            raise StateError(f"{role.value} replica {replica_id} got {len(devices)} devices; "
                             f"{prof.name} needs {prof.devices}")
        phases = self.shift_cost.inference_up(prof)
        ready = start + (0.0 if self.free_provisioning else sum(phases.values()))
        self.replicas[replica_id] = SimReplica(
            replica_id, role, tuple(devices), prof.decode_model(), prof.kv_capacity(),
            prof.prefill_rate(), time=self.now, busy_until=ready)
        return ShiftResult(phases, kv_capacity=prof.kv_capacity())

    # ------------------------------------------------------------ ReplicaPort port
    def apply(self, actions) -> MigrationStats:
        """Aborts, then dispatches, in the given order (sec. 6.2)."""
        stats = MigrationStats()
        for a in actions:
            if isinstance(a, Abort):
                rep = self.replicas[a.replica_id]
                self.sync(a.replica_id)
                sched = self.schedulers[rep.role]
                seq = sched.seqs[a.seq_id]
                length = rep.remove(a.seq_id, self.now)
                seq.generated_len = length - seq.prompt_len  # true progress, kept (sec. 6.2)
                stats.aborted += 1
                stats.abort_s += self.abort_action_s
                self._reschedule(a.replica_id)
            elif isinstance(a, Dispatch):
                rep = self.replicas[a.replica_id]
                self.sync(a.replica_id)
                seq = self.schedulers[rep.role].seqs[a.seq_id]
                if self.schedulers[rep.role].replicas[a.replica_id].running.get(
                        a.seq_id) != seq.length:
                    self._synced.pop(a.replica_id, None)  # the view lags this admission
                cost = rep.admit(a.seq_id, seq.length, self.workflow.target(a.seq_id),
                                 self.now)
                stats.dispatched += 1
                stats.dispatch_s += self.dispatch_action_s
                if a.resume:
                    stats.reprefill_s += cost
                if rep.num_tokens > rep.kv_capacity:
                    self.sync(a.replica_id)
                self._reschedule(a.replica_id)
            else:
                raise StateError(f"unknown action {a!r}")
        return stats

    # ------------------------------------------------------------ replica events
    def _reschedule(self, rid: str) -> None:
        t = self.replicas[rid].next_event_time()
        if t is None:
            self._next.pop(rid, None)
        elif self._next.get(rid) != t:
            self._next[rid] = t
            self.push(t, REPLICA, rid)

    def sync(self, rid: str) -> None:
        """Advances ``rid`` to now, finishing sequences that reached their length and
        preempting on KV overflow, until its next event lies in the future."""
        rep = self.replicas[rid]
        # a dispatch on the scheduler's (lagging) view of lengths may over-admit; the
        # engine would not hold it, so the newest sequences go back at once
        while rep.num_tokens > rep.kv_capacity and rep.num_seqs:
            self.events += 1
            self._preempt(rid)
        while True:
            done, overflow = rep.advance(self.now)
            if not done and not overflow:
                return
            self.events += 1
            sched = self.schedulers[rep.role]
            if done:
                if rid in self._stale:
                    self._finish_stale(rid, rep, done)
                else:
                    sched.update_lengths(rid, {s: rep.length(s) for s in done})
                for sid in done:
                    rep.remove(sid, self.now)
                    sched.finish(sid)
                    self._finished(rep.role, sid)
                self._dirty.add(rep.role)
            if overflow and rep.num_seqs:
                self._preempt(rid)

    def _preempt(self, rid: str) -> None:
        """KV overflow: the newest sequence goes back to the queue with its tokens
        (vLLM's recompute preemption)."""
        rep = self.replicas[rid]
        sched = self.schedulers[rep.role]
        self._check_thrash(rid, rep)
        victim = rep.newest()
        if not self.lazy_lengths:
            self._sync_lengths(rid, rep)
        else:
            # only the victim's length is read (its abort); the total keeps dispatch exact
            self._settle_lazily(rid, rep, [(victim, rep.length(victim))])
        length = rep.remove(victim, self.now)
        sched.abort(rid, victim)
        sched.seqs[victim].generated_len = length - sched.seqs[victim].prompt_len
        self._dirty.add(rep.role)

    def _check_thrash(self, rid: str, rep: SimReplica) -> None:
        """Fails instead of looping forever when a replica keeps preempting at one instant
        without decoding a step: the scheduler admits a sequence when the KV cache has its
        length plus ``kv_reserve`` free, the replica preempts when it has no room for one
        more decode step (a token per running sequence), so with more running sequences
        than ``kv_reserve`` tokens an admission can be preempted at once and the next
        waiting one admitted in its place, forever (seen: a GenRM replica with no batch
        cap holding 6K sequences). A cascade that ends preempts at most the replica's
        sequences plus those dispatched meanwhile; the bound is far above that."""
        key = (self.now, rid, rep.steps)
        if self._instant[0] == key:
            self._instant[1] += 1
        else:
            self._instant = [key, 1]
        if self._instant[1] > max(10_000, 4 * rep.num_seqs):
            raise ConfigError(
                f"replica {rid} preempted {self._instant[1]} times at virtual t="
                f"{self.now:.1f} s without decoding ({rep.num_seqs} sequences, KV "
                f"{rep.num_tokens}/{rep.kv_capacity} tokens): admission (length + "
                f"SimDriver.kv_reserve free) leaves less than a decode step of room for this "
                f"many sequences. Bind the engine's batch cap (ModelProfile.max_num_seqs) "
                f"or raise SimDriver.kv_reserve above it")

    def _finished(self, role: Role, sid: int) -> None:
        if role is Role.ROLLOUT:
            judge = self.workflow.response_done(sid)
            step = self.workflow.items[sid].step
            if self.workflow.unfinished_responses[step] == 0:
                self.rollout_end[step] = self.now
            if judge is not None:
                self.schedulers[Role.REWARD].submit(judge)
                self._dirty.add(Role.REWARD)
            else:
                self.maybe_start_training()
        else:
            self.workflow.judgement_done(sid)
            self.maybe_start_training()

    def sync_all(self) -> None:
        """Brings every replica to now and the schedulers' views to the true totals (and,
        with ``lazy_lengths`` off, lengths; else ``list_stale`` lists them).

        An idle replica has nothing to advance (its clock catches up when it next admits),
        and a replica that decoded no step since its view was last brought to its true
        lengths (``_synced``) already shows them, so both are skipped."""
        for rid, rep in self.replicas.items():
            if rep.num_seqs:
                self.sync(rid)
        for rid, rep in self.replicas.items():
            if rep.num_seqs:
                if self.lazy_lengths:
                    self._settle_lazily(rid, rep, ())
                else:
                    self._sync_lengths(rid, rep)

    def list_stale(self) -> None:
        """Every lazily settled view gets its sequences' true lengths (before the
        monitor or a migration reads them)."""
        for rid in list(self._stale):
            rep = self.replicas.get(rid)
            if rep is None:  # gone without a shift down (a killed replica)
                del self._stale[rid]
            else:
                self._sync_lengths(rid, rep)

    def _settle_lazily(self, rid: str, rep: SimReplica, lengths) -> None:
        """``lengths`` and the true total, the rest left stale from ``rep.steps`` on;
        nothing when the view already shows every true length."""
        if self._synced.get(rid) != rep.steps:
            self._settle(rid, rep, lengths)
            self._stale[rid] = rep.steps
            self._synced.pop(rid, None)

    def _sync_lengths(self, rid: str, rep: SimReplica) -> None:
        """The scheduler's view of ``rid`` gets every running sequence's true length.

        A view's lengths are true after this call until the replica decodes a step: a
        sequence dispatched meanwhile is admitted at its current length and one that
        finishes or is aborted leaves, so the call is skipped while ``rep.steps`` (the
        replica's decode steps) has not moved since the last one."""
        if self._synced.get(rid) != rep.steps:
            self._settle(rid, rep, rep.length_items())
            self._stale.pop(rid, None)
            self._synced[rid] = rep.steps

    def _settle(self, rid: str, rep: SimReplica, lengths) -> None:
        """``ShiftAwareScheduler.settle`` with the view's true N_tok: the replica's tokens
        plus those of sequences dispatched to it but not yet admitted (``apply`` syncs
        between the dispatches of one batch), which the view holds at their length."""
        view = self.schedulers[rep.role].replicas[rid]
        total = rep.num_tokens
        if len(view.running) != rep.num_seqs:
            extra = view.running.keys() - rep.base_len.keys()
            if len(view.running) - len(extra) != rep.num_seqs:
                raise StateError(f"{rid}: the scheduler's view lacks sequences the replica "
                                 f"runs")
            total += sum(view.running[s] for s in extra)
        self.schedulers[rep.role].settle(rid, lengths, total)

    def _finish_stale(self, rid: str, rep: SimReplica, done: list[int]) -> None:
        """``update_lengths`` of finished sequences on a stale view, in O(finished): their
        true lengths, and N_tok changed by what they grew since the lengths an eager
        preemption would have listed (at ``_stale[rid]`` steps, or the admission length
        for a sequence admitted later, which is what the view holds for it), so the
        total is the one the eager code had."""
        sched = self.schedulers[rep.role]
        view = sched.replicas[rid]
        running, base, steps, anchor = view.running, rep.base_len, rep.steps, self._stale[rid]
        total = view.num_tokens
        pairs = []
        for s in done:
            listed = base[s] + anchor
            old = running[s]
            true = base[s] + steps
            total += true - (old if old > listed else listed)
            pairs.append((s, true))
        sched.settle(rid, pairs, total)

    def dispatch_dirty(self) -> None:
        """Runs the schedulers' dispatch for roles whose queue or capacity changed."""
        while self._dirty:
            role = self._dirty.pop()
            sched = self.schedulers.get(role)
            if sched is None or not sched.replicas:
                continue
            self.apply(sched.dispatch())

    def on_replica_event(self, rid: str, t: float) -> None:
        """A heap entry for ``rid`` at ``t``; stale entries (rescheduled since) are skipped."""
        if rid in self.replicas and self._next.get(rid) == t:
            del self._next[rid]
            self.sync(rid)
            self._reschedule(rid)

    # ------------------------------------------------------------ training
    def maybe_start_training(self) -> None:
        tr = self.training
        if tr.busy or not tr.devices or not self.workflow.batch_ready():
            return
        if tr.ready_at > self.now:
            return  # TRAIN_START at ready_at retries
        step = self.workflow.version
        secs = self.training_profile.step_seconds(
            self.profiles[Role.ROLLOUT], self.workflow.step_tokens[step], len(tr.devices))
        tr.busy, tr.step_end = True, self.now + secs
        tr.step_times.append((step, self.now, tr.step_end))
        self.push(tr.step_end, TRAIN_DONE)

    def on_train_done(self) -> list:
        """The policy version advances; new rollout work is released and rollout
        replicas read the new weights."""
        self.training.busy = False
        self.workflow.trained()
        new = self.workflow.release()
        sched = self.schedulers[Role.ROLLOUT]
        for seq in new:
            sched.submit(seq)
        if new:
            self._dirty.add(Role.ROLLOUT)
        stall = self.shift_cost.weight_update(self.profiles[Role.ROLLOUT])
        for rid, rep in self.replicas.items():
            if rep.role is Role.ROLLOUT:
                self.sync(rid)
                rep.stall(self.now + stall)
                self._reschedule(rid)
        self.maybe_start_training()
        return new
