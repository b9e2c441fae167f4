"""The ``sim`` driver: the real control plane on a simulated cluster (docs/design.md).

    driver = SimDriver(group=..., deployment=..., steps=5, seed=0)
    result = driver.run()        # SimResult: throughput, trace, shifts, planner timings

Loop: pop the next event (a replica's finish or KV overflow, a planner tick, training
start or end); at each tick bring every replica to now, build the monitor's snapshot
(``pivot.planner.monitor``), ask the planner, and carry a plan out with the real
``ShiftExecutor`` over a ``DeviceMap`` whose clock is virtual time.
"""

from __future__ import annotations

import heapq
import logging
import time

import gin
import numpy as np

from pivot.config.validation import check, check_range
from pivot.errors import ConfigError
from pivot.planner.monitor import RoleShape, snapshot
from pivot.planner.blocks import check_blocks_fit, free_blocks
from pivot.planner.shift_pairs import _host_groups
from pivot.scheduler.scheduler import ShiftAwareScheduler
from pivot.scheduler.throughput import BinaryThroughputModel
from pivot.shifting.device_map import DeviceMap
from pivot.shifting.executor import ShiftExecutor
from pivot.shifting.shifter import Shifter
from pivot.spec.deployment import Deployment, training_slots
from pivot.spec.model_group import ModelGroup
from pivot.sim.engine import REPLICA, TICK, TRAIN_DONE, TRAIN_START, SimCluster, VirtualClock
from pivot.sim.metrics import SimResult, Tracer
from pivot.sim.workflow import Workflow
from pivot.types import INFERENCE_ROLES, Role, ShiftDown, ShiftPlan, TrainingLoad

log = logging.getLogger(__name__)


class RunPruned(Exception):
    """A run stopped by ``SimDriver.stop_below``: its fig. 9 throughput is at most
    ``bound`` (tokens/s), below the threshold it had to reach."""

    def __init__(self, bound: float, virtual_s: float, threshold: float) -> None:
        super().__init__(f"throughput at most {bound:.0f} tokens/s < {threshold:.0f} "
                         f"(stopped at virtual t={virtual_s:.0f} s)")
        self.bound, self.virtual_s, self.threshold = bound, virtual_s, threshold


