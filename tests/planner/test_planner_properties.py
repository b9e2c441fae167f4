"""Random workload snapshots: every plan the planner returns is well formed and pays off."""

from hypothesis import given, settings, strategies as st

from pivot.planner import PivotPlanner, RuleBasedPlanner, StaticPlanner, VanillaPlanner
from pivot.testing.planner import MODEL, make_snapshot
from pivot.types import Role, WorkloadSnapshot

snapshots = st.builds(
    make_snapshot,
    ro_busy=st.integers(0, 8), rm_seqs=st.integers(0, 80), waiting=st.integers(0, 300),
    training_devices=st.booleans(), seed=st.integers(0, 10_000), batch_ready=st.booleans())


def owner_of(snap: WorkloadSnapshot) -> dict[int, object]:
    own: dict[int, object] = {d: None for d in snap.idle_devices}
    for load in (snap.rollout, snap.reward):
        for r in load.replicas:
            own.update({d: (load.role, r.replica_id) for d in r.devices})
    own.update({d: Role.TRAINING for d in snap.training.devices})
    return own


def check_plan(snap, plan):
    own = owner_of(snap)
    freed = [d for s in plan.down for d in s.devices]
    assert len(freed) == len(set(freed)), "a device is freed twice"
    for s in plan.down:
        for d in s.devices:
            expected = (s.role, s.replica_id) if s.replica_id else s.role
            assert own[d] == expected, f"device {d} is not held by donor {s}"
    up = [d for g in plan.up_devices for d in g]
    assert len(up) == len(set(up)) and set(up) <= set(freed)
    if plan.up_role in (Role.ROLLOUT, Role.REWARD):
        size = snap.role_load(plan.up_role).replica_devices
        for g in plan.up_devices:
            assert len(g) == size and len({snap.device_host[d] for d in g}) == 1
        assert all(s.role is not plan.up_role for s in plan.down if plan.up_devices)
    else:
        assert len(plan.up_devices) == 1 and len(up) == snap.training.devices_needed


@settings(max_examples=60, deadline=None)
@given(snap=snapshots, H=st.sampled_from([0.01, 5.0, 60.0, 600.0]))
def test_pivot_plans_are_well_formed_and_have_positive_benefit(snap, H):
    plan = PivotPlanner(MODEL, MODEL, H=H).plan(snap)
    if plan is None:
        return
    check_plan(snap, plan)
    if plan.up_role is not Role.TRAINING:
        assert plan.benefit > 0
        assert abs(plan.benefit - (H * (plan.t_candidate - plan.t_current) - plan.penalty)) \
            <= 1e-6 * max(1.0, abs(plan.benefit))


@settings(max_examples=40, deadline=None)
@given(snap=snapshots)
def test_every_strategy_returns_a_well_formed_plan_or_none(snap):
    for planner in (VanillaPlanner(), RuleBasedPlanner(MODEL, MODEL),
                    StaticPlanner(MODEL, MODEL, home_devices=tuple(range(24, 32)))):
        plan = planner.plan(snap)
        if plan is not None and plan.up_devices:
            check_plan(snap, plan)
