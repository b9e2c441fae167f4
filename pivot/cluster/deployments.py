"""The four deployments of sec. 8.2 on the cluster driver's 4 slots, as Python objects (the
same as gin/local/*.gin over gin/tiny_cpu.gin), for tests and the measurements that run
them back to back on one ``ClusterStack``; and ``FORCED_SHIFTS``, the reliability run's."""

from __future__ import annotations

from pivot.planner.pivot_planner import PivotPlanner
from pivot.planner.strategies import NoShiftPlanner
from pivot.reliability.injectors import forced_shift_planner
from pivot.spec.deployment import Deployment
from pivot.planner.baselines import ColocatedPlanner, RolloutRewardColocatedPlanner

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
    # the other static split of 3 inference slots, by its historical name
    "disaggregated_1_2": Deployment("disaggregated_1_2", NoShiftPlanner, 2, 1, 2, True),
}


def static_splits(devices: int) -> dict[str, Deployment]:
    """Every static split of ``devices`` slots for the two baselines with one (app. E
    searches each baseline's split; ratios are taken against the best):

    - ``disaggregated_<r>_<w>_<t>``: r rollout, w reward, t training slots, each >= 1,
      the trainer on t slots (FSDP2 over gloo across them);
    - ``rr_colocated_<t>``: rollout and reward take turns on the other slots, t >= 1
      training slots, at least one inference slot.
    """
    names = [f"disaggregated_{r}_{devices - t - r}_{t}"
             for t in range(1, devices - 1) for r in range(1, devices - t)]
    names += [f"rr_colocated_{t}" for t in range(1, devices - 1)]
    return {n: split_deployment(n) for n in names}


def split_deployment(name: str) -> Deployment | None:
    """The static split a name such as ``disaggregated_1_2_1`` or ``rr_colocated_2``
    stands for, or None."""
    parts = name.split("_")
    if (len(parts) == 4 and parts[0] == "disaggregated"
            and all(p.isdigit() and int(p) > 0 for p in parts[1:])):
        r, w, t = map(int, parts[1:])
        return Deployment(name, NoShiftPlanner, 2, r, w, True, t)
    if (len(parts) == 3 and name.startswith("rr_colocated_") and parts[2].isdigit()
            and int(parts[2]) > 0):
        return Deployment(name, RolloutRewardColocatedPlanner, 2, -1, 0, True, int(parts[2]))
    return None


def split_family(name: str) -> str | None:
    """``"disaggregated"`` or ``"rr_colocated"`` for a static split's name, else None."""
    for family in ("disaggregated", "rr_colocated"):
        if name == family or name.startswith(family + "_"):
            return family
    return None

FORCED_SHIFTS = Deployment("forced_shifts", forced_shift_planner, 2, 3, 1, False)
"""PivotRL's start (3 rollout / 1 reward; training shifts up when its batch is ready, down
when idle) under a random rollout <-> reward shift at every planner tick (reliability
issue, item 4; gin/local/forced_shifts.gin). Not one of the four: the measurements that
iterate ``LOCAL_DEPLOYMENTS`` leave it out."""