@gin.configurable
class SimDriver:
    """Args:
        group: the model group (table 1) and its cluster.
        deployment: the deployment / strategy.
        steps: RL steps to run (5: throughput is measured over steps 1..4, sec. 8.3).
        seed: seeds the length draws.
        tick_s: planner period in virtual seconds (2 s: an assumption).
        kv_reserve: free KV tokens a replica keeps for growth (scheduler eligibility; 2048:
            an assumption).
        max_virtual_s: a run past this virtual time is an error (a stuck workflow).
        stall_ticks: planner ticks with nothing running, nothing pending and no shift
            after which the run fails as unable to make progress.
        stop_below: tokens/s; 0 (default) runs to the end. Otherwise the run raises
            ``RunPruned`` as soon as its throughput (fig. 9's window, ``SimResult``) is
            proven below this (``throughput_bound``): the split search (app. E) passes its
            best so far, so a split that cannot win is not simulated to the end. A run
            that is not stopped is the run without it.
    """

    def __init__(self, group: ModelGroup = gin.REQUIRED, deployment: Deployment = gin.REQUIRED,
                 steps: int = 5, seed: int = 0, tick_s: float = 2.0, kv_reserve: int = 2048,
                 max_virtual_s: float = 1e6, stall_ticks: int = 10,
                 stop_below: float = 0.0) -> None:
        check_range("SimDriver.steps", steps, 2, integer=True,
                    why="throughput is measured from the end of step 1")
        check_range("SimDriver.seed", seed, 0, integer=True)
        check_range("SimDriver.tick_s", tick_s, 0, open_lo=True, why="virtual seconds")
        check_range("SimDriver.kv_reserve", kv_reserve, 0, integer=True, why="KV tokens")
        check_range("SimDriver.max_virtual_s", max_virtual_s, 0, open_lo=True)
        check_range("SimDriver.stall_ticks", stall_ticks, 1, integer=True)
        check_range("SimDriver.stop_below", stop_below, 0.0, why="tokens/s")
        check(isinstance(group, ModelGroup), "SimDriver.group", group,
              "must be a ModelGroup (SimDriver.group = @ModelGroup())")
        check(isinstance(deployment, Deployment), "SimDriver.deployment", deployment,
              "must be a Deployment (SimDriver.deployment = @Deployment())")
        self.group, self.dep = group, deployment
        self.steps, self.seed, self.tick_s = steps, seed, tick_s
        self.max_virtual_s = max_virtual_s
        self.stall_ticks = stall_ticks
        self._stalled = 0
        self._progress: tuple = ()
        g, d = group, deployment
        self.train_needed = training_slots(d.training_devices, g.devices, g.training.devices)
        check_range("Deployment.training_devices", d.training_devices, -1, g.devices,
                    integer=True, why=f"-1: the whole cluster; 0: the group's; "
                                      f"ModelGroup.devices={g.devices}")
        profiles = {Role.ROLLOUT: g.policy, Role.REWARD: g.genrm or g.policy}
        smallest = min(p.kv_capacity() for p in profiles.values())
        check_range("SimDriver.kv_reserve", kv_reserve, 0, smallest - 1, integer=True,
                    why=f"a replica's KV capacity is {smallest} tokens")
        self.models = {r: profiles[r].decode_model() for r in INFERENCE_ROLES}
        sched_model = ({r: BinaryThroughputModel() for r in INFERENCE_ROLES}
                       if d.binary_scheduler else self.models)
        self.schedulers = {r: ShiftAwareScheduler(r, sched_model[r],
                                                  migrate_on_shift_up=d.migrate_on_shift_up,
                                                  kv_reserve=kv_reserve,
                                                  # the engine's batch cap (vLLM max_num_seqs)
                                                  max_seqs=profiles[r].max_num_seqs)
                           for r in INFERENCE_ROLES}
        self.clock = VirtualClock()
        self.workflow = Workflow(g.prompts_per_step, g.n, steps, d.staleness, g.lengths,
                                 np.random.default_rng(seed), genrm=g.genrm is not None)
        self.cluster = SimCluster(profiles, g.training, g.shift_cost, self.schedulers,
                                  self.workflow, self.clock)
        hosts = tuple(i // g.devices_per_host for i in range(g.devices))
        self.device_map = DeviceMap(hosts, clock=self.clock)
        self.shifter = Shifter(self.device_map, self.cluster)
        self.executor = ShiftExecutor(self.shifter, self.schedulers, self.cluster)
        self.planner = d.planner(self.models[Role.ROLLOUT], self.models[Role.REWARD])
        if hasattr(self.planner, "check_fits"):
            self.planner.check_fits(g.devices, {r: g.devices // profiles[r].devices
                                                for r in INFERENCE_ROLES},
                                    f"ModelGroup.devices={g.devices}")
        if getattr(self.planner, "aligned_blocks", False):
            check_blocks_fit(hosts, {r.value: profiles[r].devices for r in INFERENCE_ROLES},
                             f"ModelProfile.devices, ModelGroup.devices_per_host="
                             f"{g.devices_per_host}")
        if hasattr(self.planner, "bind"):
            self.planner.bind(self.workflow.oldest_rollout_done)
        self.shapes = {r: RoleShape(profiles[r].devices, profiles[r].kv_capacity(),
                                    g.devices // profiles[r].devices,
                                    sum(g.shift_cost.inference_up(profiles[r]).values()))
                       for r in INFERENCE_ROLES}
        self.tracer = Tracer()
        self._check_split()
        self.stop_below = stop_below
        self._bound_terms = self._throughput_terms() if stop_below else (0, 0.0)

    # --------------------------------------------------------------- search bound
    def _throughput_terms(self) -> tuple[int, float]:
        """(W, L): the tokens fig. 9's window counts (steps 1..S-1, ``Workflow.planned``)
        and a lower bound of the window's length: training steps 1..S-1 run one after
        another after step 0 ends, each at least its ``step_seconds`` on the devices it
        trains on (shift-up phases left out)."""
        processed, batch = self.workflow.planned()
        tp, pol = self.group.training, self.group.policy
        return sum(processed[1:]), sum(tp.step_seconds(pol, b, self.train_needed)
                                       for b in batch[1:])

    def throughput_bound(self) -> float:
        """An upper bound of the run's throughput W / (T_end - T_0) (``SimResult``; T_0,
        T_end: the ends of the first and last training steps) from what is known now:
        T_end - T_0 >= L (``_throughput_terms``) and, once step 0 ended and while the
        run is not done, T_end - T_0 >= now - T_0."""
        window, span = self._bound_terms
        steps = self.cluster.training.step_times
        if steps and steps[0][2] <= self.clock.now:
            span = max(span, self.clock.now - steps[0][2])
        return window / span if span > 0 else float("inf")

    def _check_bound(self) -> None:
        if self.stop_below and (bound := self.throughput_bound()) < self.stop_below:
            raise RunPruned(bound, self.clock.now, self.stop_below)

    def _check_split(self) -> None:
        g, d = self.group, self.dep
        pool = g.devices - (self.train_needed if d.training_home else 0)
        ro = pool - d.reward_devices if d.rollout_devices == -1 else d.rollout_devices
        train = self.train_needed if d.training_home else 0
        check(0 <= ro and ro + d.reward_devices <= pool,
              f"Deployment {d.name!r}: Deployment.rollout_devices, reward_devices",
              (d.rollout_devices, d.reward_devices),
              f"together at most {pool} (ModelGroup.devices={g.devices} less {train} "
              f"training devices)")
        for role, n in zip(INFERENCE_ROLES, (ro, d.reward_devices)):
            size = self.shapes[role].replica_devices
            check(n == 0 or n >= size, f"Deployment.{role.value}_devices", n,
                  f"must be 0 or at least one {role.value} replica ({size} devices, "
                  f"ModelProfile.devices)")
        self.split = (ro, d.reward_devices)

    # --------------------------------------------------------------- provisioning
    def _provision(self) -> None:
        """Initial placement through the executor, free of shift cost."""
        g = self.group
        self.cluster.free_provisioning = True
        free = list(range(g.devices))
        if self.dep.training_home:
            devs = tuple(free[-self.train_needed:])
            free = free[:-self.train_needed]
            self.executor.execute(ShiftPlan(Role.TRAINING, (ShiftDown(None, None, devs),),
                                            (devs,), reason="provision"))
        aligned = getattr(self.planner, "aligned_blocks", False)
        order = list(zip(INFERENCE_ROLES, self.split))
        if aligned:  # larger replicas first, so smaller ones do not split their blocks
            order.sort(key=lambda rc: -self.shapes[rc[0]].replica_devices)
        for role, count in order:
            size = self.shapes[role].replica_devices
            if aligned:  # sec. 5.2: whole aligned blocks of one host
                groups = free_blocks(self.device_map.device_host, size, free)[:count // size]
            else:
                groups = _host_groups(free[:count], self.device_map.device_host, size,
                                      g.devices_per_host)
            if groups:
                used = {x for grp in groups for x in grp}
                free = [x for x in free if x not in used]
                self.executor.execute(ShiftPlan(role, (ShiftDown(None, None, tuple(used)),),
                                                tuple(groups), reason="provision"))
        self.cluster.free_provisioning = False

    # --------------------------------------------------------------- control plane
    def _training_load(self) -> TrainingLoad:
        tr = self.cluster.training
        return TrainingLoad(devices_needed=self.train_needed, devices=tr.devices,
                            busy=tr.busy or tr.ready_at > self.clock.now,
                            batch_ready=self.workflow.batch_ready(),
                            tau_shift=sum(self.group.shift_cost.training_up(
                                self.group.policy, self.train_needed).values()))

    def _tick(self) -> None:
        c = self.cluster
        c.sync_all()
        reads = getattr(self.planner, "reads_lengths", True)
        if reads:
            c.list_stale()
        from pivot.shifting.role_shift import SlotKind
        snap = snapshot(self.clock.now, self.schedulers, self.shapes, self._training_load(),
                        self.device_map.device_host,
                        self.device_map.devices_in(SlotKind.IDLE),
                        self.device_map.devices_in(SlotKind.LOST), lazy_waiting=True)
        t0 = time.perf_counter()
        plan = self.planner.plan(snap)
        self.tracer.planner_call(time.perf_counter() - t0,
                                 getattr(self.planner, "last_timings", {}), plan is not None,
                                 busy=bool(snap.rollout.num_seqs or snap.reward.num_seqs))
        if plan is not None and not reads:
            c.list_stale()  # the migrations read the schedulers' per-sequence lengths
        if plan is not None and not plan.up_devices:
            self._release(plan)
        elif plan is not None:
            report = self.executor.execute(plan)
            self.tracer.shift(self.clock.now, plan, report)
            c._dirty.update(INFERENCE_ROLES)
            c.maybe_start_training()
        self.tracer.sample(self.clock.now, c, self.device_map)
        self._check_progress()

    def _check_progress(self) -> None:
        """Fails fast when nothing runs, nothing is pending and the planner does not
        shift for ``stall_ticks`` ticks: the deployment cannot make progress."""
        c, wf = self.cluster, self.workflow
        tr = c.training
        running = (any(r.num_seqs for r in c.replicas.values()) or tr.busy
                   or tr.ready_at > self.clock.now
                   or c.free_at_max > self.clock.now)
        mark = (wf.version, wf.processed_tokens, len(self.tracer.shifts), c.events)
        if running or mark != self._progress:
            self._stalled, self._progress = 0, mark
            return
        self._stalled += 1
        if self._stalled < self.stall_ticks:
            return
        waiting = {r.value: self.schedulers[r].num_seqs for r in INFERENCE_ROLES}
        reps = {r.value: len(self.device_map.replicas(r)) for r in Role}
        raise ConfigError(
            f"deployment {self.dep.name!r} on {self.group.name!r} makes no progress: at "
            f"virtual t={self.clock.now:.0f} s nothing has run for {self.stall_ticks} planner "
            f"ticks and the planner does not shift (step {wf.version}/{self.steps}; waiting "
            f"sequences {waiting}; replicas {reps}; training batch ready "
            f"{wf.batch_ready()}). A role with work has no devices or training cannot get "
            f"{self.train_needed} devices: fix Deployment.rollout_devices / reward_devices / "
            f"training_devices or the planner binding")

    def _release(self, plan: ShiftPlan) -> None:
        """A release-only plan (the rule-based strategy's shift down to the idle pool):
        ``ShiftExecutor.validate`` rejects plans with nothing to shift up, so the driver
        migrates the donors' sequences (alg. 3) and shifts them down itself."""
        for d in plan.down:
            if d.role in INFERENCE_ROLES:
                self.cluster.apply(self.schedulers[d.role].shift_down([d.replica_id]))
                self.shifter.shift_down(d.replica_id, None)
        self.tracer.shifts.append({"time": self.clock.now, "up_role": "idle", "num_up": 0,
                                   "num_down": len(plan.down), "reason": plan.reason})
        self.cluster._dirty.update(INFERENCE_ROLES)

    def _release_training(self) -> None:
        tr = self.cluster.training
        if (self.dep.release_idle_training and tr.devices and not tr.busy
                and not self.workflow.batch_ready()):
            self.shifter.shift_down(tr.replica_id)

    def run(self, progress=None) -> SimResult:
        c, wf = self.cluster, self.workflow
        wall0 = time.perf_counter()
        for seq in wf.release():
            self.schedulers[Role.ROLLOUT].submit(seq)
        self._provision()
        c._dirty.update(INFERENCE_ROLES)
        c.dispatch_dirty()
        c.push(0.0, TICK)
        self._check_bound()
        while not wf.done:
            if not c.heap:
                raise ConfigError("the simulation ran out of events before the last step; "
                                  "the deployment cannot make progress")
            t, _, kind, key = heapq.heappop(c.heap)
            if t > self.max_virtual_s:
                raise ConfigError(f"virtual time passed SimDriver.max_virtual_s="
                                  f"{self.max_virtual_s}; the deployment is stuck")
            self.clock.now = max(self.clock.now, t)
            if kind == REPLICA:
                c.on_replica_event(key, t)
            elif kind == TICK:
                self._tick()
                self._check_bound()
                c.push(self.clock.now + self.tick_s, TICK)
            elif kind == TRAIN_START:
                c.maybe_start_training()
            elif kind == TRAIN_DONE:
                c.on_train_done()
                self._release_training()
                if progress is not None:
                    progress(wf.version, self.clock.now)
            c.dispatch_dirty()
        return self.tracer.result(self, time.perf_counter() - wall0)
