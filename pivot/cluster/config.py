"""The cluster driver's settings, one dataclass per concern (as torchtitan's job config
has a section per concern): what a run does (``RunConfig``), what the planner charges
(``PlannerCosts``), the trainer's optimizer (``OptimizerConfig``) and the faults a run
survives (``FaultBudget``); the CPU share of a slot is the ``cpu`` backend's
(``pivot.cluster.cpu.config.CpuConfig``).

Each is ``@gin.configurable`` and checks its own fields in ``__post_init__``, naming the
binding and what is valid; ``ClusterDriver`` builds each one it is not given at call time,
so a gin file binds ``RunConfig.steps = 20`` without a ``ClusterDriver`` line, and checks
only what relates two of them (slots x CPU share against the cores, training slots
against a step's rows: ``pivot/cluster/driver.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import gin

from pivot.config.validation import check, check_bool, check_range, check_text
from pivot.scheduler.throughput import ThroughputModel


Latency = tuple[float, float, float, float]


@gin.configurable
@dataclass(frozen=True)
class RunConfig:
    """What one run of the cluster driver does (sec. 8.1's RL loop).

    Attributes:
        steps: RL steps of the run (4: about 1-2 min after a ~80 s start-up on this CPU).
        seed: sampling seed (the data seed is ``PromptStream.seed``).
        eval_every: validation accuracy@1 every this many steps; 0: only after the last
            step; -1: never.
        resume: continue from the run folder's latest checkpoint.
        run_dir: the run folder (metrics.jsonl, allocation_trace.json, checkpoints); None:
            none (``launchers/run.py`` sets ``runs/<group>_<deployment>_s<seed>``).
    """

    steps: int = 4
    seed: int = 0
    eval_every: int = 0
    resume: bool = False
    run_dir: str | None = None

    def __post_init__(self) -> None:
        check_range("RunConfig.steps", self.steps, 1, integer=True, why="RL steps")
        check_range("RunConfig.seed", self.seed, 0, integer=True)
        check_range("RunConfig.eval_every", self.eval_every, -1, integer=True,
                    why="steps between validations; 0: after the last step; -1: never")
        check_bool("RunConfig.resume", self.resume)
        check_text("RunConfig.run_dir", self.run_dir, optional=True)


def _check_latency(binding: str, value: object) -> None:
    check(isinstance(value, (tuple, list)) and len(value) == 4, binding, value,
          "must be (A, B, C, D) in seconds of A*N_tok + max(B, C*N_seq) + D (sec. 6.1), "
          "fitted by benchmarks/profile_engine.py")
    for k, v in zip("ABCD", value):
        check_range(f"{binding} ({k})", v, 0, why="seconds, sec. 6.1")


@gin.configurable
@dataclass(frozen=True)
class PlannerCosts:
    """What the planner and the schedulers charge (sec. 6.1, sec. 7.1).

    Attributes:
        throughput: (A, B, C, D) of the policy engines' decode latency
            A*N_tok + max(B, C*N_seq) + D in seconds (sec. 6.1). Required: a fit of the
            engines of one model group at their CPU share or on their GPU
            (``benchmarks/profile_engine.py``), bound in the group's gin file
            (``gin/tiny_cpu.gin``) or, for a paper group, taken from its ``ModelProfile``
            (``cluster_costs``, ``gin/backends/*.gin``).
        judge_throughput: the same for the GenRM's engines (another model, another fit);
            required too; None: the policy's.
        tau_inference: seconds the planner charges a shift of one generator slot (sec. 7.1);
            0.5 is the scale of one on the CPU slots (``benchmarks/shift.py``).
        tau_training: seconds it charges a training shift (sec. 7.1).
    """

    throughput: Latency = gin.REQUIRED
    judge_throughput: Latency | None = gin.REQUIRED
    tau_inference: float = 0.5
    tau_training: float = 1.0

    def __post_init__(self) -> None:
        _check_latency("PlannerCosts.throughput", self.throughput)
        if self.judge_throughput is not None:
            _check_latency("PlannerCosts.judge_throughput", self.judge_throughput)
        check_range("PlannerCosts.tau_inference", self.tau_inference, 0, why="seconds")
        check_range("PlannerCosts.tau_training", self.tau_training, 0, why="seconds")

    def policy_model(self) -> ThroughputModel:
        return ThroughputModel(*self.throughput)

    def judge_model(self) -> ThroughputModel:
        """The GenRM's model (the policy's when ``judge_throughput`` is None)."""
        return ThroughputModel(*(self.judge_throughput or self.throughput))


@gin.configurable
@dataclass(frozen=True)
class OptimizerConfig:
    """The trainer's AdamW (``pivot.roles.trainer.Trainer``).

    Attributes:
        lr: learning rate. 1e-4: on worked sums 3e-4 lowered validation accuracy in every
            run, 1e-4 holds it and 3e-5 leaves it unmoved (results/local/lr_probe/new_*,
            docs/results.md, "Convergence (fig. 15)").
    """

    lr: float = 1e-4

    def __post_init__(self) -> None:
        check_range("OptimizerConfig.lr", self.lr, 0, 1, open_lo=True,
                    why="AdamW learning rate")


@gin.configurable
@dataclass(frozen=True)
class FaultBudget:
    """The faults a run survives before it stops with the error (``pivot.cluster.faults``).

    Attributes:
        max_shift_failures: shift plans whose slot work may fail (their devices LOST for
            the rest of the run, ``ClusterControl``); 0: the first one ends the run.
        max_slot_deaths: slot processes that may die mid-run (their sequences go on
            elsewhere, the slot is replaced); 0: the first death ends the run.
    """

    max_shift_failures: int = 2
    max_slot_deaths: int = 2

    def __post_init__(self) -> None:
        check_range("FaultBudget.max_shift_failures", self.max_shift_failures, 0,
                    integer=True,
                    why="failed shift plans the run survives; 0: the first one ends it")
        check_range("FaultBudget.max_slot_deaths", self.max_slot_deaths, 0, integer=True,
                    why="slot processes that may die mid-run; 0: the first death ends it")


COSTS_FIX = ("bind the engines' decode-latency fit (A, B, C, D) in the model group's gin "
             "file, as gin/tiny_cpu.gin does (benchmarks/profile_engine.py fits it), or "
             "ClusterDriver.costs = @cluster_costs() for a paper model group "
             "(gin/backends/*.gin)")
"""What to do when ``PlannerCosts``' fits are not bound."""
