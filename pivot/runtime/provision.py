"""Provisioning: the one place that allocates procs and spawns actors on them (sec. 5).

``allocate`` returns one proc per device and each device's host. One host: procs of this
host (the cluster driver). Several hosts: a Monarch job's host mesh, here ``ProcessJob``
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
    """Procs standing for devices: ``procs_per_host`` devices per host, device d on host
    ``d // procs_per_host``, each device ``procs_per_device`` procs (one per role where
    a process holds one role's engine or trainer, ``Backend.proc_per_role``).

    Attributes:
        hosts: the host mesh the procs were spawned on.
        procs: the proc mesh, dims ``procs`` (one host) or ``hosts`` x ``procs``.
        device_host: host index of every device.
        procs_per_host: devices per host.
        job: the Monarch job that owns multi-host hosts (None for this host).
        procs_per_device: procs of one device (the k-th of device d is proc
            ``p * procs_per_device + k`` of its host).
    """

    hosts: HostMesh
    procs: ProcMesh
    device_host: tuple[int, ...]
    procs_per_host: int
    job: Any = None
    procs_per_device: int = 1

    def proc(self, device: int, k: int = 0) -> ProcMesh:
        """The one-proc mesh of ``device``'s k-th proc."""
        if not 0 <= k < self.procs_per_device:
            raise ConfigError(f"Allocation.proc: device {device} has {self.procs_per_device} "
                              f"procs, asked for proc {k}")
        h, p = divmod(device, self.procs_per_host)
        i = p * self.procs_per_device + k
        if self.job is None:
            return self.procs.slice(procs=slice(i, i + 1))
        return self.procs.slice(hosts=h, procs=slice(i, i + 1))

    def replacement(self, device: int, k: int = 0) -> ProcMesh:
        """A fresh proc on ``device``'s host, after its k-th process died."""
        h = self.device_host[device]
        host = self.hosts if self.job is None else self.hosts.slice(hosts=h)
        return host.spawn_procs(per_host={"procs": 1}, name=f"pivot_slot{device}_{k}")

    def close(self) -> None:
        """Ends a multi-host job's host processes (this host's procs end with the client)."""
        if self.job is not None:
            self.job.kill()


def allocate(num_devices: int, hosts: int = 1, job: str = "process",
             procs_per_device: int = 1) -> Allocation:
    """Allocates the procs of ``num_devices`` devices over ``hosts`` hosts.

    Args:
        num_devices: devices in total; > 0 and a multiple of ``hosts``.
        hosts: hosts to spread them over, equally.
        job: the Monarch job type of several hosts (``pivot.gps.hosts.HostJob``:
            ``process``, ``slurm``, ``kubernetes``; ``Backend.job``).
        procs_per_device: procs each device gets (one per role, or one for all).
    """
    if not isinstance(num_devices, int) or num_devices <= 0:
        raise ConfigError(f"allocate: num_devices must be a positive int, got {num_devices!r}")
    if not isinstance(hosts, int) or hosts <= 0 or num_devices % hosts:
        raise ConfigError(f"allocate: hosts={hosts!r} must be a positive int dividing "
                          f"num_devices={num_devices}; give every host as many devices")
    if not isinstance(procs_per_device, int) or procs_per_device <= 0:
        raise ConfigError(f"allocate: procs_per_device must be a positive int, got "
                          f"{procs_per_device!r}")
    per_host = num_devices // hosts
    n = per_host * procs_per_device
    device_host = tuple(d // per_host for d in range(num_devices))
    if hosts == 1:
        host_mesh = this_host()
        procs = host_mesh.spawn_procs(per_host={"procs": n}, name="pivot_slots")
        log.info("allocated %d procs for %d devices on this host", n, num_devices)
        return Allocation(host_mesh, procs, device_host, per_host, None, procs_per_device)
    from pivot.gps.hosts import HostJob
    host_mesh, monarch_job = HostJob(kind=job, hosts=hosts).start()
    procs = host_mesh.spawn_procs(per_host={"procs": n}, name="pivot_slots")
    log.info("allocated %d procs for %d devices on %d hosts (%s job)", n * hosts,
             num_devices, hosts, job)
    return Allocation(host_mesh, procs, device_host, per_host, monarch_job,
                      procs_per_device)


def spawn_on(proc: ProcMesh, name: str, cls, *args):
    """Spawns one actor of ``cls`` as its own mesh on a one-proc mesh, so it can be
    stopped alone (a sliced mesh cannot, docs/stack.md)."""
    return proc.spawn(name, cls, *args)


def spawn_host_service(name: str, cls, *args):
    """Spawns a service actor (e.g. a one-host GPS) on a proc of its own on this host."""
    procs = this_host().spawn_procs(per_host={"procs": 1}, name=f"pivot_{name}")
    return procs.spawn(name, cls, *args)
