"""The device map: which role holds every device slot, with a replayable event log.

Sec. 5.2 and sec. 4 ("Workflow"): a device belongs to exactly one role at a time, or is
idle, shifting, or lost. Every change goes through ``SLOT_TRANSITIONS`` and is recorded as a
timestamped ``MapEvent``; time comes from an injectable clock so the simulator can use
virtual time. The monitor and the traces read the events; ``replay`` rebuilds the map.
Lookups by kind, by replica and of a device's last role are indexed as transitions are
applied, so no query scans the event history (which grows with the run).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from pivot.errors import StateError
from pivot.shifting.role_shift import (
    SHIFT_GRANULARITY, Granularity, SlotKind, Transition, next_kind,
)
from pivot.types import Role

Clock = Callable[[], float]
"""Returns seconds; ``time.monotonic`` for real drivers, the event loop's time in the sim."""


@dataclass(frozen=True, slots=True)
class SlotState:
    """One device slot's state.

    ``role``/``replica_id`` are the owner while ACTIVE, the source while SHIFTING_DOWN and the
    target while SHIFTING_UP; ``from_role``/``to_role`` say which roles a shift moves between
    (None: the idle pool, or not known yet).
    """

    kind: SlotKind
    role: Role | None = None
    replica_id: str | None = None
    from_role: Role | None = None
    to_role: Role | None = None
    reason: str = ""

    def describe(self) -> str:
        if self.kind is SlotKind.ACTIVE:
            return f"active in {self.role.value} replica {self.replica_id}"
        if self.kind in (SlotKind.SHIFTING_DOWN, SlotKind.SHIFTING_UP):
            src = self.from_role.value if self.from_role else "idle"
            dst = self.to_role.value if self.to_role else "idle"
            return f"{self.kind.value} ({src} -> {dst}, replica {self.replica_id})"
        if self.kind is SlotKind.LOST:
            return f"lost ({self.reason})" if self.reason else "lost"
        return "idle"


IDLE = SlotState(SlotKind.IDLE)


@dataclass(frozen=True, slots=True)
class MapEvent:
    """One recorded state change of one device."""

    time: float
    device: int
    host: int
    transition: Transition
    before: SlotState
    after: SlotState


