"""How the roles share the cluster (sec. 8.2, app. E), as a gin-configured value that both
drivers read."""

from __future__ import annotations

from dataclasses import dataclass

import gin

from pivot.config.validation import check, check_bool, check_range, check_text


@gin.configurable
@dataclass(frozen=True)
class Deployment:
    """How the roles share the cluster (sec. 8.2, app. E).

    Attributes:
        name: label in results.
        planner: a Planner class, built with the two throughput models.
        staleness: data staleness (2; colocated is synchronous: 0).
        rollout_devices / reward_devices: initial inference split (static baselines keep
            it); -1 gives everything not held by training to that role.
        training_home: training holds its devices from the start (disaggregated, static,
            rule-based); False: it shifts up when its batch is ready (PivotRL).
        training_devices: -1 = the whole cluster (colocated), 0 = the group's.
        binary_scheduler: dispatch with the 0/1 throughput model (vanilla ablation).
        migrate_on_shift_up: alg. 4's migration (the "+ migration" component).
        release_idle_training: training returns its devices to the idle pool after each
            step when the next batch is not ready (the static strategy lends them).
    """

    name: str
    planner: type
    staleness: int = 2
    rollout_devices: int = -1
    reward_devices: int = 0
    training_home: bool = True
    training_devices: int = 0
    binary_scheduler: bool = False
    migrate_on_shift_up: bool = True
    release_idle_training: bool = False

    def __post_init__(self) -> None:
        check_text("Deployment.name", self.name)
        check(callable(self.planner), "Deployment.planner", self.planner,
              "must be a planner class or factory, e.g. @PivotPlanner")
        check_range("Deployment.staleness", self.staleness, 0, integer=True)
        check_range("Deployment.rollout_devices", self.rollout_devices, -1, integer=True,
                    why="-1: every device not held by training or reward")
        check_range("Deployment.reward_devices", self.reward_devices, 0, integer=True)
        check_range("Deployment.training_devices", self.training_devices, -1, integer=True,
                    why="-1: the whole cluster; 0: the group's")
        for k in ("training_home", "binary_scheduler", "migrate_on_shift_up",
                  "release_idle_training"):
            check_bool(f"Deployment.{k}", getattr(self, k))


def training_slots(training_devices: int, devices: int, group_default: int) -> int:
    """The devices a training replica holds under ``Deployment.training_devices``: every
    device of the group (-1, colocated), the deployment's own count, or the group's
    ``group_default`` (0)."""
    return devices if training_devices == -1 else (training_devices or group_default)
