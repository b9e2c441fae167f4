"""The control plane's invariants checked at every event from what the event changed.

``check_state`` reads the whole state, O(devices + replicas + live sequences): about 1 to
7 ms per event on a 1024-device simulated cluster. ``IncrementalChecker.check`` applies the
same rules (I1 to I5 of ``pivot.reliability.invariants``) to:

- the sequences and replicas the event touched, which the source records in a
  ``Touched`` journal (``pivot.reliability.sim_state.SimSource`` fills it from the
  scheduler, cluster and workflow calls);
- the devices whose slot state changed: the device map's own event log, read from a
  cursor, plus the devices a touched replica (or training) gained or released;
- O(1) counters that catch what a touch list could miss: live sequences per role against
  the expected ones, waiting + running against live, engines against scheduler views,
  ACTIVE devices in the map (counted from its events) against devices held.

It keeps small indexes (device -> holder, holder -> devices, replica -> role and running
count) updated from the touched items. ``full`` runs the incremental pass, then
``check_state`` and the prefix ledger over everything, and compares the indexes and the
expected sets with ones rebuilt from scratch: a change the journal missed shows up as a
``checker`` violation, and any invariant it hid is still caught by the full check, so an
incremental bug cannot hide a violation for longer than one full-check period.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from pivot.errors import StateError
from pivot.reliability.invariants import (ControlState, EngineReplica, PrefixLedger,
                                          check_state, engine_replica, replica_device,
                                          training_device)
from pivot.scheduler.scheduler import ShiftAwareScheduler
from pivot.shifting.device_map import DeviceMap
from pivot.shifting.role_shift import SlotKind
from pivot.types import ReplicaView, Role

TRAINING = "<training>"
"""Holder id of training's devices in the checker's index (never a replica id)."""


@dataclass
class Touched:
    """What changed since the last check: sequence ids, replica ids, and whether training's
    devices changed. Filled by the source, emptied by the checker."""

    seqs: set[int] = field(default_factory=set)
    replicas: set[str] = field(default_factory=set)
    training: bool = False

    def clear(self) -> None:
        self.seqs.clear()
        self.replicas.clear()
        self.training = False


class LiveSource(Protocol):
    """The live state the incremental checker reads (``sim_state.SimSource``; tests use
    ``pivot.testing.reliability.StaticSource``)."""

    schedulers: Mapping[Role, ShiftAwareScheduler]
    device_map: DeviceMap
    touched: Touched

    def engine(self, rid: str) -> EngineReplica | None:
        """What the engine of ``rid`` runs; None when it has none (or engines are unknown)."""
        ...

    def engine_count(self) -> int | None:
        """Number of engines; None: the source does not know its engines (no cross-check)."""
        ...

    def training_devices(self) -> tuple[int, ...]: ...

    def counters(self) -> tuple[int, int, int]:
        """(policy version, rollout steps released, staleness bound)."""
        ...

    def expected(self) -> Mapping[Role, set[int]] | None:
        """The sequences that must be live, kept up to date per event; None skips I1's
        ledger part."""
        ...

    def full_state(self) -> ControlState:
        """The whole state for ``check_state``, its expected sets derived from scratch."""
        ...


@dataclass
class CheckStats:
    """What the checker did: passes, items checked, wall seconds."""

    incremental: int = 0
    full: int = 0
    seqs: int = 0
    replicas: int = 0
    devices: int = 0
    incremental_s: float = 0.0
    full_s: float = 0.0


@dataclass
class _Index:
    """Who holds which device, each replica's role and running count, ACTIVE devices."""

    holder: dict[int, str] = field(default_factory=dict)
    held: dict[str, tuple[int, ...]] = field(default_factory=dict)
    role_of: dict[str, Role] = field(default_factory=dict)
    running: dict[str, int] = field(default_factory=dict)
    running_total: dict[Role, int] = field(default_factory=dict)
    active: int = 0

    @classmethod
    def build(cls, src: LiveSource) -> _Index:
        """From a full scan of the source (O(devices + replicas))."""
        idx = cls(running_total={r: 0 for r in src.schedulers})
        for role, sched in src.schedulers.items():
            for rid, v in sched.replicas.items():
                idx.role_of[rid] = role
                idx.running[rid] = len(v.running)
                idx.running_total[role] += len(v.running)
                idx.held[rid] = tuple(v.devices)
                for d in v.devices:
                    idx.holder[d] = rid
        tr = tuple(src.training_devices())
        if tr:
            idx.held[TRAINING] = tr
            for d in tr:
                idx.holder[d] = TRAINING
        idx.active = sum(1 for st in src.device_map.states if st.kind is SlotKind.ACTIVE)
        return idx

    def diff(self, other: _Index) -> list[str]:
        """What differs from ``other`` (the rebuilt index), as short descriptions."""
        out = []
        for name in ("holder", "held", "role_of", "running", "running_total"):
            a, b = getattr(self, name), getattr(other, name)
            if a != b:
                keys = sorted((k for k in a.keys() | b.keys() if a.get(k) != b.get(k)), key=str)
                out.append(f"{name} differs at {keys[:5]}")
        if self.active != other.active:
            out.append(f"active devices {self.active} != {other.active}")
        return out


