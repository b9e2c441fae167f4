"""Runtime helpers for tests (see ``pivot.testing``): a service actor per host of a
multi-host allocation. No driver runs a per-host service yet (the cluster driver's GPS is one
actor on this host, ``pivot.runtime.provision.spawn_host_service``)."""

from __future__ import annotations

from collections.abc import Callable

from pivot.runtime.provision import Allocation


def spawn_per_host(alloc: Allocation, name: str, cls, args: Callable[[int], tuple]) -> list:
    """Spawns one service actor per host of ``alloc`` (e.g. a ``GPSActor``), each on a proc
    of its own on that host; ``args(host)`` gives its constructor arguments."""
    out = []
    for h in range(max(alloc.device_host) + 1):
        host = alloc.hosts if alloc.job is None else alloc.hosts.slice(hosts=h)
        procs = host.spawn_procs(per_host={"procs": 1}, name=f"pivot_{name}{h}")
        out.append(procs.spawn(f"{name}{h}", cls, *args(h)))
    return out
