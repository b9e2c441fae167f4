"""Provisioning: the one place that allocates procs and spawns actors on them (sec. 5).

Local driver: one host, ``num_devices`` procs standing for devices. A cluster driver would
get its host mesh from a Monarch allocator across nodes here and nothing else would change:
the rest of the runtime sees only the proc mesh and the device -> host map.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch  # noqa: F401  (torch before monarch's C extension, see STACK.md)
from monarch.actor import ProcMesh, this_host

from pivot.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Allocation:
    """A proc mesh with one proc per device, and each device's host."""

    procs: ProcMesh
    device_host: tuple[int, ...]

    def proc(self, device: int) -> ProcMesh:
        """The one-proc slice standing for ``device``."""
        return self.procs.slice(procs=slice(device, device + 1))


def allocate(num_devices: int, hosts: int = 1) -> Allocation:
    """Allocates ``num_devices`` device procs.

    Args:
        num_devices: procs (devices) in total; > 0.
        hosts: hosts to spread them over; the local driver has exactly one.
    """
    if not isinstance(num_devices, int) or num_devices <= 0:
        raise ConfigError(f"allocate: num_devices must be a positive int, got {num_devices!r}")
    if hosts != 1:
        raise ConfigError(f"allocate: hosts={hosts}, but the local driver runs on one host; "
                          f"set hosts=1 (multi-host allocation belongs to the cluster driver)")
    procs = this_host().spawn_procs(per_host={"procs": num_devices}, name="pivot_slots")
    log.info("allocated %d device procs on 1 host", num_devices)
    return Allocation(procs, (0,) * num_devices)


def spawn_on(proc: ProcMesh, name: str, cls, *args):
    """Spawns one actor of ``cls`` as its own mesh on a one-proc mesh, so it can be
    stopped alone (a sliced mesh cannot, STACK.md)."""
    return proc.spawn(name, cls, *args)


def replacement_proc(device: int, host: int) -> ProcMesh:
    """A fresh proc for ``device`` after its process died (local driver: this host)."""
    if host != 0:
        raise ConfigError(f"replacement_proc: device {device} is on host {host}; the local "
                          f"driver has host 0 only")
    return this_host().spawn_procs(per_host={"procs": 1}, name=f"pivot_slot{device}")


def spawn_host_service(name: str, cls, *args):
    """Spawns a per-host service actor (e.g. the parameter store) on a proc of its own."""
    procs = this_host().spawn_procs(per_host={"procs": 1}, name=f"pivot_{name}")
    return procs.spawn(name, cls, *args)
