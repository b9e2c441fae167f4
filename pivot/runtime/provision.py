"""Provisioning: the one place that allocates procs and spawns actors on them (sec. 5).

``allocate`` returns one proc per device and each device's host. One host: procs of this
host (the local driver). Several hosts: a Monarch job's host mesh, here ``ProcessJob``
(each host a local subprocess, the same host-mesh API a cluster allocator returns); a real
cluster swaps in its job type at this one place and nothing else changes: the rest of the
runtime sees only ``Allocation``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch  # noqa: F401  (torch before monarch's C extension, see docs/stack.md)
from monarch.actor import HostMesh, ProcMesh, this_host

from pivot.compat.monarch import plain_python_logs
from pivot.errors import ConfigError

log = logging.getLogger(__name__)
plain_python_logs()   # the client's log lines without Monarch's actor prefix


@dataclass(frozen=True, slots=True)
class Allocation:
    """Procs standing for devices: ``procs_per_host`` per host, device d on host
    ``d // procs_per_host``.

    Attributes:
        hosts: the host mesh the procs were spawned on.
        procs: the proc mesh, dims ``procs`` (one host) or ``hosts`` x ``procs``.
        device_host: host index of every device.
        job: the Monarch job that owns multi-host hosts (None for this host).
    """

    hosts: HostMesh
    procs: ProcMesh
    device_host: tuple[int, ...]
    procs_per_host: int
    job: Any = None

    def proc(self, device: int) -> ProcMesh:
        """The one-proc mesh standing for ``device``."""
        h, p = divmod(device, self.procs_per_host)
        if self.job is None:
            return self.procs.slice(procs=slice(p, p + 1))
        return self.procs.slice(hosts=h, procs=slice(p, p + 1))

    def replacement(self, device: int) -> ProcMesh:
        """A fresh proc on ``device``'s host, after its process died."""
        h = self.device_host[device]
        host = self.hosts if self.job is None else self.hosts.slice(hosts=h)
        return host.spawn_procs(per_host={"procs": 1}, name=f"pivot_slot{device}")

    def close(self) -> None:
        """Ends a multi-host job's host processes (this host's procs end with the client)."""
        if self.job is not None:
            self.job.kill()


def allocate(num_devices: int, hosts: int = 1, job: str = "process") -> Allocation:
    """Allocates ``num_devices`` device procs over ``hosts`` hosts.

    Args:
        num_devices: procs (devices) in total; > 0 and a multiple of ``hosts``.
        hosts: hosts to spread them over, equally.
        job: the Monarch job type of several hosts (``pivot.gps.hosts.HostJob``:
            ``process``, ``slurm``, ``kubernetes``; ``Backend.job``).
    """
    if not isinstance(num_devices, int) or num_devices <= 0:
        raise ConfigError(f"allocate: num_devices must be a positive int, got {num_devices!r}")
    if not isinstance(hosts, int) or hosts <= 0 or num_devices % hosts:
        raise ConfigError(f"allocate: hosts={hosts!r} must be a positive int dividing "
                          f"num_devices={num_devices}; give every host as many devices")
    per_host = num_devices // hosts
    device_host = tuple(d // per_host for d in range(num_devices))
    if hosts == 1:
        host_mesh = this_host()
        procs = host_mesh.spawn_procs(per_host={"procs": per_host}, name="pivot_slots")
        log.info("allocated %d device procs on this host", num_devices)
        return Allocation(host_mesh, procs, device_host, per_host)
    from pivot.gps.hosts import HostJob
    host_mesh, monarch_job = HostJob(kind=job, hosts=hosts).start()
    procs = host_mesh.spawn_procs(per_host={"procs": per_host}, name="pivot_slots")
    log.info("allocated %d device procs on %d hosts (%s job)", num_devices, hosts, job)
    return Allocation(host_mesh, procs, device_host, per_host, monarch_job)


def spawn_on(proc: ProcMesh, name: str, cls, *args):
    """Spawns one actor of ``cls`` as its own mesh on a one-proc mesh, so it can be
    stopped alone (a sliced mesh cannot, docs/stack.md)."""
    return proc.spawn(name, cls, *args)


def spawn_host_service(name: str, cls, *args):
    """Spawns a service actor (e.g. a one-host GPS) on a proc of its own on this host."""
    procs = this_host().spawn_procs(per_host={"procs": 1}, name=f"pivot_{name}")
    return procs.spawn(name, cls, *args)
