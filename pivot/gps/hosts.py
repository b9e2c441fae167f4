"""GPS on a host mesh: one :class:`GPSActor` per host of a Monarch job (sec. 5.1).

:class:`HostJob` (gin-configurable) is where the host mesh comes from:

* ``process``: Monarch's ``ProcessJob`` -- each host a local subprocess with the same
  host-mesh API a cluster allocator returns (what runs here);
* ``slurm``: Monarch's ``SlurmJob`` (``sbatch`` / ``squeue``); refused with a ConfigError
  on a machine without ``sbatch``, before Monarch's global transport setting is touched;
* ``kubernetes``: Monarch's ``KubernetesJob``; refused with a ConfigError unless the
  ``kubernetes`` Python package is installed (it is not here) -- it needs a cluster.

:func:`spawn_gps` puts one GPSActor on a proc of its own on every host of the mesh and
returns the host handles the client (:class:`GlobalParameterStorage`) takes. Links
between a device and a host of another host go through the client's remote transport
(NIXL, :mod:`pivot.gps.nixl`, falling back to Monarch endpoints).
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from typing import Any, Mapping

import gin

from pivot.config.validation import check_range, fail
from pivot.errors import ConfigError
from pivot.gps.layout import ModelMeta, StorageLayout

logger = logging.getLogger(__name__)

JOB_KINDS = ("process", "slurm", "kubernetes")


@gin.configurable
@dataclass(frozen=True)
class HostJob:
    """Attributes:
        kind: ``process`` (local subprocesses), ``slurm`` or ``kubernetes``.
        hosts: hosts of the job.
        options: extra keyword arguments of the Monarch job class (e.g. ``partition``,
            ``gpus_per_node`` for ``slurm``; ``namespace`` for ``kubernetes``).
    """

    kind: str = "process"
    hosts: int = 2
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in JOB_KINDS:
            fail("HostJob.kind", self.kind, f"must be one of {JOB_KINDS}")
        check_range("HostJob.hosts", self.hosts, 1, integer=True, why="hosts of the job")

    def start(self) -> tuple[Any, Any]:
        """Starts the job; returns ``(host mesh, job)`` (``job.kill()`` ends it)."""
        import torch  # noqa: F401  (torch before monarch's C extension, docs/stack.md)

        if self.kind == "process":
            from monarch.job import ProcessJob

            job = ProcessJob({"hosts": self.hosts}, **self.options)
        elif self.kind == "slurm":
            if shutil.which("sbatch") is None:
                raise ConfigError("HostJob.kind='slurm': no sbatch on this machine; a SLURM "
                                  "job needs a cluster (run from a SLURM login node) or use "
                                  "HostJob.kind='process' to simulate hosts locally")
            from monarch.job import SlurmJob

            job = SlurmJob({"hosts": self.hosts}, **self.options)
        else:
            try:
                import kubernetes  # noqa: F401
            except ImportError:
                raise ConfigError("HostJob.kind='kubernetes': the 'kubernetes' Python package "
                                  "is not installed and there is no cluster here; install it "
                                  "on a machine with a cluster, or use HostJob.kind='process'"
                                  ) from None
            from monarch.job.kubernetes import KubernetesJob

            job = KubernetesJob(**self.options)
            job.add_mesh("hosts", self.hosts)
        mesh = job.state(cached_path=None).hosts
        logger.info("GPS host job %s: %d hosts", self.kind, self.hosts)
        return mesh, job


def spawn_gps(host_mesh: Any, storage: StorageLayout, models: Mapping[str, ModelMeta],
              name: str = "gps") -> tuple[Any, list[Any], list[Any]]:
    """One GPSActor per host of ``host_mesh`` (host ``h`` of the mesh is GPS host ``h``).

    Returns:
        (the proc mesh, the actor meshes in host order, :class:`ActorHost` handles).
    """
    from pivot.gps.actor import ActorHost, GPSActor

    n = host_mesh.size("hosts")
    if n != storage.hosts:
        raise ConfigError(f"spawn_gps: the host mesh has {n} hosts, the GPS layout "
                          f"{storage.hosts}; plan the layout for the job's hosts")
    procs = host_mesh.spawn_procs(per_host={"procs": 1}, name=f"pivot_{name}")
    actors = [procs.slice(hosts=h).spawn(f"{name}{h}", GPSActor, h, storage, dict(models))
              for h in range(n)]
    return procs, actors, [ActorHost(h, a) for h, a in enumerate(actors)]
