"""The simulated soak: the real control plane on a large simulated cluster, shifted far
more often than any planner would, with replicas killed and recovered, and every invariant
checked after every event.

    report = run_soak(SoakConfig(devices=1024, target_shifts=10_000))

The loop is ``SimDriver.run``'s, with two additions per event: the injectors and the
invariant checker. Every event runs the incremental checker
(``pivot.reliability.incremental``: I1 to I5 over what the event touched, plus O(1)
counters), and every ``full_check_every`` events and at the end the full ``check_state``
with the prefix ledger over every live sequence and a comparison of the incremental
indexes with a rebuild. When ``target_shifts`` is reached the workflow stops releasing
steps and the run drains, so every released sequence must finish: a lost sequence would
leave the workflow short of its last batch (and is counted, not hidden).
"""

from __future__ import annotations

import heapq
import logging
import time
from dataclasses import asdict, dataclass, field

import gin
import numpy as np

from pivot import gin_setup
from pivot.config.validation import check_range
from pivot.reliability.injectors import FlakyBackend, ForcedShiftPlanner, ReplicaKiller
from pivot.shifting.role_shift import SlotKind
from pivot.shifting.shifter import ShiftError
from pivot.reliability.incremental import IncrementalChecker
from pivot.reliability.invariants import raise_if
from pivot.reliability.sim_state import SimSource, expected_live
from pivot.sim.engine import REPLICA, TICK, TRAIN_DONE, TRAIN_START
from pivot.types import INFERENCE_ROLES, Role

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SoakConfig:
    """Attributes:
        gin_file: the model group (its GenRM and policy shapes).
        devices: simulated cluster size.
        target_shifts: shift plans to execute before draining.
        tick_s: planner period (virtual seconds); small ticks make shifts frequent.
        kill_rate: expected replica kills per tick; down_s: how long their devices stay lost.
        prompts_per_step / n / medians / caps: a small workload (fast events).
        check_every: run the incremental checker after every n-th event (1: every
            event; the journal accumulates in between, so nothing goes unchecked).
        full_check_every: run the full check after every n-th event (and at the end).
        max_wall_s: wall-clock bound; a soak past it stops and records a violation.
    """

    gin_file: str = "gin/qwen7b_30b.gin"
    devices: int = 1024
    target_shifts: int = 10_000
    seed: int = 0
    tick_s: float = 0.25
    kill_rate: float = 0.2
    down_s: float = 5.0
    prompts_per_step: int = 16
    n: int = 4
    response_median: int = 300
    judge_median: int = 200
    shift_fail_rate: float = 0.02
    """Probability that an inference shift up fails midway (its devices become LOST)."""
    check_every: int = 1
    full_check_every: int = 1000
    max_wall_s: float = 3600.0

    def __post_init__(self) -> None:
        for k in ("devices", "target_shifts", "prompts_per_step", "check_every",
                  "full_check_every"):
            check_range(f"SoakConfig.{k}", getattr(self, k), 1, integer=True)
        check_range("SoakConfig.n", self.n, 2, integer=True, why="GRPO group")
        check_range("SoakConfig.seed", self.seed, 0, integer=True)
        for k in ("kill_rate", "shift_fail_rate"):
            check_range(f"SoakConfig.{k}", getattr(self, k), 0, 1, why="per tick")
        for k in ("tick_s", "max_wall_s", "response_median", "judge_median"):
            check_range(f"SoakConfig.{k}", getattr(self, k), 0, open_lo=True)
        check_range("SoakConfig.down_s", self.down_s, 0)


@dataclass
class SoakReport:
    devices: int
    shift_plans: int = 0
    failed_shifts: int = 0
    replica_shifts: int = 0
    events: int = 0
    invariant_checks: int = 0
    """Checker passes (incremental plus full)."""
    incremental_checks: int = 0
    full_checks: int = 0
    prefix_checks: int = 0
    checked_items: dict[str, int] = field(default_factory=dict)
    """Sequences, replicas and devices the incremental passes checked (summed)."""
    check_wall_s: dict[str, float] = field(default_factory=dict)
    """Wall seconds in the incremental and the full checks."""
    faults_injected: int = 0
    faults_survived: int = 0
    devices_recovered: int = 0
    sequences_requeued_by_faults: int = 0
    sequences_released: int = 0
    sequences_finished: int = 0
    sequences_lost: int = 0
    steps_trained: int = 0
    virtual_s: float = 0.0
    wall_s: float = 0.0
    wall_ms_per_event: float = 0.0
    recover_virtual_s: dict[str, float] = field(default_factory=dict)
    """Virtual seconds from a kill until all its requeued sequences run again."""
    kill_handle_wall_s: dict[str, float] = field(default_factory=dict)
    """Wall seconds the control plane spent on each kill (lose_replica, mark_lost, apply)."""
    violations: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def build_driver(cfg: SoakConfig):
    """A ``SimDriver`` from the group's gin file with the soak's overrides."""
    params = [f"ModelGroup.devices = {cfg.devices}", f"SimDriver.seed = {cfg.seed}",
              f"SimDriver.tick_s = {cfg.tick_s}", "SimDriver.steps = 100000",
              f"ModelGroup.prompts_per_step = {cfg.prompts_per_step}",
              f"ModelGroup.n = {cfg.n}", f"LengthModel.response_median = {cfg.response_median}",
              f"LengthModel.judge_median = {cfg.judge_median}",
              "LengthModel.response_cap = 2048", "LengthModel.judge_cap = 2048",
              "SimDriver.max_virtual_s = 1e9"]
    gin_setup.parse([cfg.gin_file], params)
    driver = gin_setup.build()
    gin.clear_config()
    rng = np.random.default_rng(cfg.seed + 1)
    driver.planner = ForcedShiftPlanner(
        driver.models[Role.ROLLOUT], driver.models[Role.REWARD],
        {r: driver.shapes[r].replica_devices for r in INFERENCE_ROLES},
        driver.group.devices_per_host, rng, donate_p=0.7, feasible_only=False)
    return driver


