import pytest

from pivot.errors import ConfigError, StateError
from pivot.planner import (NoShiftPlanner, PivotPlanner, RuleBasedPlanner, StaticPlanner,
                           VanillaPlanner)
from pivot.planner.evaluate import overall_throughput, simulate_shift_up
from pivot.planner.shift_pairs import (choose_shift_up_role, prepare_shift_pairs,
                                       role_throughput)
from pivot.scheduler import ThroughputModel
from pivot.testing.planner import MODEL, make_snapshot
from pivot.types import ReplicaView, Role, RoleLoad, TrainingLoad, WorkloadSnapshot

MODELS = {Role.ROLLOUT: MODEL, Role.REWARD: MODEL}


class FixedThroughput(ThroughputModel):
    """Reports a given per-replica throughput, to reproduce the state of fig. 8."""

    def __init__(self, per_replica: float):
        super().__init__(0, 1, 0, 0)
        object.__setattr__(self, "per", per_replica)

    def throughput(self, num_seqs, num_tokens):
        return self.per if num_seqs else 0.0


def test_figure_8_state_selects_reward_as_the_shift_up_role():
    # Reward: N=385, T=4752 over 16 replicas; rollout: N=59, T=2077 over 8; batch not ready.
    rm = [ReplicaView(f"rm{i}", Role.REWARD, (i,), 10**6) for i in range(16)]
    ro = [ReplicaView(f"ro{i}", Role.ROLLOUT, (16 + i,), 10**6) for i in range(8)]
    sid = 0
    for views, total in ((rm, 385), (ro, 59)):
        for k in range(total):
            v = views[k % len(views)]
            v.running[sid] = 100
            v.num_tokens += 100
            sid += 1
    snap = WorkloadSnapshot(0.0, RoleLoad(Role.ROLLOUT, ro, [], 1, 10**6, 32),
                            RoleLoad(Role.REWARD, rm, [], 1, 10**6, 32),
                            TrainingLoad(8, tuple(range(24, 32))), (0,) * 32)
    models = {Role.REWARD: FixedThroughput(4752 / 16), Role.ROLLOUT: FixedThroughput(2077 / 8)}
    assert choose_shift_up_role(snap, models) is Role.REWARD


def test_a_ready_batch_makes_training_the_shift_up_role(snapshot):
    snap = make_snapshot(training_devices=False, batch_ready=True)
    assert choose_shift_up_role(snap, MODELS) is Role.TRAINING
    plan = PivotPlanner(MODEL, MODEL).plan(snap)
    assert plan.up_role is Role.TRAINING
    assert len(plan.up_devices[0]) == 8
    assert set(plan.up_devices[0]) == set(range(24, 32))  # the idle devices come first


def test_shift_pairs_free_whole_replicas_of_the_shift_up_role(snapshot):
    pairs = prepare_shift_pairs(snapshot, Role.REWARD, MODELS)
    assert [p.penalty for p in pairs] == sorted(p.penalty for p in pairs)
    for p in pairs:
        freed = sorted(d for s in p.down for d in s.devices)
        assert all(len(g) == 4 for g in p.up_devices)
        assert sorted(d for g in p.up_devices for d in g) == freed
    rollout_pairs = [p for p in pairs if p.down[0].role is Role.ROLLOUT]
    assert all(len(p.down) == 4 and p.r == 1 for p in rollout_pairs)
    training = [p for p in pairs if p.down[0].role is Role.TRAINING]
    assert len(training) == 1 and training[0].r == 2 and training[0].penalty == 0


def test_the_planner_shifts_devices_to_the_overloaded_role(snapshot):
    planner = PivotPlanner(MODEL, MODEL, H=60)
    plan = planner.plan(snapshot)
    assert plan is not None and plan.up_role is Role.REWARD
    assert plan.benefit > 0 and plan.t_candidate > plan.t_current
    assert plan.benefit == pytest.approx(60 * (plan.t_candidate - plan.t_current) - plan.penalty)
    assert set(planner.last_timings) == {"preprocess", "construct", "simulate"}
    freed = set(plan.freed_devices)
    assert all(set(g) <= freed for g in plan.up_devices)


def test_scheduler_rule_evaluates_candidates_under_the_engines_batch_cap():
    """With ``scheduler_rule`` a replica at its batch cap takes no more sequences in the
    what-if, as in the scheduler; the paper's what-if lets every replica absorb the queue
    and credits the shift up with throughput the capped replicas cannot give."""
    snap = make_snapshot(ro_busy=8, rm_seqs=10, waiting=200, training_devices=False)
    snap.reward.max_seqs = 10   # every reward replica is at its cap, 200 wait
    snap.rollout.max_seqs = 64
    paper = PivotPlanner(MODEL, MODEL, H=5.0).plan(snap)
    capped = PivotPlanner(MODEL, MODEL, H=5.0, scheduler_rule=True).plan(snap)
    assert paper.up_role is capped.up_role is Role.REWARD
    assert not [d for d in capped.down if d.role is not None]   # idle devices only
    t_ro = role_throughput(snap.rollout, MODEL)
    n_ro, n_rm = snap.rollout.num_seqs, snap.reward.num_seqs
    new = capped.up_devices
    assert capped.t_candidate == overall_throughput(
        n_ro, t_ro, n_rm, simulate_shift_up(snap.reward, MODEL, new, max_seqs=10))
    assert paper.t_candidate == overall_throughput(
        n_ro, t_ro, n_rm, simulate_shift_up(snap.reward, MODEL, paper.up_devices))
    assert capped.t_candidate < paper.t_candidate


