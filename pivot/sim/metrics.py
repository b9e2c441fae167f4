"""What a simulated run reports: throughput, the allocation trace, shifts, planner and
migration overheads (sec. 8.2-8.6)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from pivot.shifting.role_shift import SlotKind
from pivot.types import INFERENCE_ROLES, Role


def overall_throughput(n_ro: int, t_ro: float, n_rm: int, t_rm: float) -> float:
    """Eq. 1: the weighted harmonic mean (N_ro + N_rm) / (N_ro / T_ro + N_rm / T_rm)."""
    if n_ro and not t_ro or n_rm and not t_rm:
        return 0.0
    denom = (n_ro / t_ro if n_ro else 0.0) + (n_rm / t_rm if n_rm else 0.0)
    return (n_ro + n_rm) / denom if denom > 0 else 0.0


@dataclass
class SimResult:
    """One run's numbers (JSON-ready)."""

    group: str
    deployment: str
    seed: int
    steps: int
    devices: int
    split: tuple[int, int]
    throughput: float
    """Tokens/s: prompt + generated tokens (rollout and reward) of steps 1..S-1 over the
    time from the end of training step 0 to the end of the last step."""
    step_time: float
    virtual_s: float
    wall_s: float
    events: int
    events_per_s: float
    shifts: int
    shifts_per_step: float
    generated_tokens: int
    expected_tokens: int
    planner: dict = field(default_factory=dict)
    migration: dict = field(default_factory=dict)
    shift_phases: dict = field(default_factory=dict)
    trace: list = field(default_factory=list)
    shift_log: list = field(default_factory=list)
    train_steps: list = field(default_factory=list)
    rollout_end: list = field(default_factory=list)
    """[step, virtual time its last response finished]."""
    training_phases: dict = field(default_factory=dict)
    """Seconds of each training phase of a mean step (``TrainingProfile.phase_seconds``
    of the mean batch tokens)."""
    step_processed: list = field(default_factory=list)
    """Tokens counted in ``throughput`` per step, steps 0..S-1 (a window that starts
    later, e.g. past the pipeline fill of a stale deployment, is measured from these and
    ``train_steps``: ``window_throughput``)."""

    def to_dict(self, trace: bool = False) -> dict:
        d = asdict(self)
        if not trace:
            d.pop("trace")
            d.pop("shift_log")
        return d


def window_throughput(step_processed: list, train_steps: list, first: int) -> float:
    """Tokens/s of steps ``first``..S-1 over the time from the end of training step
    ``first - 1`` to the end of the last (``first`` 1: ``SimResult.throughput``). With a
    staleness of s, rollout and reward of steps 1..s can run during step 0's wait, which
    the default window credits to it; ``first`` = s + 1 leaves that pipeline fill out."""
    if not 1 <= first < len(train_steps):
        raise ValueError(f"window_throughput: first={first} outside 1..{len(train_steps) - 1}")
    return sum(step_processed[first:]) / (train_steps[-1][2] - train_steps[first - 1][2])


