"""The workload monitor (sec. 4, "Workflow"): turns the live control-plane state into the
``WorkloadSnapshot`` the planner reads. Shared by every driver.
"""

from __future__ import annotations

from dataclasses import dataclass

from pivot.scheduler.queue import WaitingEntries
from pivot.scheduler.scheduler import ShiftAwareScheduler
from pivot.types import Role, RoleLoad, TrainingLoad, WorkloadSnapshot


@dataclass(frozen=True, slots=True)
class RoleShape:
    """Static facts of an inference role in a deployment."""

    replica_devices: int
    kv_capacity: int
    max_replicas: int
    tau_shift: float


def role_load(sched: ShiftAwareScheduler, shape: RoleShape, lazy: bool = False) -> RoleLoad:
    """The monitor's view of one role: copies of its replicas and its queue's lengths
    (``lazy``: a ``WaitingEntries`` read on first use, valid until the queue changes)."""
    return RoleLoad(
        role=sched.role,
        replicas=[v.copy() for v in sched.replicas.values()],
        waiting=WaitingEntries(sched.queue) if lazy else sched.queue.entries(),
        replica_devices=shape.replica_devices,
        kv_capacity=shape.kv_capacity,
        max_replicas=shape.max_replicas,
        tau_shift=shape.tau_shift,
        kv_reserve=sched.kv_reserve,
        max_seqs=sched.max_seqs,
    )


def snapshot(time: float, schedulers: dict[Role, ShiftAwareScheduler],
             shapes: dict[Role, RoleShape], training: TrainingLoad,
             device_host: tuple[int, ...], idle_devices: tuple[int, ...] = (),
             lost_devices: tuple[int, ...] = (), lazy_waiting: bool = False
             ) -> WorkloadSnapshot:
    """Builds the planner's input from the schedulers of both inference roles.

    ``lazy_waiting``: the waiting queues are read when the planner first reads them, not
    here (``WaitingEntries``; the simulator, which plans right after the snapshot): a tick
    of a planner that only counts waiting sequences then costs O(replicas), not O(queue)."""
    return WorkloadSnapshot(
        time=time,
        rollout=role_load(schedulers[Role.ROLLOUT], shapes[Role.ROLLOUT], lazy_waiting),
        reward=role_load(schedulers[Role.REWARD], shapes[Role.REWARD], lazy_waiting),
        training=training,
        device_host=device_host,
        idle_devices=tuple(idle_devices),
        lost_devices=tuple(lost_devices),
    )
