"""The mesh controller: owns the device procs, their slots and the device map (sec. 5, 4).

One controller per run. It allocates the procs (``provision``), spawns one long-lived
``SlotActor`` per device (its own actor mesh, so a slot can be stopped or replaced alone),
and is the ``SlotBackend`` of a ``Shifter``: a shift fans the slot endpoint out over the
replica's devices in parallel and reports, per phase, the slowest device's time.

Shifting never restarts a process or an engine; it only changes what the slots hold.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import monarch.actor

from pivot.errors import StateError
from pivot.runtime.provision import Allocation, allocate, spawn_on
from pivot.runtime.slot import SlotActor
from pivot.shifting.contexts import RoleContext
from pivot.shifting.device_map import Clock, DeviceMap
from pivot.shifting.params import ParameterSource
from pivot.shifting.role_shift import SlotKind
from pivot.shifting.shifter import ShiftResult, Shifter
from pivot.types import Role

log = logging.getLogger(__name__)


class MeshController:
    """Device slots on a Monarch proc mesh, shifted through a ``Shifter``.

    Args:
        alloc: the procs (``provision.allocate``).
        source: the parameter source every slot Reads from (picklable client).
        factories: role -> context factory, built once in every slot.
        clock: time source of the device map's events.
        torch_threads: intra-op threads per slot proc (None: torch's default).
    """

    def __init__(self, alloc: Allocation, source: ParameterSource,
                 factories: Mapping[Role, Callable[[], RoleContext]],
                 clock: Clock = time.monotonic, torch_threads: int | None = 1):
        if not factories:
            raise StateError("MeshController: factories is empty; give a context factory "
                             "for each role the slots may take")
        self.alloc = alloc
        self.failures: list[str] = []
        monarch.actor.unhandled_fault_hook = self._on_fault
        t = time.perf_counter()
        self.slots = [spawn_on(alloc, d, f"slot{d}", SlotActor, d, h, source, dict(factories),
                              torch_threads)
                      for d, h in enumerate(alloc.device_host)]
        self.describe_all()  # waits for every constructor, so spawn time is measured whole
        self.spawn_s = time.perf_counter() - t
        self.device_map = DeviceMap(alloc.device_host, clock=clock)
        self.shifter = Shifter(self.device_map, self)
        log.info("spawned %d slots in %.2f s", len(self.slots), self.spawn_s)

    @classmethod
    def local(cls, num_devices: int, source: ParameterSource,
              factories: Mapping[Role, Callable[[], RoleContext]],
              clock: Clock = time.monotonic,
              torch_threads: int | None = 1) -> "MeshController":
        """Allocates ``num_devices`` procs on this host and spawns their slots."""
        return cls(allocate(num_devices), source, factories, clock, torch_threads)

    # ---- SlotBackend -----------------------------------------------------------------
    def shift_down(self, role: Role, replica_id: str, devices: tuple[int, ...]) -> ShiftResult:
        futs = [self.slots[d].shift_down.call_one(role, replica_id) for d in devices]
        return ShiftResult(_slowest([f.get() for f in futs]))

    def shift_up(self, role: Role, replica_id: str, devices: tuple[int, ...]) -> ShiftResult:
        futs = [self.slots[d].shift_up.call_one(role, replica_id) for d in devices]
        phases = _slowest([f.get() for f in futs])
        kv = 0
        if role is not Role.TRAINING:
            infos = [self.slots[d].describe.call_one().get() for d in devices]
            kv = min(i["contexts"][role.value]["kv_capacity"] for i in infos)
        return ShiftResult(phases, kv)

    # ---- inspection and role-specific calls ------------------------------------------
    def describe(self, device: int) -> dict[str, Any]:
        return self._slot(device).describe.call_one().get()

    def describe_all(self) -> list[dict[str, Any]]:
        futs = [s.describe.call_one() for s in self.slots]
        return [f.get() for f in futs]

    def tensors(self, device: int, role: Role, item: str):
        return self._slot(device).tensors.call_one(role, item).get()

    def invoke(self, device: int, method: str, **kwargs: Any) -> Any:
        return self._slot(device).invoke.call_one(method, kwargs).get()

    def write_back(self, device: int) -> float:
        return self._slot(device).write_back.call_one().get()

    def recover(self, devices: tuple[int, ...]) -> float:
        """Resets lost slots (their procs must be alive) and returns them to the idle pool;
        returns the slowest reset's seconds."""
        lost = set(self.device_map.devices_in(SlotKind.LOST))
        bad = [d for d in devices if d not in lost]
        if bad:
            raise StateError(f"recover: devices {bad} are not lost "
                             f"({[self.device_map.state(d).describe() for d in bad]})")
        futs = [self.slots[d].reset.call_one() for d in devices]
        secs = max(f.get() for f in futs)
        self.device_map.recover(devices)
        return secs

    def stop(self) -> None:
        """Stops every slot mesh (the procs stay; ``ProcMesh.stop`` is the caller's)."""
        for s in self.slots:
            s.stop().get()

    def _slot(self, device: int):
        if not 0 <= device < len(self.slots):
            raise StateError(f"device {device} is outside the {len(self.slots)} slots")
        if self.device_map.state(device).kind is SlotKind.LOST:
            raise StateError(f"device {device} is lost; recover it before calling its slot")
        return self.slots[device]

    def _on_fault(self, failure) -> None:
        """Keeps the client alive on a slot failure (the default hook exits it) and marks
        the failed slot's device lost when the failure names its mesh."""
        msg = str(failure)
        self.failures.append(msg)
        name = getattr(failure, "mesh_name", "")
        hit = [d for d, s in enumerate(self.slots) if getattr(s, "name", None) == name
               or f"slot{d}" == name]
        log.error("slot failure on mesh %r (devices %s): %s", name, hit, msg)
        if hit:
            self.device_map.mark_lost(hit, f"slot process failed: {msg[:200]}")


def _slowest(per_device: list[dict[str, float]]) -> dict[str, float]:
    """Phase -> the slowest device's seconds (devices shift in parallel)."""
    out: dict[str, float] = {}
    for phases in per_device:
        for k, v in phases.items():
            out[k] = max(out.get(k, 0.0), v)
    return out