def test_no_plan_when_no_candidate_has_positive_benefit(snapshot):
    # A tiny horizon cannot pay back any penalty, and a balanced idle system gains nothing.
    snap = make_snapshot(ro_busy=8, rm_seqs=2, waiting=0, training_devices=False)
    snap = WorkloadSnapshot(snap.time, snap.rollout, snap.reward, snap.training,
                            snap.device_host, idle_devices=())
    assert PivotPlanner(MODEL, MODEL, H=1e-6).plan(snap) is None


def test_bad_parameters_and_state_are_refused():
    with pytest.raises(ConfigError, match=r"PivotPlanner.H=0: must be a number > 0"):
        PivotPlanner(MODEL, MODEL, H=0)
    snap = make_snapshot()
    snap.rollout.replicas[1].running[snap.reward.replicas[0].running and
                                     next(iter(snap.reward.replicas[0].running))] = 1
    snap.rollout.replicas[1].num_tokens += 1
    with pytest.raises(StateError, match="runs on both"):
        PivotPlanner(MODEL, MODEL).plan(snap)
    snap = make_snapshot()
    snap.reward.replicas[0].devices = (0, 1, 2, 3)
    with pytest.raises(StateError, match="device 0 is held by both"):
        PivotPlanner(MODEL, MODEL).plan(snap)
    snap = make_snapshot()
    snap.rollout.tau_shift = -1
    with pytest.raises(StateError, match="tau_shift"):
        PivotPlanner(MODEL, MODEL).plan(snap)


def test_no_shift_planner_never_plans(snapshot):
    assert NoShiftPlanner().plan(snapshot) is None


def test_static_planner_lends_training_devices_evenly_and_takes_them_back():
    snap = make_snapshot(training_devices=False)
    static = StaticPlanner(MODEL, MODEL, home_devices=tuple(range(24, 32)))
    plan = static.plan(snap)
    assert plan.up_role is Role.ROLLOUT and len(plan.up_devices) == 1
    ready = make_snapshot(training_devices=False, batch_ready=True)
    back = static.plan(ready)
    assert back.up_role is Role.TRAINING and set(back.up_devices[0]) == set(range(24, 32))


def test_rule_based_planner_follows_kv_thresholds():
    snap = make_snapshot(training_devices=False, waiting=400)
    plan = RuleBasedPlanner(MODEL, MODEL).plan(snap)
    assert plan.up_role is Role.REWARD  # reward KV use is above 0.8 with work waiting
    assert set(plan.freed_devices) <= set(range(24, 32))
    calm = make_snapshot(training_devices=False, waiting=0)
    release = RuleBasedPlanner(MODEL, MODEL).plan(calm)
    assert release.up_role is Role.ROLLOUT and release.up_devices == ()
    assert release.down[0].role is Role.ROLLOUT  # rollout's KV use is below 0.1
    with pytest.raises(ConfigError, match=r"RuleBasedPlanner.down=0.5: .*down < up"):
        RuleBasedPlanner(MODEL, MODEL, up=0.1, down=0.5)


def test_vanilla_planner_uses_busy_or_idle_throughput(snapshot):
    plan = VanillaPlanner().plan(snapshot)
    assert plan is None or plan.up_role in (Role.REWARD, Role.ROLLOUT)


def _one_host_snapshot():
    """4 one-device slots on one host: 2 empty rollout replicas, 2 reward replicas with
    a queue (the local workload between two rollout bursts)."""
    ro = [ReplicaView(f"ro{i}", Role.ROLLOUT, (i,), 16_000) for i in range(2)]
    rm = [ReplicaView(f"rm{i}", Role.REWARD, (2 + i,), 16_000) for i in range(2)]
    sid = 0
    for r in rm:
        for _ in range(40):
            r.running[sid] = 120
            r.num_tokens += 120
            sid += 1
    wait = [(sid + i, 120) for i in range(100)]
    return WorkloadSnapshot(0.0, RoleLoad(Role.ROLLOUT, ro, [], 1, 16_000, 4, 0.5),
                            RoleLoad(Role.REWARD, rm, wait, 1, 16_000, 4, 0.5),
                            TrainingLoad(1), (0, 0, 0, 0))


def test_min_replicas_keeps_a_replica_of_the_donating_role():
    snap = _one_host_snapshot()
    paper = PivotPlanner(MODEL, MODEL).plan(snap)
    assert paper.up_role is Role.REWARD
    assert sorted(d.replica_id for d in paper.down) == ["ro0", "ro1"]   # rollout emptied
    kept = PivotPlanner(MODEL, MODEL, min_replicas=1).plan(snap)
    assert kept.up_role is Role.REWARD and len(kept.down) == 1
    assert len(kept.up_devices) == 1
    assert PivotPlanner(MODEL, MODEL, min_replicas=2).plan(snap) is None
    with pytest.raises(ConfigError, match="PivotPlanner.min_replicas=-1"):
        PivotPlanner(MODEL, MODEL, min_replicas=-1)
