"""PivotRL's planner: the five-step procedure of sec. 7.1 (fig. 8).

1. determine the shift-up role; 2. prepare shift pairs sorted by penalty phi;
3. construct one candidate per shift-up count with the DP of alg. 1;
4. evaluate each by simulating migration and taking eq. 1's overall throughput;
5. select the candidate with the largest positive benefit B = H (T_cand - T_cur) - phi.
"""

from __future__ import annotations

import time

import gin

from pivot.config.validation import check_bool, check_range
from pivot.planner.base import Planner
from pivot.planner.blocks import check_blocks_fit
from pivot.planner.candidates import candidate_set
from pivot.planner.evaluate import IncrementalShiftDown, IncrementalShiftUp, overall_throughput
from pivot.planner.shift_pairs import (ShiftPair, choose_shift_up_role,
                                       prepare_aligned_shift_pairs, prepare_shift_pairs,
                                       role_throughput)
from pivot.scheduler import kernels
from pivot.scheduler.throughput import BinaryThroughputModel, ThroughputModel
from pivot.types import Role, RoleLoad, ShiftDown, ShiftPlan, WorkloadSnapshot


@gin.configurable
class PivotPlanner(Planner):
    """Args:
        rollout_model / reward_model: throughput models (sec. 6.1).
        H: seconds a shift's throughput gain is expected to last (sec. 7.3, default 60).
        migrate: simulate alg. 4's migration loop (False for the "+ throughput model"
            ablation, matching a scheduler built with ``migrate_on_shift_up=False``).
        min_replicas: replicas an inference role keeps when it donates to the other one
            (0: the paper's planner, which may empty a role). An emptied role takes the
            next shift back from a loaded replica (a migration) as soon as its work
            arrives; on the local workload, where rollout's work comes in bursts each
            publish, 1 kept the planner from emptying rollout twice a step.
        aligned_blocks: place every new inference replica of k devices on an aligned
            block of one host (devices at places [j*k, (j+1)*k) within it, never across
            hosts) and grow a role only onto blocks whose every device is freed
            (``pivot.planner.blocks``, ``prepare_aligned_shift_pairs``). For GPUs, where a
            replica's TP/EP groups are fixed when its engine starts (sec. 5.2).
            Off by default: the planner's plans are then exactly those it made before the
            option existed (tests/planner/test_blocks.py holds their digest).
        scheduler_rule: the what-if dispatches under the real scheduler's eligibility
            rule as the monitor reports it (``RoleLoad.max_seqs``, the engines' batch
            cap, and ``kv_reserve``), so a replica at its cap takes no more sequences
            and they wait, as they do in the engine. Off (the default, and every
            simulator figure under results/sim): the paper's what-if, in which any
            replica with free KV takes a sequence; it then credits a loaded role with
            throughput its capped replicas cannot give and undervalues a shift up to it.
    """

    def __init__(self, rollout_model: ThroughputModel, reward_model: ThroughputModel,
                 H: float = 60.0, migrate: bool = True, min_replicas: int = 0,
                 aligned_blocks: bool = False, scheduler_rule: bool = False) -> None:
        super().__init__(rollout_model, reward_model, aligned_blocks)
        check_range("PivotPlanner.H", H, 0, open_lo=True, why="seconds a shift's gain lasts")
        check_bool("PivotPlanner.migrate", migrate)
        check_range("PivotPlanner.min_replicas", min_replicas, 0, integer=True)
        check_bool("PivotPlanner.scheduler_rule", scheduler_rule)
        self.scheduler_rule = scheduler_rule
        self._fits_checked: tuple | None = None
        self.H = H
        self.migrate = migrate
        self.min_replicas = min_replicas
        self.last_timings: dict[str, float] = {}
        kernels.warm_up()  # the what-if loops' one-off compile, outside any tick

    def check_fits(self, devices: int, max_replicas: dict[Role, int], where: str) -> None:
        most = max(max_replicas.values())
        check_range("PivotPlanner.min_replicas", self.min_replicas, 0, most - 1, integer=True,
                    why=f"a donating role keeps this many and gives one more; a role holds "
                        f"at most {most} replicas ({where})")

    def _plan(self, snap: WorkloadSnapshot) -> ShiftPlan | None:
        t0 = time.perf_counter()
        up = choose_shift_up_role(snap, self.models)
        if up is Role.TRAINING:
            plan = self.training_up(snap)
            self.last_timings = {"preprocess": time.perf_counter() - t0,
                                 "construct": 0.0, "simulate": 0.0}
            return plan
        plan = self._plan_inference(snap, up, t0)
        if plan is None and snap.idle_devices:
            # The chosen role may be unable to use the idle devices (replica size); offer
            # them to the other role rather than leave them idle.
            other = Role.REWARD if up is Role.ROLLOUT else Role.ROLLOUT
            plan = self._plan_inference(snap, other, time.perf_counter(), idle_only=True)
        return plan

    def _plan_inference(self, snap: WorkloadSnapshot, up: Role, t0: float,
                        idle_only: bool = False) -> ShiftPlan | None:
        if not snap.rollout.num_seqs and not snap.reward.num_seqs:
            # No sequence anywhere: eq. 1 gives T = 0 before and after every candidate, so
            # every benefit is -phi <= 0 and none is chosen (the cluster waits on training).
            self.last_timings = {"preprocess": time.perf_counter() - t0,
                                 "construct": 0.0, "simulate": 0.0}
            return None
        up_load = snap.role_load(up)
        other = Role.REWARD if up is Role.ROLLOUT else Role.ROLLOUT
        down_load = snap.role_load(other)
        if self.aligned_blocks:
            self._check_blocks_fit(snap)
            pairs = prepare_aligned_shift_pairs(snap, up, self.models)
        else:
            pairs = prepare_shift_pairs(snap, up, self.models)
        if idle_only:
            pairs = [p for p in pairs if all(d.role is None for d in p.down)]
        if self.min_replicas:
            pairs = _keep_replicas(pairs, other, len(down_load.replicas) - self.min_replicas)
        K = min(up_load.max_replicas - len(up_load.replicas), sum(p.r for p in pairs))
        t1 = time.perf_counter()
        cands = candidate_set(pairs, K) if K > 0 else None
        t2 = time.perf_counter()

        n = {Role.ROLLOUT: snap.rollout.num_seqs, Role.REWARD: snap.reward.num_seqs}
        t_now = {r: role_throughput(snap.role_load(r), self.models[r]) for r in n}
        t_cur = overall_throughput(n[Role.ROLLOUT], t_now[Role.ROLLOUT],
                                   n[Role.REWARD], t_now[Role.REWARD])
        best: tuple | None = None
        up_sim = IncrementalShiftUp(up_load, self.models[up], self.migrate,
                                    **self._rule(up_load))
        down_sim = IncrementalShiftDown(down_load, self.models[other],
                                        **self._rule(down_load))
        donors_of = [[d.replica_id for d in p.down if d.role is other] for p in pairs]
        # Candidates are evaluated from their counts and donor ids; the plan's device
        # groups are assembled for the chosen one only.
        for k in cands.counts() if cands is not None else ():
            phi = cands.penalty[k]
            choice = cands.choice(k)
            donors = [rid for i, _ in choice for rid in donors_of[i]]
            t_after = dict(t_now)
            t_after[up] = up_sim.throughput_with_count(k)
            if donors:
                t_after[other] = down_sim.throughput_without(donors)
            t_cand = overall_throughput(n[Role.ROLLOUT], t_after[Role.ROLLOUT],
                                        n[Role.REWARD], t_after[Role.REWARD])
            gain = self.H * (t_cand - t_cur)
            benefit = gain - phi
            if benefit > 0 and (best is None or benefit > best[0]):
                best = (benefit, k, phi, choice, gain, t_cand, len(donors))
        plan = None
        if best is not None:
            benefit, k, phi, choice, gain, t_cand, n_donors = best
            down, up_devs = self._assemble(pairs, choice)
            plan = ShiftPlan(up, down, up_devs, penalty=phi, gain=gain, benefit=benefit,
                             t_current=t_cur, t_candidate=t_cand,
                             reason=f"{up.value} +{k} replicas, {n_donors} "
                                    f"{other.value} replicas down")
        t3 = time.perf_counter()
        self.last_timings = {"preprocess": t1 - t0, "construct": t2 - t1, "simulate": t3 - t2}
        if plan is not None:
            plan.timings.update(self.last_timings)
        return plan

    def _rule(self, load: RoleLoad) -> dict:
        """The what-if's dispatch rule: the scheduler's with ``scheduler_rule``, else none."""
        if not self.scheduler_rule:
            return {}
        return {"kv_reserve": load.kv_reserve, "max_seqs": load.max_seqs}

    def _check_blocks_fit(self, snap: WorkloadSnapshot) -> None:
        """ConfigError when a replica cannot fit one host (once per pool and sizes)."""
        key = (snap.device_host, snap.rollout.replica_devices, snap.reward.replica_devices)
        if key != self._fits_checked:
            check_blocks_fit(snap.device_host,
                             {r.value: snap.role_load(r).replica_devices
                              for r in (Role.ROLLOUT, Role.REWARD)},
                             "the replicas' ModelProfile.devices and the hosts' sizes")
            self._fits_checked = key

    @staticmethod
    def _assemble(pairs: list[ShiftPair], choice) -> tuple[tuple[ShiftDown, ...],
                                                           tuple[tuple[int, ...], ...]]:
        down: list[ShiftDown] = []
        up_devs: list[tuple[int, ...]] = []
        for i, e in choice:
            down.extend(pairs[i].down)
            up_devs.extend(pairs[i].up_devices[:e])
        return tuple(down), tuple(up_devs)


