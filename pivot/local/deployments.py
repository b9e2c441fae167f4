"""The four deployments of sec. 8.2 on the local driver's 4 slots, as Python objects (the
same as gin/local/*.gin over gin/tiny_cpu.gin), for tests and the measurements that run
them back to back on one ``LocalStack``; and ``FORCED_SHIFTS``, the reliability run's."""

from __future__ import annotations

from pivot.planner.pivot_planner import PivotPlanner
from pivot.planner.strategies import NoShiftPlanner
from pivot.reliability.injectors import forced_shift_planner
from pivot.sim.deployment import Deployment
from pivot.sim.phased import ColocatedPlanner, RolloutRewardColocatedPlanner

# name, planner, staleness, rollout_devices, reward_devices, training_home, training_devices
LOCAL_DEPLOYMENTS: dict[str, Deployment] = {
    # the whole pool runs rollout, reward, training in turn; synchronous
    "colocated": Deployment("colocated", ColocatedPlanner, 0, -1, 0, False, -1),
    # static 2 rollout / 1 reward / 1 training (gin/tiny_cpu.gin DISAGG_*)
    "disaggregated": Deployment("disaggregated", NoShiftPlanner, 2, 2, 1, True),
    # rollout and reward take turns on 3 slots, training on its own
    "rr_colocated": Deployment("rr_colocated", RolloutRewardColocatedPlanner, 2, -1, 0, True),
    # 3 rollout / 1 reward at first; training shifts up when its batch is ready
    "pivotrl": Deployment("pivotrl", PivotPlanner, 2, 3, 1, False),
}

SPLIT_VARIANTS: dict[str, Deployment] = {
    # the other static split of 3 inference slots (app. E searches every baseline's
    # split; `local_experiments.py throughput` compares against the better one)
    "disaggregated_1_2": Deployment("disaggregated_1_2", NoShiftPlanner, 2, 1, 2, True),
}

FORCED_SHIFTS = Deployment("forced_shifts", forced_shift_planner, 2, 3, 1, False)
"""PivotRL's start (3 rollout / 1 reward; training shifts up when its batch is ready, down
when idle) under a random rollout <-> reward shift at every planner tick (reliability
issue, item 4; gin/local/forced_shifts.gin). Not one of the four: the measurements that
iterate ``LOCAL_DEPLOYMENTS`` leave it out."""