@dataclass
class Tracer:
    """Collects samples at planner ticks and every executed shift."""

    samples: list = field(default_factory=list)
    shifts: list = field(default_factory=list)
    planner_wall: list = field(default_factory=list)
    planner_busy_wall: list = field(default_factory=list)
    planner_split: dict = field(default_factory=lambda: {"preprocess": 0.0, "construct": 0.0,
                                                         "simulate": 0.0})
    planner_calls: int = 0
    migration: dict = field(default_factory=lambda: {"aborted": 0, "dispatched": 0,
                                                     "abort_s": 0.0, "dispatch_s": 0.0,
                                                     "reprefill_s": 0.0})
    phases: dict = field(default_factory=dict)
    _last: tuple = (0.0, {Role.ROLLOUT: 0, Role.REWARD: 0})

    def planner_call(self, wall: float, timings: dict, planned: bool,
                     busy: bool = True) -> None:
        """One planner tick; ``busy``: some inference sequence ran or waited (else the
        planner has nothing to weigh: the cluster waits on training)."""
        self.planner_calls += 1
        self.planner_wall.append(wall)
        if busy:
            self.planner_busy_wall.append(wall)
        for k in self.planner_split:
            self.planner_split[k] += float(timings.get(k, 0.0))

    def shift(self, now: float, plan, report) -> None:
        for m in (report.migration_down, report.migration_up):
            for k in self.migration:
                self.migration[k] += getattr(m, k)
        for rec in report.down + report.up:
            key = f"{rec.role.value}_{rec.direction}"
            self.phases.setdefault(key, []).append(sum(rec.phases.values()))
        self.shifts.append({"time": now, "up_role": plan.up_role.value,
                            "num_up": plan.num_up, "num_down": len(report.down),
                            "reason": plan.reason})

    def sample(self, now: float, cluster, device_map) -> None:
        gen = dict(cluster.tokens_by_role)
        busy = {r.value: 0 for r in INFERENCE_ROLES}
        for rep in cluster.replicas.values():
            gen[rep.role] += rep.generated
            if rep.num_seqs:
                busy[rep.role.value] += len(rep.devices)
        t0, g0 = self._last
        dt = now - t0
        rate = {r: (gen[r] - g0[r]) / dt if dt > 0 else 0.0 for r in INFERENCE_ROLES}
        n = {r: cluster.schedulers[r].num_seqs for r in INFERENCE_ROLES}
        alloc = {r.value: device_map.active_count(r) for r in Role}
        self.samples.append({
            "time": now, "rollout_tps": rate[Role.ROLLOUT], "reward_tps": rate[Role.REWARD],
            "overall_tps": overall_throughput(n[Role.ROLLOUT], rate[Role.ROLLOUT],
                                              n[Role.REWARD], rate[Role.REWARD]),
            "alloc": alloc, "n_rollout": n[Role.ROLLOUT], "n_reward": n[Role.REWARD],
            # devices of replicas holding sequences, and idle devices (sim_utilization.py)
            "busy": busy, "idle": device_map.count(SlotKind.IDLE)})
        self._last = (now, {r: gen[r] for r in INFERENCE_ROLES})

    def result(self, driver, wall: float) -> SimResult:
        c, wf = driver.cluster, driver.workflow
        steps = c.training.step_times
        t_begin = steps[0][2]
        t_end = steps[-1][2]
        tokens = sum(wf.step_processed.get(s, 0) for s in range(1, wf.steps))
        gen = sum(c.tokens_by_role.values()) + sum(r.generated for r in c.replicas.values())
        expected = sum(it.response_len + (it.judge_len if it.judge_id is not None else 0)
                       for sid, it in wf.items.items() if sid == it.response_id)
        phases = {k: {"mean_s": sum(v) / len(v), "max_s": max(v), "count": len(v)}
                  for k, v in self.phases.items()}
        calls = max(self.planner_calls, 1)
        g, d = driver.group, driver.dep
        return SimResult(
            group=g.name, deployment=d.name, seed=driver.seed, steps=wf.steps,
            devices=g.devices, split=driver.split,
            throughput=tokens / (t_end - t_begin), step_time=(t_end - t_begin) / (wf.steps - 1),
            virtual_s=driver.clock.now, wall_s=wall, events=c.events,
            events_per_s=c.events / wall if wall > 0 else 0.0, shifts=len(self.shifts),
            shifts_per_step=len(self.shifts) / wf.steps, generated_tokens=gen,
            expected_tokens=expected,
            planner={"calls": self.planner_calls,
                     "mean_wall_s": sum(self.planner_wall) / calls,
                     "median_wall_s": _quantile(self.planner_wall, 0.5),
                     "p99_wall_s": _quantile(self.planner_wall, 0.99),
                     "busy_calls": len(self.planner_busy_wall),
                     "busy_median_wall_s": _quantile(self.planner_busy_wall, 0.5),
                     "busy_p99_wall_s": _quantile(self.planner_busy_wall, 0.99),
                     "max_wall_s": max(self.planner_wall, default=0.0),
                     "split_mean_s": {k: v / calls for k, v in self.planner_split.items()}},
            migration=dict(self.migration), shift_phases=phases, trace=self.samples,
            shift_log=self.shifts, train_steps=[list(s) for s in steps],
            rollout_end=sorted([k, v] for k, v in c.rollout_end.items()),
            step_processed=[wf.step_processed.get(s, 0) for s in range(wf.steps)],
            training_phases=g.training.phase_seconds(
                g.policy, sum(wf.step_tokens.values()) / len(wf.step_tokens),
                driver.train_needed))


def _quantile(xs: list[float], q: float) -> float:
    """The q-quantile of ``xs`` (nearest rank; 0 for none): per-tick planner time."""
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]