def _keep_replicas(pairs: list[ShiftPair], role: Role, spare: int) -> list[ShiftPair]:
    """The pairs, cheapest first, whose donor replicas of ``role`` add up to at most
    ``spare`` (pairs without such donors are all kept)."""
    out = []
    for p in pairs:
        n = sum(1 for d in p.down if d.role is role)
        if n and n > spare:
            continue
        spare -= n
        out.append(p)
    return out


@gin.configurable
class ThroughputModelPlanner(PivotPlanner):
    """Ablation "vanilla + throughput model" (sec. 8.4): no shift-up migration. ``H`` and
    ``min_replicas`` are ``PivotPlanner``'s (its defaults and its gin bindings, e.g.
    ``PivotPlanner.H = 120.0``)."""

    def __init__(self, rollout_model: ThroughputModel, reward_model: ThroughputModel) -> None:
        super().__init__(rollout_model, reward_model, migrate=False)


@gin.configurable
class VanillaPlanner(PivotPlanner):
    """Ablation "vanilla" (sec. 8.4): replica throughput is 0 or 1 (busy or not) and no
    migration; only the runtime and the planner's procedure remain. ``H`` and
    ``min_replicas`` are ``PivotPlanner``'s, as for ``ThroughputModelPlanner``."""

    def __init__(self, rollout_model: ThroughputModel | None = None,
                 reward_model: ThroughputModel | None = None) -> None:
        super().__init__(BinaryThroughputModel(), BinaryThroughputModel(), migrate=False)
