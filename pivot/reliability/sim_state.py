"""Reads a ``SimDriver``'s live state for the invariant checkers.

``sim_state`` is the whole ``ControlState`` (for ``check_state``); ``SimSource`` is the
incremental checker's ``LiveSource``: it journals what each event touches by wrapping, on
this driver's objects only, the calls through which the simulated control plane changes
state (the schedulers' placement and sequence calls, the cluster's sync / apply / shift
calls, the workflow's release and completions), and keeps the expected live sequences
from the workflow's calls. The wrappers only record ids; behaviour is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from pivot.reliability.incremental import Touched
from pivot.reliability.invariants import ControlState, EngineReplica
from pivot.scheduler.scheduler import ShiftAwareScheduler
from pivot.sim.workflow import Workflow
from pivot.types import Role


class LiveIndex:
    """Response ids not yet rewarded, kept incrementally (workflow ids are dense and
    increasing), so ``expected_live`` costs O(live) per event instead of O(all items)."""

    def __init__(self) -> None:
        self.next_id = 0
        self.open: set[int] = set()

    def update(self, wf: Workflow) -> set[int]:
        while self.next_id in wf.items:
            it = wf.items[self.next_id]
            if self.next_id == it.response_id:
                self.open.add(self.next_id)
            self.next_id += 1
        self.open = {s for s in self.open if not wf.items[s].rewarded}
        return self.open


def expected_live(wf: Workflow, index: LiveIndex | None = None) -> dict[Role, set[int]]:
    """The sequences the workflow says must be live: released responses not yet done and
    GenRM judgements submitted but not yet rewarded (sec. 8.1's per-response judgement)."""
    ro: set[int] = set()
    rm: set[int] = set()
    ids = index.update(wf) if index is not None else [
        s for s, it in wf.items.items() if s == it.response_id]
    for sid in ids:
        it = wf.items[sid]
        if wf.genrm:
            if it.judge_id is None:
                ro.add(sid)
            elif not it.rewarded:
                rm.add(it.judge_id)
        elif not it.rewarded:
            ro.add(sid)
    return {Role.ROLLOUT: ro, Role.REWARD: rm}


def sim_state(driver, index: LiveIndex | None = None) -> ControlState:
    """The control state of a ``pivot.sim.driver.SimDriver`` (between two events)."""
    c, wf = driver.cluster, driver.workflow
    engines = {rid: EngineReplica(r.role, r.devices, r.kv_capacity, r.lengths())
               for rid, r in c.replicas.items()}
    return ControlState(driver.schedulers, driver.device_map, wf.version, wf.released,
                        wf.staleness, expected_live(wf, index), engines, c.training.devices)


class SimSource:
    """The ``LiveSource`` of a ``SimDriver``; create it before the events to be checked
    (after provisioning is fine: the checker starts from a full scan)."""

    def __init__(self, driver) -> None:
        self.driver = driver
        # the checkers read every view's lengths after every event, which the simulator
        # lists lazily (only when its own readers need them): check the eager run, which
        # is the same run (tests/sim/test_incremental_tick.py)
        driver.cluster.list_stale()
        driver.cluster.lazy_lengths = False
        self.schedulers: Mapping[Role, ShiftAwareScheduler] = driver.schedulers
        self.device_map = driver.device_map
        self.touched = Touched()
        self.index = LiveIndex()
        self._expected = {r: set(v) for r, v in
                          expected_live(driver.workflow, LiveIndex()).items()}
        _journal_schedulers(driver.schedulers, self.touched)
        _journal_cluster(driver.cluster, self.touched)
        _journal_workflow(driver.workflow, self.touched, self._expected)

    def engine(self, rid: str) -> EngineReplica | None:
        r = self.driver.cluster.replicas.get(rid)
        return None if r is None else EngineReplica(r.role, r.devices, r.kv_capacity,
                                                    r.lengths())

    def engine_count(self) -> int:
        return len(self.driver.cluster.replicas)

    def training_devices(self) -> tuple[int, ...]:
        return self.driver.cluster.training.devices

    def counters(self) -> tuple[int, int, int]:
        wf = self.driver.workflow
        return wf.version, wf.released, wf.staleness

    def expected(self) -> Mapping[Role, set[int]]:
        return self._expected

    def full_state(self) -> ControlState:
        return sim_state(self.driver, self.index)


def _wrap(obj: object, name: str, make: Callable[[Callable], Callable]) -> None:
    """Replaces ``obj.name`` (a bound method) by ``make(original)`` on this instance."""
    setattr(obj, name, make(getattr(obj, name)))


def _journal_schedulers(schedulers: Mapping[Role, ShiftAwareScheduler], t: Touched) -> None:
    for sched in schedulers.values():
        seqs = sched.seqs

        def place(f, t=t):
            def _place(seq, rid):
                t.seqs.add(seq.seq_id)
                t.replicas.add(rid)
                return f(seq, rid)
            return _place

        def by_seq_id(f, t=t, seqs=seqs):
            """``_unplace`` and ``finish``: the sequence and the replica it leaves."""
            def _by_seq_id(seq_id):
                t.seqs.add(seq_id)
                seq = seqs.get(seq_id)
                if seq is not None and seq.replica_id is not None:
                    t.replicas.add(seq.replica_id)
                return f(seq_id)
            return _by_seq_id

        def submit(f, t=t):
            def _submit(seq):
                t.seqs.add(seq.seq_id)
                return f(seq)
            return _submit

        def update_lengths(f, t=t):
            def _update_lengths(rid, lengths):
                t.replicas.add(rid)
                t.seqs.update(lengths)
                return f(rid, lengths)
            return _update_lengths

        def settle(f, t=t):
            def _settle(rid, lengths, total):
                pairs = list(lengths.items() if isinstance(lengths, Mapping) else lengths)
                t.replicas.add(rid)
                t.seqs.update(s for s, _ in pairs)
                return f(rid, pairs, total)
            return _settle

        def add_replicas(f, t=t):
            def _add_replicas(views: Iterable):
                views = list(views)
                for v in views:
                    t.replicas.add(v.replica_id)
                    t.seqs.update(v.running)
                return f(views)
            return _add_replicas

        def remove_replicas(f, t=t):
            def _remove_replicas(ids: Iterable[str]):
                ids = list(ids)
                t.replicas.update(ids)
                return f(ids)
            return _remove_replicas

        _wrap(sched, "_place", place)
        _wrap(sched, "_unplace", by_seq_id)
        _wrap(sched, "submit", submit)
        _wrap(sched, "finish", by_seq_id)
        _wrap(sched, "update_lengths", update_lengths)
        _wrap(sched, "settle", settle)
        _wrap(sched, "add_replicas", add_replicas)
        _wrap(sched, "_remove_replicas", remove_replicas)


def _journal_cluster(c, t: Touched) -> None:
    replicas = c.replicas

    def sync(f):
        def _sync(rid):
            rep = replicas.get(rid)
            if rep is not None and not rep.finish_step:
                return f(rid)  # an empty replica only moves its clock: nothing to check
            key = None if rep is None else (rep.steps, rep.num_seqs, rep.num_tokens)
            try:
                return f(rid)
            finally:
                rep = replicas.get(rid)
                if rep is None or key != (rep.steps, rep.num_seqs, rep.num_tokens):
                    t.replicas.add(rid)
        return _sync

    def apply(f):
        def _apply(actions):
            actions = list(actions)
            for a in actions:
                t.replicas.add(a.replica_id)
                t.seqs.add(a.seq_id)
            return f(actions)
        return _apply

    def shift(f):
        def _shift(role, replica_id, devices):
            if role is Role.TRAINING:
                t.training = True
            else:
                t.replicas.add(replica_id)
            return f(role, replica_id, devices)
        return _shift

    _wrap(c, "sync", sync)
    _wrap(c, "apply", apply)
    _wrap(c, "shift_up", shift)
    _wrap(c, "shift_down", shift)


def _journal_workflow(wf: Workflow, t: Touched, expected: dict[Role, set[int]]) -> None:
    ro, rm = expected[Role.ROLLOUT], expected[Role.REWARD]

    def release(f):
        def _release():
            out = f()
            for seq in out:
                ro.add(seq.seq_id)
                t.seqs.add(seq.seq_id)
            return out
        return _release

    def response_done(f):
        def _response_done(seq_id):
            judge = f(seq_id)
            ro.discard(seq_id)
            t.seqs.add(seq_id)
            if judge is not None:
                rm.add(judge.seq_id)
                t.seqs.add(judge.seq_id)
            return judge
        return _response_done

    def judgement_done(f):
        def _judgement_done(seq_id):
            f(seq_id)
            rm.discard(seq_id)
            t.seqs.add(seq_id)
        return _judgement_done

    _wrap(wf, "release", release)
    _wrap(wf, "response_done", response_done)
    _wrap(wf, "judgement_done", judgement_done)