class IncrementalChecker:
    """Checks I1 to I5 at every event from what changed; ``full`` checks everything.

    Args:
        source: the live state and its journal of touched items.
        ledger: the prefix ledger (I5); a new one by default.

    The checker starts from a full scan of ``source`` (no violation is checked then: call
    ``full`` for that) and clears its journal.
    """

    def __init__(self, source: LiveSource, ledger: PrefixLedger | None = None) -> None:
        self.src = source
        self.ledger = ledger if ledger is not None else PrefixLedger()
        self.stats = CheckStats()
        self._resync()

    # ------------------------------------------------------------------- passes
    def check(self) -> list[str]:
        """The incremental pass: every invariant, over what changed since the last pass."""
        t0 = time.perf_counter()
        src = self.src
        touched = src.touched
        out: list[str] = []
        version, released, staleness = src.counters()
        if released - version > staleness + 1:
            out.append(f"I2 staleness: {released} steps released at policy version {version} "
                       f"exceeds staleness {staleness}")
        devs = self._map_changes()
        out += self._holders(touched, devs)
        n_engines = src.engine_count()
        for rid in touched.replicas:
            out += self._replica(rid, n_engines is not None)
        states = src.device_map.states
        for d in devs:
            out += self._device(d, states[d])
        expected = src.expected()
        for sid in touched.seqs:
            out += self._sequence(sid, expected)
        out += self._counters(expected, n_engines)
        st = self.stats
        st.incremental += 1
        st.seqs += len(touched.seqs)
        st.replicas += len(touched.replicas)
        st.devices += len(devs)
        touched.clear()
        st.incremental_s += time.perf_counter() - t0
        return out

    def full(self) -> list[str]:
        """The incremental pass, then ``check_state`` and the ledger over every live
        sequence, then the indexes compared with a rebuild (``checker`` violations name a
        change the journal missed); the checker then resynchronises."""
        out = self.check()
        t0 = time.perf_counter()
        state = self.src.full_state()
        out += check_state(state)
        out += self.ledger.observe({s: q for sc in self.src.schedulers.values()
                                    for s, q in sc.seqs.items()})
        fresh = _Index.build(self.src)
        drift = self.idx.diff(fresh)
        mine, truth = self.src.expected(), state.expected_live
        if mine is not None and truth is not None:
            for role in mine.keys() | truth.keys():
                a, b = mine.get(role, set()), truth.get(role, set())
                if a != b:
                    drift.append(f"expected {role.value} differs at {sorted(a ^ b)[:5]}")
        out += [f"checker: incremental index drifted from the state ({x}); a change was "
                f"not journaled" for x in drift]
        self.idx = fresh
        self.stats.full += 1
        self.stats.full_s += time.perf_counter() - t0
        return out

    # ------------------------------------------------------------------- pieces
    def _resync(self) -> None:
        self.idx = _Index.build(self.src)
        self._cursor = len(self.src.device_map.events)
        self.src.touched.clear()

    def _map_changes(self) -> set[int]:
        """Devices with map events since the last pass; keeps the ACTIVE count."""
        events = self.src.device_map.events
        devs: set[int] = set()
        active = SlotKind.ACTIVE
        n = 0
        for i in range(self._cursor, len(events)):
            e = events[i]
            devs.add(e.device)
            n += (e.after.kind is active) - (e.before.kind is active)
        self.idx.active += n
        self._cursor = len(events)
        return devs

    def _devices_of(self, holder: str) -> tuple[int, ...]:
        if holder == TRAINING:
            return tuple(self.src.training_devices())
        _, v = self._view(holder)
        return tuple(v.devices) if v is not None else ()

    def _view(self, rid: str) -> tuple[Role | None, ReplicaView | None]:
        for role, sched in self.src.schedulers.items():
            v = sched.replicas.get(rid)
            if v is not None:
                return role, v
        return None, None

    def _holders(self, touched: Touched, devs: set[int]) -> list[str]:
        """Re-reads the devices of touched replicas and training: releases first, then
        claims (a device passed from one holder to another in one event is no conflict)."""
        out: list[str] = []
        idx = self.idx
        holders = list(touched.replicas) + ([TRAINING] if touched.training else [])
        now = {}
        for h in holders:
            now[h] = self._devices_of(h)
            for d in idx.held.pop(h, ()):
                if idx.holder.get(d) == h:
                    del idx.holder[d]
                devs.add(d)
        for h, cur in now.items():
            if len(set(cur)) != len(cur):
                who = "training" if h == TRAINING else f"replica {h}"
                out.append(f"I3 {who} lists a device twice: {sorted(cur)}")
            for d in cur:
                other = idx.holder.get(d)
                if other is not None and other != h and d in self._devices_of(other):
                    name = "training" if h == TRAINING else h
                    out.append(f"I3 device {d} held by both "
                               f"{'training' if other == TRAINING else other} and {name}")
                idx.holder[d] = h
                devs.add(d)
            if cur:
                idx.held[h] = cur
        return out

    def _replica(self, rid: str, engines_known: bool) -> list[str]:
        out: list[str] = []
        idx = self.idx
        found = [(role, sched) for role, sched in self.src.schedulers.items()
                 if rid in sched.replicas]
        if len(found) > 1:
            out.append(f"I3 replica {rid} is active in both "
                       f"{' and '.join(r.value for r, _ in found)}")
        old_role = idx.role_of.pop(rid, None)
        if old_role is not None:
            idx.running_total[old_role] -= idx.running.pop(rid, 0)
        eng = self.src.engine(rid) if engines_known else None
        if not found:
            if eng is not None:
                out.append(f"I3 scheduler replicas [] have no engine; engines ['{rid}'] "
                           f"no view")
                out += engine_replica(rid, eng, None)
            return out
        role, sched = found[0]
        v = sched.replicas[rid]
        try:
            sched.check_replica(rid)
        except StateError as e:
            out.append(f"I1/I4 {role.value} scheduler: {e}")
        idx.role_of[rid] = role
        idx.running[rid] = len(v.running)
        idx.running_total[role] = idx.running_total.get(role, 0) + len(v.running)
        if engines_known:
            if eng is None:
                out.append(f"I3 scheduler replicas ['{rid}'] have no engine; engines [] "
                           f"no view")
            else:
                out += engine_replica(rid, eng, v.running)
        return out

    def _device(self, d: int, st) -> list[str]:
        h = self.idx.holder.get(d)
        if h == TRAINING:
            return training_device(d, st)
        if h is not None:
            return replica_device(d, st, self.idx.role_of.get(h), h)
        if st.kind is SlotKind.ACTIVE:
            return [f"I3 devices [{d}] are active in the device map but no replica or "
                    f"training holds them"]
        return []

    def _sequence(self, sid: int, expected: Mapping[Role, set[int]] | None) -> list[str]:
        out: list[str] = []
        live = [(role, sched) for role, sched in self.src.schedulers.items()
                if sid in sched.seqs]
        if len(live) > 1:
            out.append(f"I1 sequence {sid} is live in both "
                       f"{' and '.join(r.value for r, _ in live)}")
        if expected is not None:
            for role, sched in self.src.schedulers.items():
                want, have = sid in expected.get(role, ()), sid in sched.seqs
                if want and not have:
                    out.append(f"I1 {role.value}: sequences [{sid}] lost (1)")
                elif have and not want:
                    out.append(f"I1 {role.value}: sequences [{sid}] unexpected or "
                               f"duplicated (1)")
        if not live:
            self.ledger.forget(sid)
            return out
        role, sched = live[0]
        try:
            sched.check_sequence(sid)
        except StateError as e:
            out.append(f"I1/I4 {role.value} scheduler: {e}")
        out += self.ledger.observe_one(sid, sched.seqs[sid])
        return out

    def _counters(self, expected: Mapping[Role, set[int]] | None,
                  n_engines: int | None) -> list[str]:
        out: list[str] = []
        idx = self.idx
        n_views = 0
        for role, sched in self.src.schedulers.items():
            n = len(sched.seqs)
            n_views += len(sched.replicas)
            if expected is not None and n != len(expected.get(role, ())):
                out.append(f"I1 {role.value}: {n} live sequences, "
                           f"{len(expected.get(role, ()))} expected")
            q, r = len(sched.queue), idx.running_total.get(role, 0)
            if q + r != n:
                out.append(f"I1 {role.value}: {q} waiting + {r} running != {n} live "
                           f"sequences")
        if n_engines is not None and n_engines != n_views:
            out.append(f"I3 {n_views} scheduler replicas but {n_engines} engines")
        if idx.active != len(idx.holder):
            out.append(f"I3 {idx.active} devices are active in the device map, "
                       f"{len(idx.holder)} held by replicas and training")
        return out
