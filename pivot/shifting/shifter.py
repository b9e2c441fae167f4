"""Shift down and shift up of one replica (or training) on its device slots (sec. 5.2).

``Shifter`` is the bookkeeping half of the runtime: it moves the ``DeviceMap`` through
begin/end transitions around a ``SlotBackend`` that does the slot work (the Monarch mesh
controller in ``pivot.runtime.mesh``, or simulated slots in ``pivot.sim``), and records each
phase's duration as a ``PhaseEvent``. A backend that raises leaves its devices LOST: their
contents are unknown, so the planner must not use them until the controller resets them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

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
    seconds: float = 0.0
    """Set by the ``Shifter``: the replica's shift from start to end on the device map's
    clock (wall or virtual), slot calls and transfers included."""


class SlotBackend(Protocol):
    """The slot work of a shift; implemented by the Monarch mesh controller and the sim.

    A backend may also offer ``start_shift_down`` / ``start_shift_up`` with the same
    arguments, returning at once a handle whose ``get()`` gives the ``ShiftResult``: the
    shifter then overlaps the slot work of several replicas (``shift_*_many``).
    """

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

    def shift_down_many(self, replica_ids: Sequence[str], to_role: Role | None = None
                        ) -> list[ShiftResult | ShiftError]:
        """Shifts several active replicas down at once: their slot work overlaps when the
        backend can start calls without waiting (``start_shift_down``), else it runs one
        replica after the other. Per replica, in order, its result or the ShiftError that
        left its devices LOST; the others still complete."""
        items = self._begin_down(replica_ids, to_role)
        return self._end("down", items, self._run_many("down", items))

    def shift_up_many(self, role: Role, groups: Sequence[tuple[str, tuple[int, ...]]]
                      ) -> list[ShiftResult | ShiftError]:
        """Shifts idle device groups up into new replicas ``(replica_id, devices)`` of
        ``role`` at once (see ``shift_down_many``)."""
        items = self._begin_up(role, groups)
        return self._end("up", items, self._run_many("up", items))

    async def shift_down_many_async(self, replica_ids: Sequence[str],
                                    to_role: Role | None = None
                                    ) -> list[ShiftResult | ShiftError]:
        """``shift_down_many`` that awaits the slot work (the device map changes on the
        caller's thread, before and after)."""
        items = self._begin_down(replica_ids, to_role)
        return self._end("down", items, await self._run_many_async("down", items))

    async def shift_up_many_async(self, role: Role,
                                  groups: Sequence[tuple[str, tuple[int, ...]]]
                                  ) -> list[ShiftResult | ShiftError]:
        """``shift_up_many`` that awaits the slot work."""
        items = self._begin_up(role, groups)
        return self._end("up", items, await self._run_many_async("up", items))

    def _begin_down(self, replica_ids: Sequence[str], to_role: Role | None) -> list[tuple]:
        items = []
        for rid in replica_ids:
            devs = self.device_map.replica_devices(rid)
            if not devs:
                raise StateError(f"shift down: no replica {rid!r} in the device map; active "
                                 f"replicas: {sorted(self.device_map.replicas())}")
            items.append((self.device_map.state(devs[0]).role, rid, devs))
        for _, _, devs in items:
            self.device_map.begin_shift_down(devs, to_role)
        return items

    def _begin_up(self, role: Role, groups: Sequence[tuple[str, tuple[int, ...]]]
                  ) -> list[tuple]:
        role = Role.parse(role)
        items = [(role, rid, tuple(devs)) for rid, devs in groups]
        for _, rid, devs in items:
            self.device_map.begin_shift_up(devs, role, rid)
        return items

    def _end(self, direction: str, items: list[tuple], out: list) -> list:
        end = self.device_map.end_shift_down if direction == "down" else \
            self.device_map.end_shift_up
        for (_, _, devs), res in zip(items, out):
            if isinstance(res, ShiftResult):
                end(devs)
        return out

    def training_replica(self) -> str | None:
        """The id of the active training replica, if any (training shifts as a whole)."""
        ids = self.device_map.replicas(Role.TRAINING)
        return next(iter(ids), None)

    def _run(self, direction: str, role: Role, replica_id: str,
             devs: tuple[int, ...]) -> ShiftResult:
        call = self.backend.shift_down if direction == "down" else self.backend.shift_up
        t0 = self.device_map.clock()
        try:
            result = call(role, replica_id, devs)
        except Exception as exc:
            raise self._failed(direction, role, replica_id, devs, exc) from exc
        result.seconds = self.device_map.clock() - t0
        self._record(direction, role, replica_id, devs, result)
        return result

    def _run_many(self, direction: str, items: Sequence[tuple[Role, str, tuple[int, ...]]]
                  ) -> list[ShiftResult | ShiftError]:
        start = getattr(self.backend, f"start_shift_{direction}", None)
        out: list[ShiftResult | ShiftError] = []
        if start is None or len(items) < 2:
            for role, rid, devs in items:
                try:
                    out.append(self._run(direction, role, rid, devs))
                except ShiftError as e:
                    out.append(e)
            return out
        t0, pending = self.device_map.clock(), self._start_all(start, items)
        for item, p in zip(items, pending):
            out.append(self._settle(direction, item, t0, p, None if isinstance(p, Exception)
                                    else p.get))
        return out

    async def _run_many_async(self, direction: str,
                              items: Sequence[tuple[Role, str, tuple[int, ...]]]
                              ) -> list[ShiftResult | ShiftError]:
        start = getattr(self.backend, f"start_shift_{direction}", None)
        if start is None:   # nothing to await: the backend's calls block
            return self._run_many(direction, items)
        t0, pending = self.device_map.clock(), self._start_all(start, items)
        out: list[ShiftResult | ShiftError] = []
        for item, p in zip(items, pending):
            result: ShiftResult | Exception = p
            if not isinstance(p, Exception):
                try:
                    result = await p.wait() if hasattr(p, "wait") else p.get()
                except Exception as exc:  # noqa: BLE001 - reported per replica
                    result = exc
            out.append(self._settle(direction, item, t0, result, None))
        return out

    @staticmethod
    def _start_all(start: Any, items: Sequence[tuple]) -> list:
        """Starts every replica's slot calls; a start that raised stands in for its handle."""
        pending: list = []
        for role, rid, devs in items:
            try:
                pending.append(start(role, rid, devs))
            except Exception as exc:  # noqa: BLE001 - reported per replica
                pending.append(exc)
        return pending

    def _settle(self, direction: str, item: tuple, t0: float, result: Any,
                get: Any) -> ShiftResult | ShiftError:
        """One replica's outcome: ``get()`` (if given) or ``result``, recorded, or the
        ShiftError that left its devices LOST."""
        role, rid, devs = item
        try:
            if get is not None:
                result = get()
            if isinstance(result, Exception):
                raise result
        except Exception as exc:  # noqa: BLE001 - reported per replica
            err = self._failed(direction, role, rid, devs, exc)
            err.__cause__ = exc
            return err
        result.seconds = self.device_map.clock() - t0
        self._record(direction, role, rid, devs, result)
        return result

    def _failed(self, direction: str, role: Role, replica_id: str, devs: tuple[int, ...],
                exc: BaseException) -> ShiftError:
        reason = f"shift {direction} of {role.value} replica {replica_id} failed: {exc}"
        self.device_map.mark_lost(devs, reason)
        log.error("%s; devices %s marked lost", reason, list(devs))
        return ShiftError(reason)

    def _record(self, direction: str, role: Role, replica_id: str, devs: tuple[int, ...],
                result: ShiftResult) -> None:
        now = self.device_map.clock()
        for phase, secs in result.phases.items():
            self.phase_events.append(
                PhaseEvent(now, direction, role, replica_id, devs, phase, secs))
        log.info("shift %s %s replica %s on %s: %s", direction, role.value, replica_id,
                 list(devs), {k: round(v, 4) for k, v in result.phases.items()})


__all__ = ["PhaseEvent", "ShiftError", "ShiftResult", "Shifter", "SlotBackend"]
