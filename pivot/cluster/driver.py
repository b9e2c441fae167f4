"""The ``local`` driver: real RL post-training with resource shifting on this CPU.

    driver = ClusterDriver(group=ClusterGroup(), deployment=Deployment(...),
                           run_config=RunConfig(steps=4), costs=PlannerCosts(...))
    result = driver.run()     # ClusterResult: metrics per step, allocation trace, shifts
    driver.close()

Build order: checks (models, slots vs machine, data) in the constructor, before any engine;
``run`` starts GPS (both models), the mesh of device slots (one vLLM engine and one
trainer context per slot, each slot capped to a fixed CPU share), the shared control plane
(schedulers, planner, monitor, executor), provisions the deployment's initial split
through the executor, and runs ``pivot.rl.loop.RLLoop``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gin

from pivot.config.validation import build_required, check, check_range
from pivot.errors import ConfigError
from pivot.cluster.closers import run_closers
from pivot.cluster.config import (COSTS_FIX, FaultBudget, OptimizerConfig, PlannerCosts,
                                  RunConfig)
from pivot.cluster.cpu.config import CpuConfig
from pivot.cluster.faults import stopped_by
from pivot.cluster.group import ClusterGroup
from pivot.cluster.stack import ClusterStack
from pivot.planner.monitor import RoleShape
from pivot.rewards.genrm import JUDGE_RESPONSE_TOKENS
from pivot.rl import checkpoint
from pivot.rl.data import PromptStream
from pivot.rl.lengths import length_report
from pivot.rl.loop import LoopConfig, RLLoop
from pivot.rl.objective import Objective
from pivot.rl.staleness import StalenessBound
from pivot.rl.workflow import RLWorkflow
from pivot.runtime.pending import SlotProcessDied
from pivot.scheduler.scheduler import ShiftAwareScheduler
from pivot.scheduler.throughput import BinaryThroughputModel
from pivot.spec.deployment import Deployment, training_slots
from pivot.types import GENRM, INFERENCE_ROLES, POLICY, Role, ShiftDown, ShiftPlan

log = logging.getLogger(__name__)


@dataclass
class ClusterResult:
    """What a local run measured."""

    group: str
    deployment: str
    seed: int
    steps: list[dict[str, Any]]
    trace: list[dict[str, Any]]
    shifts: list[dict[str, Any]]
    wall_s: float
    startup_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, trace: bool = True) -> dict[str, Any]:
        st = self.steps
        out = {"group": self.group, "deployment": self.deployment, "seed": self.seed,
               **end_to_end_throughput(st),
               "step_time": (st[-1]["time_s"] / len(st)) if st else None,
               "shifts": len(self.shifts), "events_per_s": None, "wall_s": self.wall_s,
               "startup_s": self.startup_s, "steps": st, **self.extra}
        if trace:
            out["trace"], out["shift_records"] = self.trace, self.shifts
        return out


def end_to_end_throughput(steps: list[dict[str, Any]]) -> dict[str, float | None]:
    """Sec. 8.3's end-to-end throughput (tokens processed over several steps / time), in
    three readings, tokens/s:

    - ``throughput``: the tokens of the batches trained in steps 2..N over the time from
      the end of step 1 to the end of step N (steady state, as the sim and fig. 13 do).
      A batch's tokens are those of its trajectories' rollouts and judgements, so work a
      deployment does ahead for later batches (staleness 2) counts when it is trained:
      on runs of ~10 steps, counting tokens as they finish instead moved a deployment's
      figure by up to 25% with how far ahead it happened to be at step 1.
    - ``throughput_run``: every trained batch's tokens over the time to the end of step N
      (start-up of the pipeline included).
    - ``throughput_finished``: tokens as they finished, from step 1 to N (the old reading).
    """
    out: dict[str, float | None] = {"throughput": None, "throughput_run": None,
                                    "throughput_finished": None}
    if not steps or "trained_tokens" not in steps[-1]:
        return out
    first, last = steps[0], steps[-1]
    if last["time_s"] > 0:
        out["throughput_run"] = last["trained_tokens"] / last["time_s"]
    if len(steps) >= 2 and last["time_s"] > first["time_s"]:
        dt = last["time_s"] - first["time_s"]
        out["throughput"] = (last["trained_tokens"] - first["trained_tokens"]) / dt
        out["throughput_finished"] = (last["tokens"] - first["tokens"]) / dt
    return out


@gin.configurable
class ClusterDriver:
    """Args:
        group: the local model group.
        deployment: colocated / disaggregated / rr_colocated / PivotRL and strategies
            (sec. 8.2, 8.4; one gin file each under ``gin/deployments/``).
        stream: the prompt stream (prompts per step, data seed, optional parquet).
        loop: poll and tick periods, checkpoints, stop_after.
        objective: the reward's GenRM weight and the advantages' scaling (the paper's
            R = R_verifiable + R_GenRM and GRPO by default).
        run_config: steps, sampling seed, validation period, resume, run folder.
        costs: what the planner charges: the engines' decode-latency fits (sec. 6.1) and
            the shift times (sec. 7.1).
        optimizer: the trainer's AdamW learning rate.
        faults: the failed shifts and dead slot processes a run survives.
        cpu: the CPU share of a slot (the ``cpu`` backend; 0 on GPUs).
        stack: a started ``ClusterStack`` to reuse (its engines are not restarted; its
            engine seed is used); None starts and stops one for this run.
        observer: checks the run as it goes, e.g. ``pivot.reliability.cluster_checks.
            ClusterChecker``: ``attach(driver, workflow)`` once the control plane is built,
            ``finish()`` after the loop, ``report()`` into ``ClusterResult.extra["checks"]``;
            None (the default) adds nothing to the run.

    Every setting left None is built here from its own gin bindings (``PromptStream()``,
    ``RunConfig()``, ...); each checks its own fields (``pivot.cluster.config``), the
    driver only what relates them: slots x CPU share against the cores, the training
    slots against the deployment's split and a step's rows, replicas against the planner.
    """

    def __init__(self, group: ClusterGroup = gin.REQUIRED, deployment: Deployment = gin.REQUIRED,
                 stream: PromptStream | None = None, loop: LoopConfig | None = None,
                 objective: Objective | None = None, run_config: RunConfig | None = None,
                 costs: PlannerCosts | None = None, optimizer: OptimizerConfig | None = None,
                 faults: FaultBudget | None = None, cpu: CpuConfig | None = None,
                 stack=None, observer: Any = None):
        stream = PromptStream() if stream is None else stream
        loop = LoopConfig() if loop is None else loop
        objective = Objective() if objective is None else objective
        run_config = RunConfig() if run_config is None else run_config
        costs = build_required(PlannerCosts, COSTS_FIX) if costs is None else costs
        optimizer = OptimizerConfig() if optimizer is None else optimizer
        faults = FaultBudget() if faults is None else faults
        cpu = CpuConfig() if cpu is None else cpu
        for k, v, cls in (("group", group, ClusterGroup), ("deployment", deployment, Deployment),
                          ("stream", stream, PromptStream), ("loop", loop, LoopConfig),
                          ("objective", objective, Objective),
                          ("run_config", run_config, RunConfig), ("costs", costs, PlannerCosts),
                          ("optimizer", optimizer, OptimizerConfig),
                          ("faults", faults, FaultBudget), ("cpu", cpu, CpuConfig)):
            check(isinstance(v, cls), f"ClusterDriver.{k}", v,
                  f"must be a {cls.__name__} (ClusterDriver.{k} = @{cls.__name__}())")
        check(observer is None or all(hasattr(observer, m) for m in ("attach", "finish",
                                                                       "report")),
              "ClusterDriver.observer", observer, "must be None or have attach / finish / "
              "report (e.g. @ClusterChecker())")
        cores = os.cpu_count() or 1
        check(cpu.share * group.devices <= cores, "CpuConfig.share", cpu.share,
              f"{group.devices} slots (ClusterGroup.devices) x {cpu.share} cores = "
              f"{cpu.share * group.devices:g} cores exceeds this machine's {cores}; at most "
              f"{cores / group.devices:g}")
        group.check()
        self.group, self.dep, self.stream, self.loop_cfg = group, deployment, stream, loop
        self.objective = objective
        self.run_config, self.costs, self.optimizer = run_config, costs, optimizer
        self.fault_budget, self.cpu = faults, cpu
        # flat views the rest of the driver, the console and the launchers read
        self.steps, self.seed, self.lr = run_config.steps, run_config.seed, optimizer.lr
        self.eval_every, self.resume = run_config.eval_every, run_config.resume
        self.run_dir = Path(run_config.run_dir) if run_config.run_dir else None
        self.cpu_share = cpu.share
        self.tm, self.judge_tm = costs.policy_model(), costs.judge_model()
        self.tau_inference, self.tau_training = costs.tau_inference, costs.tau_training
        self.stack, self._own_stack = stack, False
        self.observer = observer
        # training's slots: every slot (colocated), the deployment's, or the group's;
        # one FSDP2 rank on each (pivot.roles.trainer_context.SlotTrainerContext)
        td = deployment.training_devices
        check_range("Deployment.training_devices", td, -1, group.devices, integer=True,
                    why=f"-1: every slot; 0: ClusterGroup.training_devices; at most "
                        f"ClusterGroup.devices={group.devices}")
        self.train_needed = training_slots(td, group.devices, group.training_devices)
        rows = stream.prompts_per_step * group.n
        check(rows >= self.train_needed, "PromptStream.prompts_per_step", stream.prompts_per_step,
              f"x ClusterGroup.n={group.n} = {rows} rows a step, fewer than the "
              f"{self.train_needed} training slots (each FSDP2 rank trains on >= 1 row); "
              f"raise it or lower the training slots")
        ro, rm = deployment.rollout_devices, deployment.reward_devices
        pool = group.devices - (self.train_needed if deployment.training_home else 0)
        check(pool >= 1, "Deployment.training_devices", td,
              f"training holds {self.train_needed} of ClusterGroup.devices={group.devices} slots "
              f"from the start (Deployment.training_home), leaving none for inference; lower "
              f"it (or ClusterGroup.training_devices)")
        if ro == -1:   # the rest, in whole replicas: a remainder starts idle
            k = group.replica_devices[Role.ROLLOUT]
            ro = (pool - rm) // k * k
        check(0 <= ro and 0 <= rm and ro + rm <= pool,
              f"Deployment {deployment.name!r}: rollout_devices, reward_devices", (ro, rm),
              f"together at most {pool} (ClusterGroup.devices={group.devices}"
              f"{f' less {self.train_needed} training slots' if deployment.training_home else ''})")
        self.split = (ro, rm)
        self.replica_devices = group.replica_devices
        for (role, k), n, key in zip(self.replica_devices.items(), self.split,
                                     ("rollout_devices", "reward_devices")):
            check(n % k == 0, f"Deployment {deployment.name!r}: {key}", n,
                  f"a {role.value} replica is {k} devices (ClusterGroup."
                  f"{'policy' if role is Role.ROLLOUT else 'genrm'}_replica_devices): use a "
                  f"multiple of {k}")
        # built here, not at run time: its checks (and those against this group's slots)
        # fail before any engine starts
        self.planner = deployment.planner(self.tm, self.judge_tm)
        tp = max(self.replica_devices.values())
        name = type(self.planner).__name__
        check(tp == 1 or not self.planner.places_replicas or self.planner.aligned_blocks,
              f"{name}.aligned_blocks", False,
              f"replicas of {tp} devices are TP engines fixed to aligned blocks of slots at "
              f"start: bind {name}.aligned_blocks = True")
        if hasattr(self.planner, "check_fits"):
            self.planner.check_fits(group.devices, {r: pool for r in INFERENCE_ROLES},
                                    f"{pool} slots of ClusterGroup.devices={group.devices}")
        check_range("ClusterGroup.max_response_tokens", group.max_response_tokens, 1,
                    group.policy_max_model_len - 1, integer=True,
                    why=f"a response fits the policy's ClusterGroup.policy_max_model_len="
                        f"{group.policy_max_model_len} with room for the prompt")
        check_range("ClusterGroup.max_response_tokens + max_judge_tokens",
                    min(group.max_response_tokens, JUDGE_RESPONSE_TOKENS)
                    + group.max_judge_tokens, 2, group.genrm_max_model_len - 1, integer=True,
                    why=f"a judgement's prompt holds the response (cut to its last "
                        f"{JUDGE_RESPONSE_TOKENS} tokens at most): both fit the GenRM's "
                        f"ClusterGroup.genrm_max_model_len={group.genrm_max_model_len} "
                        f"with room for the prompt")
        self._closers: list = []
        self.ctl = None

    # ------------------------------------------------------------------ building
    def _start(self) -> None:
        """Starts this run's own stack, or resets the shared one (no engine restarts)."""
        if self.stack is None:
            self.stack = ClusterStack(self.group, self.seed, self.lr, self.cpu_share).start()
            self._own_stack = True
        else:
            self.stack.fits(self.group, self.lr, self.cpu_share)
            if not self.stack.started:
                self.stack.start()
            elif self.stack.runs or self.stack.ctl.device_map.replicas():
                self.stack.reset()
            else:
                self.stack.runs += 1
        st = self.stack
        self.tok, self.source, self.ctl = st.tok, st.source, st.ctl
        self.kv_capacity, self.shares = st.kv_capacity, st.shares
        self.max_num_seqs = st.max_num_seqs
        self.policy_dir, self.genrm_dir = st.policy_dir, st.genrm_dir

    def _control_plane(self):
        from pivot.cluster.control import ClusterControl, ClusterTrainer
        from pivot.cluster.fleet import Fleet, RewardService, RolloutService
        from pivot.roles.engine.requests import SampleSpec

        g, d = self.group, self.dep
        tms = {Role.ROLLOUT: self.tm, Role.REWARD: self.judge_tm}
        self.schedulers = {r: ShiftAwareScheduler(
            r, BinaryThroughputModel() if d.binary_scheduler else tms[r],
            migrate_on_shift_up=d.migrate_on_shift_up, kv_reserve=64,
            max_seqs=self.max_num_seqs) for r in INFERENCE_ROLES}
        codecs = self.stack.codecs
        eos, judge_eos = codecs[POLICY].eos_id, codecs[GENRM].eos_id
        ro_spec = SampleSpec(max_tokens=g.max_response_tokens, temperature=g.temperature,
                             ignore_eos=g.ignore_eos,
                             stop_token_ids=(eos,) if eos is not None and not g.ignore_eos
                             else ())
        rm_spec = SampleSpec(max_tokens=g.max_judge_tokens, temperature=0.0,
                             stop_token_ids=(judge_eos,) if judge_eos is not None else ())
        encode = codecs[POLICY].encode
        self.fleet = Fleet(self.ctl, self.schedulers, codecs, ro_spec, rm_spec, self.seed)
        shapes = {r: RoleShape(self.replica_devices[r], self.kv_capacity,
                               g.devices // self.replica_devices[r], self.tau_inference)
                  for r in INFERENCE_ROLES}
        planner = self.planner
        self.control = ClusterControl(self.ctl, self.fleet, planner, shapes, self.train_needed,
                                    self.tau_training, d.release_idle_training,
                                    faults=self.fault_budget,
                                    on_replaced=self.stack.cap_slots)
        self.trainer = ClusterTrainer(self.ctl, self.fleet, self.control, self.source,
                                    self.tok.pad_token_id or 0,
                                    scale_by_std=self.objective.scale_by_std)
        wf = RLWorkflow(self.stream, g.n, self.steps, StalenessBound(d.staleness), encode,
                        reward_fn=self.objective.reward)
        return wf, RolloutService(self.fleet), RewardService(self.fleet)

    def _provision(self, allocation: dict[str, Any] | None) -> None:
        """Initial placement (or the checkpoint's allocation) through the executor."""
        g, ex = self.group, self.control.executor
        free = list(range(g.devices))
        if allocation is not None:
            counts = {r: len(allocation.get(r.value, [])) for r in Role}
            train = counts[Role.TRAINING] > 0
            split = (counts[Role.ROLLOUT], counts[Role.REWARD])
        else:
            train, split = self.dep.training_home, self.split
        if train:
            devs = tuple(free[-self.train_needed:])
            free = free[:-self.train_needed]
            ex.execute(ShiftPlan(Role.TRAINING, (ShiftDown(None, None, devs),), (devs,),
                                 reason="provision"))
        for role, count in zip(INFERENCE_ROLES, split):
            groups = take_blocks(free, self.replica_devices[role], count)
            if groups:
                used = tuple(x for grp in groups for x in grp)
                ex.execute(ShiftPlan(role, (ShiftDown(None, None, used),), groups,
                                     reason="provision"))

    # ------------------------------------------------------------------ running
    def run(self, progress=None) -> ClusterResult:
        t0 = time.perf_counter()
        self._start()
        wf, rollout, reward = self._control_plane()
        run_dir = self.run_dir
        metrics_f = None
        if run_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            metrics_f = open(run_dir / "metrics.jsonl", "a")
            self._closers.append(metrics_f.close)
        validator = None
        if self.eval_every >= 0:
            from pivot.cluster.validate import Validator
            validator = Validator(self.policy_dir, self.stream.validation(),
                                  self.group.max_response_tokens)

        def validate() -> float:
            return validator.accuracy(self.source.read(POLICY, (0,))[0])

        async def on_step(m: dict[str, Any]) -> None:
            if validator is not None and (m["step"] == self.steps or (
                    self.eval_every and m["step"] % self.eval_every == 0)):
                t = time.perf_counter()
                # a blocking GPS Read and generation: off the loop's thread
                m["val/accuracy_at_1"] = await asyncio.to_thread(validate)
                m["val/seconds"] = time.perf_counter() - t
            m["cpu_s"] = self.shares.usage_s()
            # The driver process's own CPU (loop, planner, schedulers, migrations, GPS
            # client): on the CPU testbed it runs outside the slots' quotas, on their cores.
            m["control_cpu_s"] = time.process_time() - cpu_at_start
            # the allocation trace's clock (time since the control plane was built)
            m["trace_time_s"] = self.control.clock() - self.control.t0
            _wandb_log(m)
            if metrics_f is not None:
                metrics_f.write(json.dumps(m) + "\n")
                metrics_f.flush()
            if progress is not None:
                # the summary's reading (steps 2..N), so bar and summary agree at the end
                tp = end_to_end_throughput(self.loop.history)["throughput"]
                alloc = m["allocation"]
                progress(m["version"], m["time_s"], postfix=(
                    f"{'-' if tp is None else f'{tp:,.0f}'} tok/s R={m['reward/mean']:.2f} "
                    f"ro/rm/tr/idle={len(alloc['rollout'])}/{len(alloc['reward'])}/"
                    f"{len(alloc['training'])}/{len(alloc['idle'])}"))

        loop = RLLoop(wf, rollout, reward, self.trainer, self.control, self.loop_cfg,
                      run_dir=run_dir, on_step=on_step)
        self.loop = loop
        if self.observer is not None:
            self.observer.attach(self, wf)
        allocation = None
        if self.resume:
            found = checkpoint.load_latest(run_dir) if run_dir else None
            if found is None:
                raise ConfigError(f"RunConfig.resume: no checkpoint in {run_dir}; bind "
                                  f"RunConfig.run_dir to a run folder with one")
            _, state = found
            loop.resume(state)
            allocation = state.get("allocation")
        self._provision(allocation)
        startup = time.perf_counter() - t0
        log.info("start-up %.1f s; running %s for %d steps", startup, self.dep.name, self.steps)
        cpu_at_start = time.process_time()
        try:
            hist = loop.run()
        except BaseException as err:
            try:   # what can be returned to the pool is; the run's own error goes on
                self.control.faults.finish()
            except Exception as e:  # noqa: BLE001
                log.warning("returning replaced slots after the failed run: %s", e)
            if isinstance(err, SlotProcessDied):
                raise stopped_by(err, run_dir) from err
            raise
        self.control.faults.finish()   # slots replaced mid-run back in the pool
        checks = None
        if self.observer is not None:
            self.observer.finish()
            checks = self.observer.report()
        res = ClusterResult(self.group.name, self.dep.name, self.seed, hist, self.control.trace,
                          self.control.shifts, time.perf_counter() - t0, startup,
                          {"max_staleness": wf.max_lag_seen,
                           "migration": _mig(self.fleet.migration),
                           "planner_calls": len(self.control.planner_s),
                           "lengths_fed": self.fleet.lengths_fed,
                           "sequences_retried": self.fleet.retried,
                           "failed_shifts": self.control.failed_shifts,
                           "slot_deaths": self.control.faults.records,
                           "steps_lost": loop.steps_lost,
                           "planner_mean_s": (sum(self.control.planner_s) /
                                              max(len(self.control.planner_s), 1)),
                           "cpu_share": self.cpu_share, "policy_dir": self.policy_dir,
                           "control_cpu_s": time.process_time() - cpu_at_start,
                           "data_order": loop.data_order,
                           "lengths": length_report(hist)})
        if checks is not None:
            res.extra["checks"] = checks
        if run_dir is not None:
            (run_dir / "allocation_trace.json").write_text(json.dumps(
                {"trace": res.trace, "shifts": res.shifts}))
        return res

    def prepare(self) -> None:
        """What comes before the run's first step and its progress bar: the tiny models
        are built here on first use (a few minutes), unless a started stack is reused."""
        if self.stack is None:
            self.group.model_dirs()

    def close(self) -> None:
        """Closes the run's files; stops the stack only if this run started it."""
        run_closers(self._closers)
        if self._own_stack and self.stack is not None:
            self.stack.close()
            self.stack = None
        self.ctl = None


def _mig(m) -> dict[str, float]:
    return {"aborted": m.aborted, "dispatched": m.dispatched, "abort_s": m.abort_s,
            "dispatch_s": m.dispatch_s}


def _wandb_log(m: dict[str, Any]) -> None:
    """Logs a step's numeric metrics to the active wandb run, if any (offline by default)."""
    try:
        import wandb
    except ImportError:
        return
    if wandb.run is None:
        return
    flat = {f"rl/{k}": v for k, v in m.items() if isinstance(v, (int, float))}
    flat.update({f"alloc/{r}": len(v) for r, v in m.get("allocation", {}).items()})
    wandb.log(flat, step=int(m["step"]))


def take_blocks(free: list[int], k: int, count: int) -> tuple[tuple[int, ...], ...]:
    """Up to ``count`` devices of ``free`` as replicas of ``k``: aligned blocks
    ``[b*k, b*k+k)`` whose devices are all free, lowest first (a TP replica's engines are
    fixed to its block at start). Removes them from ``free``."""
    out = []
    for b in sorted({d // k for d in free}):
        block = tuple(range(b * k, b * k + k))
        if len(out) * k + k > count:
            break
        if all(d in free for d in block):
            out.append(block)
            for d in block:
                free.remove(d)
    return tuple(out)
