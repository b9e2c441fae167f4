"""The ``sim`` driver: a discrete-event cluster simulator running the real control plane
(scheduler, planner, monitor, executor) in virtual time. See ``pivot.sim.driver``."""

import gin

from pivot.sim.calibration import StandIn
from pivot.sim.deployment import Deployment, ModelGroup
from pivot.sim.driver import SimDriver
from pivot.sim.lengths import LengthModel
from pivot.sim.phased import ColocatedPlanner, RolloutRewardColocatedPlanner
from pivot.sim.profile import ModelProfile, ShiftCost, TrainingProfile
from pivot.sim.roofline import Architecture

gin.external_configurable(StandIn, module="pivot.sim")

__all__ = ["SimDriver", "Deployment", "ModelGroup", "LengthModel", "ModelProfile",
           "ShiftCost", "TrainingProfile", "StandIn", "Architecture", "ColocatedPlanner",
           "RolloutRewardColocatedPlanner"]
