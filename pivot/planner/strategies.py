"""The comparison strategies of sec. 8.4, behind the same ``Planner`` interface.

- ``NoShiftPlanner``: static allocation (the disaggregated baseline): never shifts.
- ``StaticPlanner``: training lends its devices, split evenly between rollout and reward,
  while its next batch is not ready, and takes the same devices back when it is.
- ``RuleBasedPlanner``: a role shifts up when its KV utilisation exceeds ``up`` (0.8) and
  a replica shifts down when its role's utilisation falls below ``down`` (0.1).
The ablations "vanilla" and "+ throughput model" are ``VanillaPlanner`` and
``ThroughputModelPlanner`` in ``pivot.planner.pivot_planner``.
"""

from __future__ import annotations

import gin

from pivot.config.validation import check, check_range
from pivot.planner.base import Planner
from pivot.scheduler.throughput import ThroughputModel
from pivot.types import INFERENCE_ROLES, Role, RoleLoad, ShiftDown, ShiftPlan, WorkloadSnapshot


@gin.configurable
class NoShiftPlanner(Planner):
    """Never shifts: each role keeps the devices it started with."""

    reads_lengths = False
    places_replicas = False

    def __init__(self, rollout_model: ThroughputModel | None = None,
                 reward_model: ThroughputModel | None = None) -> None:
        self.models = {Role.ROLLOUT: rollout_model, Role.REWARD: reward_model}

    def _plan(self, snap: WorkloadSnapshot) -> ShiftPlan | None:
        return None


@gin.configurable
class StaticPlanner(Planner):
    """Args:
        home_devices: training's own devices; they are lent out and taken back.
        aligned_blocks: lend whole aligned blocks of a host (``Planner.aligned_blocks``).
    """

    def __init__(self, rollout_model: ThroughputModel, reward_model: ThroughputModel,
                 home_devices: tuple[int, ...] = (), aligned_blocks: bool = False) -> None:
        super().__init__(rollout_model, reward_model, aligned_blocks)
        check(isinstance(home_devices, (tuple, list)) and all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in home_devices)
              and len(set(home_devices)) == len(home_devices), "StaticPlanner.home_devices",
              home_devices, "must be distinct device indices >= 0 (() : training's own)")
        self.home = tuple(home_devices)

    def check_fits(self, devices: int, max_replicas: dict[Role, int], where: str) -> None:
        check(all(d < devices for d in self.home), "StaticPlanner.home_devices", self.home,
              f"device indices must be < {devices} ({where})")

    def _plan(self, snap: WorkloadSnapshot) -> ShiftPlan | None:
        home = set(self.home or snap.training.devices)
        if not self.home and snap.training.devices:
            self.home = tuple(snap.training.devices)
        tr = snap.training
        if tr.batch_ready and not tr.devices:
            donors: list[ShiftDown] = []
            idle = tuple(d for d in snap.idle_devices if d in home)
            if idle:
                donors.append(ShiftDown(None, None, idle))
            for role in INFERENCE_ROLES:
                for r in snap.role_load(role).replicas:
                    if home.intersection(r.devices):
                        donors.append(ShiftDown(role, r.replica_id, r.devices))
            return self._training_plan(snap, donors)
        if tr.devices or tr.batch_ready:
            return None
        # Lend idle home devices: rollout and reward alternately, one replica at a time,
        # so that the split is even in devices.
        idle = [d for d in snap.idle_devices if d in home]
        if not idle:
            return None
        lent = {role: sum(len(r.devices) for r in snap.role_load(role).replicas
                          if home.intersection(r.devices)) for role in INFERENCE_ROLES}
        order = sorted(INFERENCE_ROLES, key=lambda r: (lent[r], r is Role.REWARD))
        for role in order:
            load = snap.role_load(role)
            groups = self.cut(snap, idle, load.replica_devices)
            if groups and len(load.replicas) < load.max_replicas:
                g = groups[0]
                return ShiftPlan(role, (ShiftDown(None, None, g),), (g,),
                                 reason=f"static: lend training devices to {role.value}")
        return None


def kv_utilisation(load: RoleLoad) -> float:
    """Tokens held over KV capacity across a role's replicas; waiting work with no replica
    counts as full (the role needs devices)."""
    cap = sum(r.kv_capacity for r in load.replicas)
    if cap == 0:
        return float("inf") if load.waiting else 0.0
    waiting = sum(length for _, length in load.waiting)
    return (sum(r.num_tokens for r in load.replicas) + waiting) / cap


@gin.configurable
class RuleBasedPlanner(Planner):
    """Args:
        up / down: KV utilisation thresholds (sec. 8.4: 0.8 and 0.1).
        aligned_blocks: place replicas on aligned blocks of a host
            (``Planner.aligned_blocks``).
    """

    def __init__(self, rollout_model: ThroughputModel, reward_model: ThroughputModel,
                 up: float = 0.8, down: float = 0.1, aligned_blocks: bool = False) -> None:
        super().__init__(rollout_model, reward_model, aligned_blocks)
        check_range("RuleBasedPlanner.up", up, 0, open_lo=True, why="KV utilisation")
        check_range("RuleBasedPlanner.down", down, 0, why="KV utilisation")
        check(down < up, "RuleBasedPlanner.down", down,
              f"must be below RuleBasedPlanner.up={up} (0 <= down < up)")
        self.up, self.down = up, down

    def _plan(self, snap: WorkloadSnapshot) -> ShiftPlan | None:
        if snap.training.batch_ready and not snap.training.devices:
            return self.training_up(snap)
        util = {r: kv_utilisation(snap.role_load(r)) for r in INFERENCE_ROLES}
        tr = snap.training
        spare_training = tr.devices if tr.devices and not tr.busy else ()
        for role in sorted(INFERENCE_ROLES, key=lambda r: -util[r]):
            load = snap.role_load(role)
            if util[role] <= self.up or len(load.replicas) >= load.max_replicas:
                continue
            other = Role.REWARD if role is Role.ROLLOUT else Role.ROLLOUT
            groups = self.cut(snap, snap.idle_devices, load.replica_devices)
            if groups:
                return ShiftPlan(role, (ShiftDown(None, None, groups[0]),), (groups[0],),
                                 reason=f"rule: {role.value} KV {util[role]:.2f} > {self.up}")
            if spare_training:
                groups = self.cut(snap, spare_training, load.replica_devices)
                if groups:
                    return ShiftPlan(role, (ShiftDown(Role.TRAINING, None, spare_training),),
                                     tuple(groups), reason="rule: idle training lends")
            if util[other] < self.down and snap.role_load(other).replicas:
                victim = min(snap.role_load(other).replicas, key=lambda r: r.num_tokens)
                groups = self.cut(snap, victim.devices, load.replica_devices)
                if groups:
                    return ShiftPlan(role, (ShiftDown(other, victim.replica_id,
                                                      victim.devices),), tuple(groups),
                                     reason=f"rule: {other.value} KV {util[other]:.2f} < "
                                            f"{self.down}")
        # A role far below its threshold gives a replica back to the idle pool, as long as
        # it keeps one.
        for role in INFERENCE_ROLES:
            load = snap.role_load(role)
            if util[role] < self.down and len(load.replicas) > 1:
                victim = min(load.replicas, key=lambda r: r.num_tokens)
                return ShiftPlan(role, (ShiftDown(role, victim.replica_id, victim.devices),),
                                 (), reason=f"rule: {role.value} KV {util[role]:.2f} < "
                                            f"{self.down}, release a replica")
        return None