@dataclass
class DeviceMap:
    """Every device slot's host and state, changed only through validated transitions.

    Args:
        device_host: host index of each device; device ids are 0..len-1.
        clock: time source for events.
    """

    device_host: tuple[int, ...]
    clock: Clock = time.monotonic
    states: list[SlotState] = field(init=False)
    events: list[MapEvent] = field(init=False, default_factory=list)
    _last_active: list[Role | None] = field(init=False, repr=False, compare=False)
    """Device -> role it was last ACTIVE in (what a scan of ``events`` would find)."""
    _by_replica: dict[str, set[int]] = field(init=False, repr=False, compare=False,
                                             default_factory=dict)
    """Replica id -> devices whose state names it (active or shifting)."""
    _by_kind: dict[SlotKind, set[int]] = field(init=False, repr=False, compare=False)
    """Slot kind -> devices in it."""
    _active: dict[Role, int] = field(init=False, repr=False, compare=False,
                                     default_factory=dict)
    """Role -> how many devices are ACTIVE in it."""

    def __post_init__(self) -> None:
        self.device_host = tuple(self.device_host)
        if not self.device_host:
            raise StateError("DeviceMap: device_host is empty; give the host of each device")
        if any(h < 0 for h in self.device_host):
            raise StateError(f"DeviceMap: host indices must be >= 0, got {self.device_host}")
        self.states = [IDLE] * len(self.device_host)
        self._last_active = [None] * len(self.device_host)
        self._by_kind = {k: set() for k in SlotKind}
        self._by_kind[SlotKind.IDLE].update(range(len(self.device_host)))

    # ---- queries -------------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        return len(self.device_host)

    def state(self, device: int) -> SlotState:
        self._check_device(device, "state")
        return self.states[device]

    def devices_in(self, kind: SlotKind) -> tuple[int, ...]:
        """Devices in ``kind``, ascending (from the index: O(devices in kind))."""
        return tuple(sorted(self._by_kind[kind]))

    def count(self, kind: SlotKind) -> int:
        """How many devices are in ``kind`` (O(1))."""
        return len(self._by_kind[kind])

    def active_count(self, role: Role) -> int:
        """Devices ACTIVE in ``role`` (O(1); the sum of ``replicas(role)``'s sizes)."""
        return self._active.get(role, 0)

    def replicas(self, role: Role | None = None) -> dict[str, tuple[int, ...]]:
        """Active replicas (id -> devices), optionally of one role."""
        out: dict[str, list[int]] = {}
        for d, s in enumerate(self.states):
            if s.kind is SlotKind.ACTIVE and (role is None or s.role is role):
                out.setdefault(s.replica_id, []).append(d)
        return {k: tuple(v) for k, v in out.items()}

    def replica_devices(self, replica_id: str) -> tuple[int, ...]:
        """Devices whose state names ``replica_id`` (active or shifting), ascending."""
        return tuple(sorted(self._by_replica.get(replica_id, ())))

    # ---- transitions ---------------------------------------------------------------
    def begin_shift_down(self, devices: Iterable[int], to_role: Role | None = None) -> None:
        """Starts shifting one inference replica, or training as a whole, down.

        ``devices`` must be exactly the active devices of one replica.
        """
        devs = self._devices(devices, "shift down")
        first = self.states[devs[0]]
        for d in devs:
            s = self.states[d]
            if s.kind is not SlotKind.ACTIVE:
                self._refuse(d, f"shift down to {_name(to_role)}")
            if s.replica_id != first.replica_id:
                raise StateError(
                    f"shift down: device {d} belongs to replica {s.replica_id}, device "
                    f"{devs[0]} to {first.replica_id}; shift one replica at a time (sec. 5.2)")
        whole = set(self.replica_devices(first.replica_id))
        if whole != set(devs):
            what = ("training shifts as a whole" if SHIFT_GRANULARITY[first.role]
                    is Granularity.WHOLE else "rollout and reward shift whole replicas")
            raise StateError(
                f"shift down: replica {first.replica_id} ({first.role.value}) holds devices "
                f"{sorted(whole)}, asked for {sorted(devs)}; {what} (sec. 5.2)")
        for d in devs:
            self._apply(d, Transition.BEGIN_DOWN, SlotState(
                SlotKind.SHIFTING_DOWN, first.role, first.replica_id, first.role, to_role))

    def end_shift_down(self, devices: Iterable[int]) -> None:
        """Finishes a shift down: the devices join the idle pool."""
        for d in self._devices(devices, "end shift down"):
            if self.states[d].kind is not SlotKind.SHIFTING_DOWN:
                self._refuse(d, "end shift down")
            self._apply(d, Transition.END_DOWN, IDLE)

    def begin_shift_up(self, devices: Iterable[int], role: Role, replica_id: str) -> None:
        """Starts shifting idle ``devices`` up into a new replica of ``role``."""
        role = Role.parse(role)
        devs = self._devices(devices, f"shift up to {role.value}")
        if not replica_id:
            raise StateError(f"shift up to {role.value}: replica_id is empty; name the replica")
        taken = self.replica_devices(replica_id)
        if taken:
            raise StateError(f"shift up: replica id {replica_id} is already used by devices "
                             f"{list(taken)}; pick a new replica id")
        if role is Role.TRAINING:
            busy = [d for d, s in enumerate(self.states)
                    if s.kind is not SlotKind.IDLE and Role.TRAINING in (s.role, s.to_role)]
            if busy:
                raise StateError(f"shift up to training: devices {busy} already hold or join "
                                 f"training; training shifts as a whole (sec. 5.2)")
        for d in devs:
            if self.states[d].kind is not SlotKind.IDLE:
                self._refuse(d, f"shift up to {role.value} replica {replica_id}")
        for d in devs:
            self._apply(d, Transition.BEGIN_UP, SlotState(
                SlotKind.SHIFTING_UP, role, replica_id, self._last_role(d), role))

    def end_shift_up(self, devices: Iterable[int]) -> None:
        """Finishes a shift up: the devices are active in their new replica."""
        for d in self._devices(devices, "end shift up"):
            s = self.states[d]
            if s.kind is not SlotKind.SHIFTING_UP:
                self._refuse(d, "end shift up")
            self._apply(d, Transition.END_UP, SlotState(SlotKind.ACTIVE, s.role, s.replica_id))

    def mark_lost(self, devices: Iterable[int], reason: str) -> None:
        """The devices' processes died or their shift failed midway; never assigned again
        until ``recover``."""
        for d in self._devices(devices, "mark lost"):
            if self.states[d].kind is SlotKind.LOST:
                continue
            self._apply(d, Transition.FAIL, SlotState(SlotKind.LOST, reason=reason))

    def recover(self, devices: Iterable[int]) -> None:
        """Returns reset slots to the idle pool."""
        for d in self._devices(devices, "recover"):
            if self.states[d].kind is not SlotKind.LOST:
                self._refuse(d, "recover")
            self._apply(d, Transition.RECOVER, IDLE)

    # ---- internals -----------------------------------------------------------------
    def _apply(self, device: int, transition: Transition, after: SlotState) -> None:
        before = self.states[device]
        if next_kind(before.kind, transition) is not after.kind:
            self._refuse(device, transition.value)
        self.states[device] = after
        self.events.append(MapEvent(self.clock(), device, self.device_host[device],
                                    transition, before, after))
        self._index(device, before, after)

    def _index(self, device: int, before: SlotState, after: SlotState) -> None:
        """Keeps the lookups in step with ``states`` (O(1) per transition)."""
        if before.kind is SlotKind.ACTIVE:
            self._last_active[device] = before.role
            self._active[before.role] -= 1
        if after.kind is SlotKind.ACTIVE:
            self._active[after.role] = self._active.get(after.role, 0) + 1
        self._by_kind[before.kind].discard(device)
        self._by_kind[after.kind].add(device)
        if before.replica_id is not None:
            devs = self._by_replica[before.replica_id]
            devs.discard(device)
            if not devs:
                del self._by_replica[before.replica_id]
        if after.replica_id is not None:
            self._by_replica.setdefault(after.replica_id, set()).add(device)

    def _last_role(self, device: int) -> Role | None:
        """The role ``device`` was last active in: the ``before.role`` of its latest event
        that left ACTIVE (indexed, not a scan of the event history)."""
        return self._last_active[device]

    def _devices(self, devices: Iterable[int], change: str) -> tuple[int, ...]:
        devs = tuple(devices)
        if not devs:
            raise StateError(f"{change}: no devices given")
        if len(set(devs)) != len(devs):
            raise StateError(f"{change}: devices {list(devs)} name a device twice")
        for d in devs:
            self._check_device(d, change)
        return devs

    def _check_device(self, device: int, change: str) -> None:
        if not isinstance(device, int) or not 0 <= device < self.num_devices:
            raise StateError(f"{change}: device {device!r} is outside the pool of "
                             f"{self.num_devices} devices (0..{self.num_devices - 1})")

    def _refuse(self, device: int, change: str) -> None:
        raise StateError(f"device {device} (host {self.device_host[device]}) is "
                         f"{self.states[device].describe()}; cannot {change}")


def _name(role: Role | None) -> str:
    return role.value if role else "idle"


def replay(device_host: tuple[int, ...], events: Iterable[MapEvent]) -> list[SlotState]:
    """Rebuilds the slot states from an event log, checking every event's ``before``."""
    states = [IDLE] * len(device_host)
    for e in events:
        if states[e.device] != e.before:
            raise StateError(f"replay: event at t={e.time} expects device {e.device} "
                             f"{e.before.describe()}, log has it {states[e.device].describe()}")
        if next_kind(e.before.kind, e.transition) is not e.after.kind:
            raise StateError(f"replay: event at t={e.time} on device {e.device} is not an "
                             f"allowed transition ({e.before.kind.value} -{e.transition.value}->"
                             f" {e.after.kind.value})")
        states[e.device] = e.after
    return states
