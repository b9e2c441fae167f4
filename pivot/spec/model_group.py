"""A model group (table 1 on its cluster, table 4): the policy and the GenRM with their cost
profiles, the workload's lengths and the batch; a gin-configured value both drivers read."""

from __future__ import annotations

from dataclasses import dataclass

import gin

from pivot.config.validation import check, check_range, check_text
from pivot.errors import ConfigError
from pivot.spec.lengths import LengthModel
from pivot.spec.profile import ModelProfile, ShiftCost, TrainingProfile


@gin.configurable
@dataclass(frozen=True)
class ModelGroup:
    """One row of table 1 on its cluster.

    Attributes:
        devices: cluster devices (table 4: 32, 32, 64, 128), 8 per host.
        policy / genrm: the models (genrm None: verifiable reward only, as in verl's DAPO).
        training: training devices and time model (table 4's training column).
        lengths: the workload's length distributions.
        shift_cost: shift up and down times (fitted: ``ShiftCost``; required).
        prompts_per_step / n: GRPO batch (smaller than a production run, for speed).
    """

    name: str
    devices: int
    policy: ModelProfile
    genrm: ModelProfile | None
    training: TrainingProfile
    lengths: LengthModel = LengthModel()
    shift_cost: ShiftCost = gin.REQUIRED
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
