"""Phase-by-phase deployments as shift strategies (sec. 8.2, app. E).

``ColocatedPlanner``: the whole cluster serves one stage at a time: rollout, then reward,
then training (which holds every device), paying the offload/load between them as shifts.
``RolloutRewardColocatedPlanner``: rollout and reward take turns on a shared pool (the
reward turn starts once the oldest batch's responses are all generated), while training
keeps its own devices. Both plan through the same executor as PivotRL.
"""

from __future__ import annotations

from collections.abc import Callable

import gin

from pivot.planner.base import Planner
from pivot.types import INFERENCE_ROLES, Role, ShiftDown, ShiftPlan, WorkloadSnapshot


class _PhasedPlanner(Planner):
    include_training = False
    reads_lengths = False  # counts, devices and training's state only

    def __init__(self, rollout_model=None, reward_model=None,
                 aligned_blocks: bool = False) -> None:
        """``aligned_blocks``: each turn's replicas on aligned blocks of a host
        (``Planner.aligned_blocks``)."""
        super().__init__(rollout_model, reward_model, aligned_blocks)
        self.rollout_done: Callable[[], bool] = lambda: False
        self.last_timings: dict[str, float] = {}

    def bind(self, rollout_done: Callable[[], bool]) -> None:
        """The driver tells the planner when the rollout phase of a batch is over."""
        self.rollout_done = rollout_done

    def _turn_over(self, snap: WorkloadSnapshot, up: Role | None) -> ShiftPlan | None:
        """Every inference replica and idle device goes to ``up`` (None: to training)."""
        down = [ShiftDown(None, None, snap.idle_devices)] if snap.idle_devices else []
        for role in INFERENCE_ROLES:
            if role is up:
                continue
            down += [ShiftDown(role, r.replica_id, r.devices)
                     for r in snap.role_load(role).replicas]
        if (self.include_training and snap.training.devices and not snap.training.busy
                and up is not None):
            down.append(ShiftDown(Role.TRAINING, None, snap.training.devices))
        freed = sorted(d for x in down for d in x.devices)
        if up is None:
            need = snap.training.devices_needed
            if len(freed) + 0 < need:
                return None
            return ShiftPlan(Role.TRAINING, tuple(down), (tuple(freed[:need]),),
                             reason="phase: training")
        groups = self.cut(snap, freed, snap.role_load(up).replica_devices)
        if not groups:
            return None
        return ShiftPlan(up, tuple(down), tuple(groups), reason=f"phase: {up.value}")

    def _plan(self, snap: WorkloadSnapshot) -> ShiftPlan | None:
        tr = snap.training
        ro, rm = snap.rollout, snap.reward
        if self.include_training:
            if tr.devices:
                if tr.busy or tr.batch_ready:
                    return None
                return self._turn_over(snap, Role.ROLLOUT)
            if tr.batch_ready and not ro.num_seqs and not rm.num_seqs:
                return self._turn_over(snap, None)
        if ro.replicas and rm.num_seqs and (self.rollout_done() or not ro.num_seqs):
            return self._turn_over(snap, Role.REWARD)
        if rm.replicas and not rm.num_seqs and ro.num_seqs:
            return self._turn_over(snap, Role.ROLLOUT)
        if not ro.replicas and not rm.replicas and snap.idle_devices:
            if rm.num_seqs:
                return self._turn_over(snap, Role.REWARD)
            if ro.num_seqs:
                return self._turn_over(snap, Role.ROLLOUT)
        return None


@gin.configurable
class ColocatedPlanner(_PhasedPlanner):
    """Colocated baseline: rollout -> reward -> training on the whole cluster."""

    include_training = True


@gin.configurable
class RolloutRewardColocatedPlanner(_PhasedPlanner):
    """Rollout-reward colocated baseline: rollout and reward alternate on one pool."""

    include_training = False
