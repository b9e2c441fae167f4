"""The workload monitor (sec. 4, "Workflow"): turns the live control-plane state into the
``WorkloadSnapshot`` the planner reads. Shared by every driver.
"""

from __future__ import annotations

from dataclasses import dataclass

from pivot.scheduler.scheduler import ShiftAwareScheduler
from pivot.types import Role, RoleLoad, TrainingLoad, WorkloadSnapshot


@dataclass(frozen=True, slots=True)
class RoleShape:
    """Static facts of an inference role in a deployment."""

    replica_devices: int
    kv_capacity: int
    max_replicas: int
    tau_shift: float


def role_load(sched: ShiftAwareScheduler, shape: RoleShape) -> RoleLoad:
    """The monitor's view of one role: copies of its replicas and its queue's lengths."""
    return RoleLoad(
        role=sched.role,
        replicas=[v.copy() for v in sched.replicas.values()],
        waiting=sched.queue.entries(),
        replica_devices=shape.replica_devices,
        kv_capacity=shape.kv_capacity,
        max_replicas=shape.max_replicas,
        tau_shift=shape.tau_shift,
    )


def snapshot(time: float, schedulers: dict[Role, ShiftAwareScheduler],
             shapes: dict[Role, RoleShape], training: TrainingLoad,
             device_host: tuple[int, ...], idle_devices: tuple[int, ...] = (),
             lost_devices: tuple[int, ...] = ()) -> WorkloadSnapshot:
    """Builds the planner's input from the schedulers of both inference roles."""
    return WorkloadSnapshot(
        time=time,
        rollout=role_load(schedulers[Role.ROLLOUT], shapes[Role.ROLLOUT]),
        reward=role_load(schedulers[Role.REWARD], shapes[Role.REWARD]),
        training=training,
        device_host=device_host,
        idle_devices=tuple(idle_devices),
        lost_devices=tuple(lost_devices),
    )