def run_soak(cfg: SoakConfig) -> SoakReport:
    """Runs the soak; raises InvariantError at the first violated invariant."""
    driver = build_driver(cfg)
    c, wf = driver.cluster, driver.workflow
    killer = ReplicaKiller(np.random.default_rng(cfg.seed + 2), cfg.kill_rate, cfg.down_s)
    flaky = FlakyBackend(driver.shifter.backend, np.random.default_rng(cfg.seed + 3),
                         cfg.shift_fail_rate)
    rep = SoakReport(cfg.devices)
    wall0 = time.perf_counter()
    for seq in wf.release():
        driver.schedulers[Role.ROLLOUT].submit(seq)
    driver._provision()
    driver.shifter.backend = flaky  # after provisioning: faults hit the run, not its setup
    c._dirty.update(INFERENCE_ROLES)
    c.dispatch_dirty()
    c.push(0.0, TICK)
    draining = False
    checker = IncrementalChecker(SimSource(driver))
    raise_if(checker.full())

    while not wf.done:
        if not c.heap:
            rep.violations.append("ran out of events before the last step")
            break
        if time.perf_counter() - wall0 > cfg.max_wall_s:
            rep.violations.append(f"soak passed max_wall_s={cfg.max_wall_s}")
            break
        t, _, kind, key = heapq.heappop(c.heap)
        driver.clock.now = max(driver.clock.now, t)
        if kind == REPLICA:
            c.on_replica_event(key, t)
        elif kind == TICK:
            if not draining:
                killer.maybe_recover(driver)
                killer.maybe_kill(driver)
            before = len(driver.device_map.events)
            lost0 = set(driver.device_map.devices_in(SlotKind.LOST))
            try:
                driver._tick()
            except ShiftError as e:  # injected mid-shift failure: devices LOST, go on
                rep.failed_shifts += 1
                new = set(driver.device_map.devices_in(SlotKind.LOST)) - lost0
                killer.pending.append((driver.clock.now + cfg.down_s, tuple(sorted(new))))
                c._dirty.update(INFERENCE_ROLES)
                c.maybe_start_training()
                log.info("shift failed (injected): %s", e)
            moved = _replica_shifts(driver.device_map.events[before:])
            if moved:
                rep.shift_plans += 1
                rep.replica_shifts += moved
            c.push(driver.clock.now + cfg.tick_s, TICK)
            if not draining and rep.shift_plans >= cfg.target_shifts:
                draining = True
                wf.steps = wf.released  # release nothing more; drain what is live
                driver.planner = _DrainPlanner(driver.planner)
                flaky.rate = 0.0
            if draining:
                killer.maybe_recover(driver)
        elif kind == TRAIN_START:
            c.maybe_start_training()
        elif kind == TRAIN_DONE:
            c.on_train_done()
        c.dispatch_dirty()
        killer.track(driver)
        rep.events += 1
        if rep.events % cfg.full_check_every == 0:
            raise_if(checker.full())
        elif rep.events % cfg.check_every == 0:
            raise_if(checker.check())
    raise_if(checker.full())
    st = checker.stats
    rep.incremental_checks, rep.full_checks = st.incremental, st.full
    rep.invariant_checks = st.incremental + st.full
    rep.checked_items = {"sequences": st.seqs, "replicas": st.replicas, "devices": st.devices}
    rep.check_wall_s = {"incremental": st.incremental_s, "full": st.full_s}
    rep.faults_injected = killer.killed + flaky.failed
    rep.devices_recovered = killer.recovered
    rep.faults_survived = rep.faults_injected if not rep.violations and wf.done else 0
    rep.sequences_requeued_by_faults = killer.requeued
    rep.prefix_checks = checker.ledger.checks
    live = expected_live(wf)
    rep.sequences_released = sum(1 for s, it in wf.items.items() if s == it.response_id)
    rep.sequences_finished = sum(1 for s, it in wf.items.items()
                                 if s == it.response_id and it.rewarded)
    rep.sequences_lost = (rep.sequences_released - rep.sequences_finished
                          if wf.done else sum(len(x) for x in live.values()))
    rep.steps_trained = wf.version
    rep.virtual_s = driver.clock.now
    rep.wall_s = time.perf_counter() - wall0
    rep.wall_ms_per_event = 1000 * rep.wall_s / max(rep.events, 1)
    if killer.recover_s:
        r = np.array(killer.recover_s)
        rep.recover_virtual_s = {"mean": float(r.mean()), "p50": float(np.median(r)),
                                 "p99": float(np.quantile(r, 0.99)), "max": float(r.max()),
                                 "n": int(r.size)}
    if killer.handle_wall_s:
        r = np.array(killer.handle_wall_s)
        rep.kill_handle_wall_s = {"mean": float(r.mean()), "max": float(r.max()),
                                  "n": int(r.size)}
    return rep


def _replica_shifts(events) -> int:
    """Replicas (or training) shifted down plus shifted up in a slice of map events."""
    down = {e.before.replica_id for e in events if e.transition.value == "begin_down"}
    up = {e.after.replica_id for e in events if e.transition.value == "begin_up"}
    return len(down) + len(up)


class _DrainPlanner:
    """After the soak's shifts: only training's shift up (so the last batches train)."""

    def __init__(self, inner: ForcedShiftPlanner):
        self.inner = inner

    def plan(self, snap):
        snap.check()
        return self.inner.training_up(snap)
