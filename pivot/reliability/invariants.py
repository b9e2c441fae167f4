"""The control plane's invariants, checked from its state alone.

``check_state`` is pure: it reads a ``ControlState`` (the schedulers, the device map, the
RL workflow's version counters, and optionally what the engines say they run) and returns
every violation it finds, never repairing anything. ``PrefixLedger`` is the one piece with
memory: it remembers the longest prefix each live sequence has had, so a resumed sequence
whose tokens (or, in the simulator, length) fall behind it is caught.

``check_state`` reads everything (O(devices + replicas + live sequences)); the per-item
rules it shares with ``pivot.reliability.incremental`` (``replica_device``,
``training_device``, ``engine_replica``) let that checker apply the same rules to only
what an event touched.

Invariants:
    I1 no sequence lost or duplicated: the live sequences of each role are exactly the
       expected ones, each either waiting or running on exactly one replica;
    I2 staleness: released rollout steps - policy version <= staleness + 1;
    I3 a device in one role at a time: every replica's devices are active in the device map
       under that replica, training's under training, no device in two replicas, lost
       devices in none, every active device held;
    I4 KV capacity: no replica (scheduler view or engine) holds more tokens than it can;
    I5 prefix: a resumed sequence keeps its prefix (lengths never shrink; token ids extend).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pivot.errors import PivotError, StateError
from pivot.scheduler.scheduler import ShiftAwareScheduler
from pivot.shifting.device_map import DeviceMap, SlotState
from pivot.shifting.role_shift import SlotKind
from pivot.types import Role, SequenceState


class InvariantError(PivotError, AssertionError):
    """An invariant of the control plane was violated; ``violations`` lists each one."""

    def __init__(self, violations: list[str]):
        super().__init__("; ".join(violations[:5]) + (f" (+{len(violations) - 5} more)"
                                                       if len(violations) > 5 else ""))
        self.violations = violations


@dataclass(frozen=True, slots=True)
class EngineReplica:
    """What an engine (simulated or real) says one replica runs."""

    role: Role
    devices: tuple[int, ...]
    kv_capacity: int
    lengths: Mapping[int, int]
    """Sequence id -> true current length (prompt + generated) on the engine."""


@dataclass(frozen=True, slots=True)
class ControlState:
    """Everything the checker reads at one instant.

    Attributes:
        schedulers: the inference roles' schedulers.
        device_map: the device map.
        version / released / staleness: policy version, rollout steps released, bound.
        expected_live: role -> sequence ids that must be live (submitted, not finished);
            None skips I1's ledger part.
        engines: replica id -> what its engine runs; None skips the engine cross-check.
        training_devices: devices training holds.
        awaiting_migration: devices active in the map for an inference replica that its
            scheduler does not hold yet: a shift up whose migrate-up stage waits for the
            fleet (the cluster driver's shifts run beside its polls). Not orphans.
    """

    schedulers: Mapping[Role, ShiftAwareScheduler]
    device_map: DeviceMap
    version: int
    released: int
    staleness: int
    expected_live: Mapping[Role, set[int]] | None = None
    engines: Mapping[str, EngineReplica] | None = None
    training_devices: tuple[int, ...] = ()
    awaiting_migration: frozenset[int] = frozenset()


def check_state(s: ControlState) -> list[str]:
    """Returns every violated invariant as a message (empty: all hold)."""
    out: list[str] = []
    out += _sequences(s)
    if s.released - s.version > s.staleness + 1:
        out.append(f"I2 staleness: {s.released} steps released at policy version {s.version} "
                   f"exceeds staleness {s.staleness}")
    out += _devices(s)
    out += _engines(s)
    return out


def _sequences(s: ControlState) -> list[str]:
    out: list[str] = []
    seen: dict[int, Role] = {}
    for role, sched in s.schedulers.items():
        try:
            sched.check()
        except StateError as e:
            out.append(f"I1/I4 {role.value} scheduler: {e}")
        for sid in sched.seqs:
            if sid in seen:
                out.append(f"I1 sequence {sid} is live in both {seen[sid].value} and "
                           f"{role.value}")
            seen[sid] = role
        if s.expected_live is not None:
            want = s.expected_live.get(role, set())
            have = set(sched.seqs)
            lost, extra = sorted(want - have), sorted(have - want)
            if lost:
                out.append(f"I1 {role.value}: sequences {lost[:10]} lost ({len(lost)})")
            if extra:
                out.append(f"I1 {role.value}: sequences {extra[:10]} unexpected or "
                           f"duplicated ({len(extra)})")
    return out


def _devices(s: ControlState) -> list[str]:
    out: list[str] = []
    states = s.device_map.states  # read once: the checker runs after every event
    owner: dict[int, str] = {d: "training" for d in s.training_devices}
    if len(owner) != len(s.training_devices):
        out.append("I3 training lists a device twice")
    for role, sched in s.schedulers.items():
        for rid, v in sched.replicas.items():
            for d in v.devices:
                if d in owner:
                    out.append(f"I3 device {d} held by both {owner[d]} and {rid}")
                owner[d] = rid
                out += replica_device(d, states[d], role, rid)
    for d in s.training_devices:
        out += training_device(d, states[d])
    orphan = [d for d, st in enumerate(states)
              if st.kind is SlotKind.ACTIVE and d not in owner
              and d not in s.awaiting_migration]
    if orphan:
        out.append(f"I3 devices {orphan[:10]} are active in the device map but no replica "
                   f"or training holds them")
    return out


def replica_device(d: int, st: SlotState, role: Role, rid: str) -> list[str]:
    """I3 for one device a replica holds: active in the map, under that replica and role."""
    if st.kind is not SlotKind.ACTIVE or st.replica_id != rid or st.role is not role:
        return [f"I3 device {d} of {role.value} replica {rid} is {st.describe()} in the "
                f"device map"]
    return []


def training_device(d: int, st: SlotState) -> list[str]:
    """I3 for one device training holds: not lost, active in the map under training."""
    if st.kind is SlotKind.LOST:
        return [f"I3 lost device {d} is held by training"]
    if st.kind is not SlotKind.ACTIVE or st.role is not Role.TRAINING:
        return [f"I3 device {d} of training is {st.describe()} in the device map"]
    return []


def engine_replica(rid: str, eng: EngineReplica,
                   running: Mapping[int, int] | None) -> list[str]:
    """I4 (engine KV), I1 (same sequences as the scheduler's view ``running``) and I5
    (engine lengths never behind the recorded ones) for one replica."""
    out: list[str] = []
    used = sum(eng.lengths.values())
    if used > eng.kv_capacity:
        out.append(f"I4 engine {rid}: {used} KV tokens exceed capacity {eng.kv_capacity}")
    if running is None:
        return out
    if running.keys() != eng.lengths.keys():
        out.append(f"I1 replica {rid}: scheduler runs {sorted(running)[:5]}, engine "
                   f"{sorted(eng.lengths)[:5]}")
    for sid, n in running.items():
        if sid in eng.lengths and eng.lengths[sid] < n:
            out.append(f"I5 sequence {sid} on {rid}: engine length {eng.lengths[sid]} "
                       f"< recorded {n}")
    return out


def _engines(s: ControlState) -> list[str]:
    if s.engines is None:
        return []
    out: list[str] = []
    views = {rid: v for sched in s.schedulers.values() for rid, v in sched.replicas.items()}
    if set(views) != set(s.engines):
        out.append(f"I3 scheduler replicas {sorted(set(views) - set(s.engines))[:5]} have no "
                   f"engine; engines {sorted(set(s.engines) - set(views))[:5]} no view")
    for rid, eng in s.engines.items():
        v = views.get(rid)
        out += engine_replica(rid, eng, None if v is None else v.running)
    return out


@dataclass
class PrefixLedger:
    """Remembers each live sequence's longest prefix (length, and token ids when known)."""

    lengths: dict[int, int] = field(default_factory=dict)
    tokens: dict[int, list[int]] = field(default_factory=dict)
    checks: int = 0

    def observe(self, seqs: Mapping[int, SequenceState]) -> list[str]:
        """Checks ``seqs`` (all live sequences) against their prefixes; then records them.
        Sequences no longer live are forgotten (they finished)."""
        out: list[str] = []
        for sid, seq in seqs.items():
            out += self.observe_one(sid, seq)
        for sid in set(self.lengths) - set(seqs):
            self.forget(sid)
        return out

    def observe_one(self, sid: int, seq: SequenceState) -> list[str]:
        """Checks one live sequence against its prefix, then records it (the incremental
        checker calls this for the sequences an event touched)."""
        out: list[str] = []
        self.checks += 1
        old = self.lengths.get(sid, 0)
        if seq.generated_len < old:
            out.append(f"I5 sequence {sid}: generated {seq.generated_len} tokens, fewer "
                       f"than the {old} it had before (prefix lost)")
        self.lengths[sid] = max(old, seq.generated_len)
        if seq.generated_tokens is not None:
            prev = self.tokens.get(sid, [])
            if seq.generated_tokens[:len(prev)] != prev:
                out.append(f"I5 sequence {sid}: token ids do not extend their prefix of "
                           f"{len(prev)} tokens")
            if len(seq.generated_tokens) >= len(prev):
                self.tokens[sid] = list(seq.generated_tokens)
        return out

    def forget(self, sid: int) -> None:
        """A sequence is no longer live (it finished)."""
        self.lengths.pop(sid, None)
        self.tokens.pop(sid, None)


def raise_if(violations: list[str]) -> None:
    """Raises InvariantError when ``violations`` is not empty."""
    if violations:
        raise InvariantError(violations)
