"""Shift down and shift up of one replica (or training) on its device slots (sec. 5.2).

``Shifter`` is the bookkeeping half of the runtime: it moves the ``DeviceMap`` through
begin/end transitions around a ``SlotBackend`` that does the slot work (the Monarch mesh
controller in ``pivot.runtime.mesh``, or simulated slots in ``pivot.sim``), and records each
phase's duration as a ``PhaseEvent``. A backend that raises leaves its devices LOST: their
contents are unknown, so the planner must not use them until the controller resets them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

from pivot.errors import PivotError, StateError
from pivot.shifting.device_map import DeviceMap
from pivot.types import Role

log = logging.getLogger(__name__)


class ShiftError(PivotError, RuntimeError):
    """A shift step failed after work had started. ``report`` holds what was done."""

    def __init__(self, message: str, report: object = None):
        super().__init__(message)
        self.report = report


@dataclass(slots=True)
class ShiftResult:
    """What a backend reports for one replica's shift.

    Attributes:
        phases: phase name (e.g. ``discard_temporary``, ``read_parameters``) -> seconds.
        kv_capacity: tokens of KV cache the replica can hold after a shift up (0 otherwise).
    """

    phases: dict[str, float] = field(default_factory=dict)
    kv_capacity: int = 0


class SlotBackend(Protocol):
    """The slot work of a shift; implemented by the Monarch mesh controller and the sim."""

    def shift_down(self, role: Role, replica_id: str, devices: tuple[int, ...]) -> ShiftResult:
        """Applies the shift-down actions of ``role`` on ``devices`` (parallel over them)."""
        ...

    def shift_up(self, role: Role, replica_id: str, devices: tuple[int, ...]) -> ShiftResult:
        """Applies the shift-up actions of ``role`` on ``devices``."""
        ...


@dataclass(frozen=True, slots=True)
class PhaseEvent:
    """One measured phase of one shift, for traces and the monitor."""

    time: float
    direction: str
    role: Role
    replica_id: str
    devices: tuple[int, ...]
    phase: str
    seconds: float


@dataclass
class Shifter:
    """Shifts replicas down and up, keeping the device map and phase events."""

    device_map: DeviceMap
    backend: SlotBackend
    phase_events: list[PhaseEvent] = field(default_factory=list)

    def shift_down(self, replica_id: str, to_role: Role | None = None) -> ShiftResult:
        """Shifts the active replica ``replica_id`` down; its devices become idle."""
        devs = self.device_map.replica_devices(replica_id)
        if not devs:
            raise StateError(f"shift down: no replica {replica_id!r} in the device map; active "
                             f"replicas: {sorted(self.device_map.replicas())}")
        role = self.device_map.state(devs[0]).role
        self.device_map.begin_shift_down(devs, to_role)
        result = self._run("down", role, replica_id, devs)
        self.device_map.end_shift_down(devs)
        return result

    def shift_up(self, role: Role, replica_id: str, devices: tuple[int, ...]) -> ShiftResult:
        """Shifts idle ``devices`` up into a new replica ``replica_id`` of ``role``."""
        role = Role.parse(role)
        devices = tuple(devices)
        self.device_map.begin_shift_up(devices, role, replica_id)
        result = self._run("up", role, replica_id, devices)
        self.device_map.end_shift_up(devices)
        return result

    def training_replica(self) -> str | None:
        """The id of the active training replica, if any (training shifts as a whole)."""
        ids = self.device_map.replicas(Role.TRAINING)
        return next(iter(ids), None)

    def _run(self, direction: str, role: Role, replica_id: str,
             devs: tuple[int, ...]) -> ShiftResult:
        call = self.backend.shift_down if direction == "down" else self.backend.shift_up
        try:
            result = call(role, replica_id, devs)
        except Exception as exc:
            reason = f"shift {direction} of {role.value} replica {replica_id} failed: {exc}"
            self.device_map.mark_lost(devs, reason)
            log.error("%s; devices %s marked lost", reason, list(devs))
            raise ShiftError(reason) from exc
        now = self.device_map.clock()
        for phase, secs in result.phases.items():
            self.phase_events.append(
                PhaseEvent(now, direction, role, replica_id, devs, phase, secs))
        log.info("shift %s %s replica %s on %s: %s", direction, role.value, replica_id,
                 list(devs), {k: round(v, 4) for k, v in result.phases.items()})
        return result


__all__ = ["PhaseEvent", "ShiftError", "ShiftResult", "Shifter", "SlotBackend"]
