"""The planner (sec. 7, app. D): monitor snapshot in, shift plan out.

    planner = PivotPlanner(rollout_model, reward_model, H=60.0)
    plan = planner.plan(snapshot)   # pivot.types.ShiftPlan or None

Strategies behind the same interface: ``NoShiftPlanner`` (static allocation),
``StaticPlanner``, ``RuleBasedPlanner``, and the ablations ``VanillaPlanner`` and
``ThroughputModelPlanner``; the baselines of sec. 8.2 that take turns on one pool
(``ColocatedPlanner``, ``RolloutRewardColocatedPlanner``).
"""

from pivot.planner.base import Planner
from pivot.planner.baselines import ColocatedPlanner, RolloutRewardColocatedPlanner
from pivot.planner.pivot_planner import PivotPlanner, ThroughputModelPlanner, VanillaPlanner
from pivot.planner.strategies import NoShiftPlanner, RuleBasedPlanner, StaticPlanner

__all__ = ["Planner", "PivotPlanner", "ThroughputModelPlanner",
           "VanillaPlanner", "NoShiftPlanner", "RuleBasedPlanner", "StaticPlanner",
           "ColocatedPlanner", "RolloutRewardColocatedPlanner"]
