"""The ``sim`` driver: a discrete-event cluster simulator running the real control plane
(scheduler, planner, monitor, executor) in virtual time. See ``pivot.sim.driver``. The
model group and deployment it runs are ``pivot.spec``'s, shared with the cluster driver."""

import gin

from pivot.sim.driver import SimDriver
from pivot.spec.stand_in import StandIn

# gin files name it pivot.sim.StandIn (a stand-in's fit is the simulator's cost model)
gin.external_configurable(StandIn, module="pivot.sim")

__all__ = ["SimDriver"]
