"""The planner's output: a shift plan (sec. 7.1, app. D.1).

A plan names the role that shifts up, the replicas (or training) that shift down to free
devices for it, and the device groups of the new shift-up replicas. The executor carries it
out in the order shift down, migrate, shift up (sec. 4, "Workflow").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pivot.types import Role


@dataclass(frozen=True, slots=True)
class ShiftDown:
    """One donor: an inference replica, training as a whole, or idle devices.

    ``replica_id`` is ``None`` for training (``role`` TRAINING) and for the idle pool
    (``role`` None); ``devices`` are the devices it frees.
    """

    role: Role | None
    replica_id: str | None
    devices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ShiftPlan:
    """A candidate or chosen shift plan.

    Attributes:
        up_role: the role that gains devices.
        down: donors to shift down first, in order.
        up_devices: one device group per new shift-up replica (training: one group with
            all its devices).
        penalty: phi, tokens forgone while donors stall (sec. 7.1).
        gain: G = H * (T_candidate - T_current) (sec. 7.3); 0 for training shifts.
        benefit: B = G - phi.
        t_current / t_candidate: overall throughput of eq. 1 before and after.
        reason: a short human-readable account, for logs and traces.
    """

    up_role: Role
    down: tuple[ShiftDown, ...]
    up_devices: tuple[tuple[int, ...], ...]
    penalty: float = 0.0
    gain: float = 0.0
    benefit: float = 0.0
    t_current: float = 0.0
    t_candidate: float = 0.0
    reason: str = ""
    timings: dict[str, float] = field(default_factory=dict, compare=False)

    @property
    def num_up(self) -> int:
        return len(self.up_devices)

    @property
    def freed_devices(self) -> tuple[int, ...]:
        return tuple(d for s in self.down for d in s.devices)
