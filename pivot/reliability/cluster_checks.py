"""The control plane's invariants checked on a live local run (the reliability run,
gin/deployments/forced_shifts.gin).

    checker = ClusterChecker()
    res = ClusterDriver(group, configured_deployment("forced_shifts"), observer=checker,
                        ...).run()
    res.extra["checks"]      # checks run, aborts and resumes seen, violations

``ClusterChecker.attach`` wraps, on one driver's objects only, the two calls after which the
local control plane is between two consistent states (the control loop's ``tick``, the
fleet's ``poll``) and the two through which a sequence's tokens change hands (the fleet's
``apply``, whose aborts write the tokens generated so far back into the generator port,
and the port's ``collect``, which returns finished sequences). A driver without an
observer runs none of this: nothing on the hot path checks whether checking is on.

After every tick and every poll (and once at the end of the run) it checks, reusing the
rules of ``pivot.reliability.invariants`` (``check_state``, ``PrefixLedger``):

I1 no sequence lost or duplicated: every released, untrained trajectory is in exactly one
   place: its response (sequence ``2t``) waiting in the rollout queue, running on exactly
   one rollout replica, or finished and not yet taken by the loop; then its judgement
   (``2t + 1``) likewise on the reward side; then nowhere (rewarded). The generator port
   holds exactly the schedulers' live sequences, on the replica the scheduler placed them
   on; no engine rejected a dispatch; no engine runs a sequence its scheduler view does
   not (at polls, from the lengths the engines just reported); no sequence finishes twice,
   and at the end of a completed run (not resumed) every released sequence finished once.
I2 staleness: released steps - policy version <= staleness + 1.
I3 a device in one role at a time: each device in exactly one slot state of the device
   map (none left mid-shift between two ticks), replicas' and training's devices active
   under them, no active device unheld; every ``slot_every`` ticks and at the end, each
   slot's own active role and replica (``SlotActor.describe``) equal the device map's.
I4 KV capacity: no scheduler view above its replica's KV capacity; at polls, no engine
   holding more tokens than the slot's KV capacity.
I5 prefix: whenever a sequence is aborted its generated tokens are recorded; when it is
   aborted again or finishes, its tokens must start with the recorded prefix.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import gin

from pivot.config.validation import check_bool, check_range
from pivot.reliability.invariants import (ControlState, InvariantError, PrefixLedger,
                                          check_state)
from pivot.scheduler.actions import Abort
from pivot.shifting.role_shift import SlotKind
from pivot.types import Role

log = logging.getLogger(__name__)


@dataclass
class ClusterCheckStats:
    """What a ``ClusterChecker`` saw during one run.

    Attributes:
        checks: where -> state checks run there ("tick", "poll", "end").
        slot_checks: cross-checks of every slot's active role against the device map.
        prefix_checks: sequences checked against their recorded prefix (I5).
        aborts: aborts whose tokens were recorded (one sequence may count several).
        aborted_with_tokens: distinct sequences aborted after generating >= 1 token.
        resumed: sequences that finished after such an abort with their prefix intact.
        finished: sequences the port returned finished.
        failed_steps: sequences returned by a failed engine step that the fleet queued
            again (their tokens recorded as at an abort).
        check_s: wall seconds spent checking.
        violations: violated invariants (all counted; the first ``max_kept`` kept).
    """

    checks: dict[str, int] = field(default_factory=dict)
    slot_checks: int = 0
    prefix_checks: int = 0
    aborts: int = 0
    aborted_with_tokens: int = 0
    resumed: int = 0
    finished: int = 0
    failed_steps: int = 0
    check_s: float = 0.0
    violations: int = 0
    messages: list[str] = field(default_factory=list)


@gin.configurable
@dataclass
class ClusterChecker:
    """The cluster driver's observer (``ClusterDriver.observer``).

    Args:
        slot_every: cross-check the slots against the device map every this many tick
            checks (one ``describe`` per slot; skipped while training runs a step, whose
            slot would hold the call until it ends); 0: only at the end of the run.
        strict: raise ``InvariantError`` at the first violation instead of recording it.
        max_kept: violation messages kept in the stats (every one is counted and logged).
    """

    slot_every: int = 4
    strict: bool = False
    max_kept: int = 50
    stats: ClusterCheckStats = field(default_factory=ClusterCheckStats)
    ledger: PrefixLedger = field(default_factory=PrefixLedger)

    def __post_init__(self) -> None:
        check_range("ClusterChecker.slot_every", self.slot_every, 0, integer=True,
                    why="0: only at the end of the run")
        check_bool("ClusterChecker.strict", self.strict)
        check_range("ClusterChecker.max_kept", self.max_kept, 0, integer=True)
        self._ticks = 0
        self._in_tick = 0   # ticks in flight (a shift awaited)
        self._with_tokens: set[int] = set()   # aborted after >= 1 token: resumes to count
        self._finished: set[int] = set()

    # ------------------------------------------------------------------ wiring
    def attach(self, driver: Any, workflow: Any) -> None:
        """Wraps the driver's control tick, and the steps of the fleet's poll and apply and
        of the port's collect (this driver's instances only; behaviour is unchanged), so
        the blocking and the awaiting forms are both checked. Call after the driver built
        its control plane, before the loop runs."""
        self.wf, self.fleet, self.control = workflow, driver.fleet, driver.control
        self.ctl, self.port = driver.ctl, driver.fleet.port
        self.kv_capacity, self.staleness = driver.kv_capacity, driver.dep.staleness
        self.resumed_run = bool(getattr(driver, "resume", False))
        _wrap(self.control, "tick", self._wrap_tick)
        _wrap(self.fleet, "poll_steps", lambda f: _steps_then(f, lambda: self.check("poll")))
        _wrap(self.fleet, "apply_steps", self._wrap_apply)
        _wrap(self.port, "collect_steps", self._wrap_collect)

    def _wrap_tick(self, tick: Callable) -> Callable:
        """Checks once the tick returned, and counts ticks in flight: a poll between the
        two awaits of a shift may find devices mid-shift (the control plane's shifts run
        beside the loop). The check holds the fleet's lock: a dispatch or poll of the
        loop's in flight at that moment has its scheduler's placements made and its
        engine calls still out (the port records them when they return), a state the
        check would read as two owners of a sequence. (Seen with a TP replica, whose
        first submit waits for its follower rank: 64 false I1 violations in one tick.)"""
        def _tick(*args, **kwargs):
            out = tick(*args, **kwargs)
            if not inspect.isawaitable(out):
                self.check("tick")
                return out

            async def _run():
                self._in_tick += 1
                try:
                    res = await out
                    async with getattr(self.fleet, "lock", None) or contextlib.nullcontext():
                        self.check("tick")
                    return res
                finally:
                    self._in_tick -= 1
            return _run()
        return _tick

    def _wrap_apply(self, apply_steps: Callable) -> Callable:
        def _apply(actions: Iterable[object], *args: Any):
            actions = list(actions)
            seqs = self.port.sequences
            before = {a.seq_id: seqs[a.seq_id].num_aborts for a in actions
                      if isinstance(a, Abort) and a.seq_id in seqs}
            try:
                return (yield from apply_steps(actions, *args))
            finally:
                self._after_aborts(before)
        return _apply

    def _wrap_collect(self, collect_steps: Callable) -> Callable:
        def _collect():
            out = yield from collect_steps()
            self._after_finish(out)
            return out
        return _collect

    # ------------------------------------------------------------------ I5 ledger
    def _after_aborts(self, before: dict[int, int]) -> None:
        """Records the tokens of every sequence an apply really aborted (an abort that
        found the sequence finished is checked when the port returns it)."""
        out: list[str] = []
        for sid, n in before.items():
            seq = self.port.sequences.get(sid)
            if seq is None or seq.num_aborts == n:
                continue
            self.stats.aborts += 1
            out += self.ledger.observe_one(sid, seq)
            if seq.generated_tokens and sid not in self._with_tokens:
                self._with_tokens.add(sid)
                self.stats.aborted_with_tokens += 1
        self._report("abort", out)

    def _after_finish(self, done: dict[int, Any]) -> None:
        """Finished sequences: tokens start with their recorded prefix; none finishes
        twice. The port has set each one's final tokens (``_finish``) and still holds it."""
        out: list[str] = []
        retry = getattr(self.fleet, "will_retry", lambda res: False)
        for sid, res in done.items():
            if retry(res):
                self.stats.failed_steps += 1
                seq = self.port.sequences[sid]
                out += self.ledger.observe_one(sid, seq)
                if seq.generated_tokens:
                    self._with_tokens.add(sid)
                continue
            self.stats.finished += 1
            if sid in self._finished:
                out.append(f"I1 sequence {sid} finished twice")
            self._finished.add(sid)
            seq = self.port.sequences.get(sid)
            if seq is None:
                out.append(f"I1 sequence {sid} finished but the generator port does not "
                           f"hold it")
                continue
            bad = self.ledger.observe_one(sid, seq)
            out += bad
            if not bad and sid in self._with_tokens:
                self.stats.resumed += 1
            self.ledger.forget(sid)
        self._report("finish", out)

    # ------------------------------------------------------------------ state checks
    def check(self, where: str) -> list[str]:
        """Checks I1 to I4 on the live state; ``where`` is "tick", "poll" or "end".
        Returns the violations (recorded in the stats, or raised when ``strict``)."""
        t = time.perf_counter()
        st = self.stats
        st.checks[where] = st.checks.get(where, 0) + 1
        expected, out = self._expected()
        mid_shift = where == "poll" and self._in_tick > 0
        out += check_state(ControlState(
            self.fleet.schedulers, self.ctl.device_map, self.wf.version, self.wf.released,
            self.staleness, expected, None, tuple(self.control.training_devices()),
            self._awaiting_migration() if mid_shift else frozenset()))
        out += self._port()
        out += self._device_states(mid_shift_ok=mid_shift)
        out += self._kv()
        if where == "poll":
            out += self._engines()
        if where == "tick":
            self._ticks += 1
        if where == "end" or (where == "tick" and self.slot_every and
                              self._ticks % self.slot_every == 0 and not self.control.busy):
            out += self._slots()
        if where == "end" and self.wf.done and not self.resumed_run:
            want = 2 * self.wf.released * self.wf.m * self.wf.n
            if len(self._finished) != want:
                out.append(f"I1 the run released {want} sequences (responses and "
                           f"judgements) but {len(self._finished)} finished")
        st.check_s += time.perf_counter() - t
        self._report(where, out)
        return out

    def finish(self) -> list[str]:
        """The end-of-run check (after the loop returned)."""
        return self.check("end")

    def _expected(self) -> tuple[dict[Role, set[int]], list[str]]:
        """Sequences that must be live in each scheduler, from the workflow and what the
        fleet finished but the loop has not taken yet."""
        wf, mn = self.wf, self.wf.m * self.wf.n
        out: list[str] = []
        lo, hi = wf.version * mn, wf.released * mn
        if len(wf.trajs) != hi - lo or any(not lo <= tid < hi for tid in wf.trajs):
            missing = sorted(set(range(lo, hi)) - set(wf.trajs))
            out.append(f"I1 the workflow holds {len(wf.trajs)} untrained trajectories, "
                       f"expected ids {lo}..{hi - 1} (missing {missing[:10]})")
        responses = {r.traj_id for r in self.fleet.responses}
        judgements = {j.traj_id for j in self.fleet.judgements}
        ro: set[int] = set()
        rm: set[int] = set()
        for tid, t in wf.trajs.items():
            if not t.responded:
                if tid not in responses:
                    ro.add(2 * tid)
            elif tid in responses:
                out.append(f"I1 trajectory {tid} responded and its response is pending too")
            elif not t.rewarded:
                if tid not in judgements:
                    rm.add(2 * tid + 1)
            elif tid in judgements:
                out.append(f"I1 trajectory {tid} rewarded and its judgement is pending too")
        return {Role.ROLLOUT: ro, Role.REWARD: rm}, out

    def _port(self) -> list[str]:
        """The generator port holds the schedulers' live sequences, placed where they are."""
        out: list[str] = []
        port = self.port
        live = {sid: seq for sched in self.fleet.schedulers.values()
                for sid, seq in sched.seqs.items()}
        if live.keys() != port.sequences.keys():
            extra = sorted(port.sequences.keys() - live.keys())
            lost = sorted(live.keys() - port.sequences.keys())
            out.append(f"I1 generator port holds {extra[:10]} the schedulers do not; the "
                       f"schedulers hold {lost[:10]} the port does not")
        for sid, seq in live.items():
            p = port.sequences.get(sid)
            if p is not None and sid not in port.finished and p.replica_id != seq.replica_id:
                out.append(f"I1 sequence {sid}: scheduler places it on {seq.replica_id}, the "
                           f"port on {p.replica_id}")
        if port.rejected:
            out.append(f"I1 engines rejected sequences {sorted(port.rejected)[:10]} their "
                       f"scheduler believes run")
        return out

    def _device_states(self, mid_shift_ok: bool = False) -> list[str]:
        """Each device in exactly one slot state (the map's index agrees with its states),
        none left mid-shift between two ticks (``mid_shift_ok``: a poll while a tick's
        shift is awaited)."""
        dm = self.ctl.device_map
        out: list[str] = []
        seen: Counter[int] = Counter()
        for kind in SlotKind:
            for d in dm.devices_in(kind):
                seen[d] += 1
                if dm.states[d].kind is not kind:
                    out.append(f"I3 device {d} is indexed {kind.value} but "
                               f"{dm.states[d].describe()}")
                if kind in (SlotKind.SHIFTING_DOWN, SlotKind.SHIFTING_UP) and not mid_shift_ok:
                    out.append(f"I3 device {d} left {dm.states[d].describe()} between ticks")
        bad = [d for d in range(dm.num_devices) if seen[d] != 1]
        if bad:
            out.append(f"I3 devices {bad[:10]} are in {[seen[d] for d in bad[:10]]} slot "
                       f"states")
        return out

    def _awaiting_migration(self) -> frozenset[int]:
        """Devices up in the map for an inference replica its scheduler does not hold yet
        (a shift whose migrate-up waits for this poll to finish)."""
        dm = self.ctl.device_map
        return frozenset(
            d for d, st in enumerate(dm.states)
            if st.kind is SlotKind.ACTIVE and st.role in self.fleet.schedulers
            and st.replica_id not in self.fleet.schedulers[st.role].replicas)

    def _kv(self) -> list[str]:
        return [f"I4 {role.value} replica {rid}: {v.num_tokens} tokens exceed its KV "
                f"capacity {v.kv_capacity}"
                for role, sched in self.fleet.schedulers.items()
                for rid, v in sched.replicas.items() if v.num_tokens > v.kv_capacity]

    def _engines(self) -> list[str]:
        """From the lengths the engines reported at this poll: KV within the slot's
        capacity, every running sequence known to that replica's view, on one engine."""
        out: list[str] = []
        views = {rid: v for sched in self.fleet.schedulers.values()
                 for rid, v in sched.replicas.items()}
        where: dict[int, str] = {}
        for rid, lens in self.port.lengths.items():
            used = sum(lens.values())
            if used > self.kv_capacity:
                out.append(f"I4 engine {rid}: {used} KV tokens exceed capacity "
                           f"{self.kv_capacity}")
            v = views.get(rid)
            unknown = sorted(set(lens) - set(v.running)) if v is not None else sorted(lens)
            if unknown:
                out.append(f"I1 engine {rid} runs sequences {unknown[:10]} its scheduler "
                           f"view does not")
            for sid in lens:
                if sid in where:
                    out.append(f"I1 sequence {sid} runs on engines {where[sid]} and {rid}")
                where[sid] = rid
        return out

    def _slots(self) -> list[str]:
        """Each slot's own active role and replica against the device map's state."""
        self.stats.slot_checks += 1
        dm = self.ctl.device_map
        out: list[str] = []
        for d, info in enumerate(self.ctl.describe_all()):
            if info.get("dead"):   # reported dead, not yet taken out (pivot.cluster.faults)
                continue
            st = dm.states[d]
            role = info.get("role")
            role = None if role is None else Role.parse(role)
            want = (st.role, st.replica_id) if st.kind is SlotKind.ACTIVE else (None, None)
            if (role, info.get("replica_id")) != want:
                out.append(f"I3 slot {d} holds {role and role.value} replica "
                           f"{info.get('replica_id')}, the device map says {st.describe()}")
        return out

    # ------------------------------------------------------------------ results
    def _report(self, where: str, violations: list[str]) -> None:
        if not violations:
            return
        st = self.stats
        st.violations += len(violations)
        room = self.max_kept - len(st.messages)
        st.messages += [f"{where}: {v}" for v in violations[:max(room, 0)]]
        for v in violations:
            log.error("invariant violated at %s: %s", where, v)
        if self.strict:
            raise InvariantError(violations)

    def report(self) -> dict[str, Any]:
        """The run's figures, JSON-safe."""
        self.stats.prefix_checks = self.ledger.checks
        return asdict(self.stats)


def _wrap(obj: object, name: str, make: Callable[[Callable], Callable]) -> None:
    """Replaces ``obj.name`` (a bound method) by ``make(original)`` on this instance."""
    setattr(obj, name, make(getattr(obj, name)))


def _steps_then(f: Callable, after: Callable[[], object]) -> Callable:
    """Steps ``f`` (``pivot.waits``), then ``after()`` once they returned."""
    def _f(*args, **kwargs):
        out = yield from f(*args, **kwargs)
        after()
        return out
    return _f

