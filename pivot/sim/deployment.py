"""Deployments and model groups as gin-configured values (sec. 8.1, table 1, table 4)."""

from __future__ import annotations

from dataclasses import dataclass

import gin

from pivot.config.validation import check, check_bool, check_range, check_text
from pivot.errors import ConfigError
from pivot.sim.lengths import LengthModel
from pivot.sim.profile import ModelProfile, ShiftCost, TrainingProfile


@gin.configurable
@dataclass(frozen=True)
class ModelGroup:
    """One row of table 1 on its cluster.

    Attributes:
        devices: cluster devices (table 4: 32, 32, 64, 128), 8 per host.
        policy / genrm: the models (genrm None: verifiable reward only, as in verl's DAPO).
        training: training devices and time model (table 4's training column).
        prompts_per_step / n: GRPO batch (smaller than a production run, for speed).
    """

    name: str
    devices: int
    policy: ModelProfile
    genrm: ModelProfile | None
    training: TrainingProfile
    lengths: LengthModel = LengthModel()
    shift_cost: ShiftCost = ShiftCost()
    prompts_per_step: int = 64
    n: int = 8
    devices_per_host: int = 8

    def __post_init__(self) -> None:
        where = f"ModelGroup {self.name!r}"
        check_text("ModelGroup.name", self.name)
        check_range("ModelGroup.devices_per_host", self.devices_per_host, 1, integer=True)
        check_range("ModelGroup.devices", self.devices, 1, integer=True)
        check(self.devices <= self.devices_per_host or
              self.devices % self.devices_per_host == 0, "ModelGroup.devices", self.devices,
              f"must be a multiple of ModelGroup.devices_per_host={self.devices_per_host} "
              f"(or at most one host)")
        check_range("ModelGroup.prompts_per_step", self.prompts_per_step, 1, integer=True)
        check_range("ModelGroup.n", self.n, 2, integer=True,
                    why="GRPO responses per prompt: a group needs 2")
        for k, cls in (("policy", ModelProfile), ("genrm", ModelProfile),
                       ("training", TrainingProfile), ("lengths", LengthModel),
                       ("shift_cost", ShiftCost)):
            v = getattr(self, k)
            check(isinstance(v, cls) or (k == "genrm" and v is None), f"ModelGroup.{k}", v,
                  f"must be a {cls.__name__}" + (" or None" if k == "genrm" else "") +
                  f" (e.g. ModelGroup.{k} = @{cls.__name__}())")
        # the cluster's host size is the group's: its shift costs use the same one
        if self.shift_cost.devices_per_host != self.devices_per_host:
            object.__setattr__(self, "shift_cost",
                               self.shift_cost.on_hosts(self.devices_per_host))
        for m in (self.policy, self.genrm):
            if m is not None and self.devices % m.devices:
                raise ConfigError(f"{where}: {m.name} needs {m.devices} devices per replica "
                                  f"(TP x EP), which does not divide ModelGroup.devices="
                                  f"{self.devices}; change ModelProfile.devices or the "
                                  f"cluster size")
        if self.training.devices > self.devices:
            raise ConfigError(f"{where}: TrainingProfile.devices={self.training.devices} "
                              f"exceeds the cluster's {self.devices} devices; lower it")
        longest = self.lengths.prompt_cap + self.lengths.response_cap + self.lengths.judge_cap
        for m in (self.policy, self.genrm):
            if m is not None and m.kv_capacity() < longest:
                raise ConfigError(f"{where}: {m.name} holds {m.kv_capacity()} KV tokens per "
                                  f"replica, less than one sequence ({longest}); raise "
                                  f"ModelProfile.devices")


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
