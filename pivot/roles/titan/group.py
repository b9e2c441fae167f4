"""The training replica's process group: gloo across the slots training holds (sec. 5.2).

Training shifts as a whole onto the devices the planner gives it, which change from one
shift up to the next under PivotRL. Each device proc (a slot) also hosts vLLM engines,
which own ``torch.distributed``'s default group (world size 1), so the trainer's group is
a separate gloo group (``pivot.compat.torch_dist``) over a TCP store that the controller
hosts, one key prefix per group:

    store = GroupStore()                               # controller, once
    spec = store.spec(devices=(0, 2))                  # at each training shift up
    group = JoinedGroup.join(spec, device=2)           # in each slot, concurrently
    group.pg, group.mesh, group.rank                   # rank = index of 2 in spec.devices
    group.close()                                      # when training leaves these slots

The process group is preserved context (sec. 5.2): a shift up on the same devices as the
last one reuses it (the controller hands out the same spec, ``GroupStore.spec``); another
set of devices gets a new group under a new key, and each slot closes its old one.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pivot.errors import StateError

__all__ = ["GroupSpec", "GroupStore", "JoinedGroup"]


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """What a slot needs to join a training group (picklable, sent with the shift up).

    Attributes:
        key: unique per group the controller formed (the store prefix and group name).
        devices: the replica's devices in rank order.
        host / port: the controller's TCP store.
    """

    key: str
    devices: tuple[int, ...]
    host: str
    port: int

    @property
    def size(self) -> int:
        return len(self.devices)

    def rank_of(self, device: int) -> int:
        if device not in self.devices:
            raise StateError(f"device {device} is not in training group {self.key} "
                             f"(devices {list(self.devices)})")
        return self.devices.index(device)


@dataclass
class GroupStore:
    """The controller's side: a TCP store server and the spec of each training group.

    Attributes:
        host: the address slots connect to (this host: every local slot is on it).
        prefix: makes keys unique across controllers sharing a process.
    """

    host: str = "127.0.0.1"
    prefix: str = "train"
    _store: Any = None
    _count: Any = field(default_factory=itertools.count)
    _last: GroupSpec | None = None

    def spec(self, devices: tuple[int, ...]) -> GroupSpec:
        """The group for a training replica on ``devices``: the last one if the devices
        are the same (its process group is preserved in the slots), else a new one."""
        devices = tuple(devices)
        if self._last is not None and self._last.devices == devices:
            return self._last
        if self._store is None and len(devices) > 1:
            import torch.distributed as dist

            self._store = dist.TCPStore(self.host, 0, is_master=True,
                                        wait_for_workers=False,
                                        timeout=timedelta(seconds=120))
        port = self._store.port if self._store is not None else 0
        self._last = GroupSpec(f"{self.prefix}{next(self._count)}", devices, self.host, port)
        return self._last

    def forget(self) -> None:
        """The next spec is a new group (a slot was reset and lost its groups)."""
        self._last = None


@dataclass
class JoinedGroup:
    """One slot's membership of a training group (``pg`` None for a group of one)."""

    spec: GroupSpec
    rank: int
    pg: Any = None
    mesh: Any = None
    join_s: float = 0.0

    @classmethod
    def join(cls, spec: GroupSpec, device: int, timeout_s: float = 120.0,
             backend: str = "gloo") -> "JoinedGroup":
        """Connects to the other ranks (blocks until all of ``spec.devices`` joined).

        ``backend`` is ``Backend.dist``: gloo over the slots' CPUs, or NCCL over their
        GPUs (each slot's one visible GPU, ``torch.cuda.current_device()``)."""
        rank = spec.rank_of(device)
        if spec.size == 1:
            return cls(spec, rank)
        import torch.distributed as dist

        from pivot.compat.torch_dist import side_group, side_group_mesh

        t = time.perf_counter()
        store = dist.TCPStore(spec.host, spec.port, is_master=False,
                              timeout=timedelta(seconds=timeout_s))
        pg = side_group(backend, dist.PrefixStore(f"{spec.key}/", store), rank, spec.size,
                        spec.key, timeout_s)
        mesh = side_group_mesh(pg, device_type="cuda" if backend == "nccl" else "cpu")
        return cls(spec, rank, pg, mesh, time.perf_counter() - t)

    def close(self) -> None:
        if self.pg is not None:
            from pivot.compat.torch_dist import destroy_side_group

            destroy_side_group(self.pg)
            self.pg = self.mesh = None
