"""The forced-shift planner on a few devices (the cluster driver's slots): with
``feasible_only`` and ``donate_p = 1`` (``ForcedShiftPlanner``'s defaults) every tick
flips one replica between rollout and reward, never below ``min_replicas``; the soak's
settings keep their draws, so some ticks shift nothing there."""

import pytest

from pivot.planner.monitor import RoleShape, snapshot
from pivot.reliability.injectors import ForcedShiftPlanner, forced_shift_planner
from pivot.scheduler.scheduler import ShiftAwareScheduler
from pivot.scheduler.throughput import ThroughputModel
from pivot.types import INFERENCE_ROLES, ReplicaView, Role, TrainingLoad

TM = ThroughputModel(1e-6, 0.01, 4e-4, 0.0)


def _snap(rollout: tuple[int, ...], reward: tuple[int, ...], training=(), idle=()):
    scheds = {r: ShiftAwareScheduler(r, TM) for r in INFERENCE_ROLES}
    for role, devs in ((Role.ROLLOUT, rollout), (Role.REWARD, reward)):
        scheds[role].add_replicas([ReplicaView(f"{role.value}{d}", role, (d,), 1000)
                                   for d in devs])
    shapes = {r: RoleShape(1, 1000, 4, 0.5) for r in INFERENCE_ROLES}
    return snapshot(0.0, scheds, shapes, TrainingLoad(1, tuple(training), busy=True),
                    (0, 0, 0, 0), idle)


@pytest.mark.parametrize("split", [((0, 2, 3), (1,)), ((2, 3), (1,)), ((2,), (1, 3)),
                                   ((0, 2), (1, 3))])
def test_every_tick_flips_one_replica_on_four_slots(split):
    rollout, reward = split
    training = tuple(sorted(set(range(4)) - set(rollout) - set(reward)))
    p = forced_shift_planner(TM, TM, seed=3)
    for _ in range(50):
        plan = p.plan(_snap(rollout, reward, training))
        assert plan is not None and plan.reason == "forced shift"
        (down,) = plan.down
        assert down.role is not plan.up_role and plan.up_devices == (down.devices,)
        donors = rollout if down.role is Role.ROLLOUT else reward
        assert len(donors) > 1   # the donor keeps min_replicas = 1


def test_both_directions_are_drawn():
    p = forced_shift_planner(TM, TM, seed=0)
    ups = {p.plan(_snap((0, 2), (1, 3))).up_role for _ in range(50)}
    assert ups == {Role.ROLLOUT, Role.REWARD}


def test_the_soaks_settings_keep_their_draws():
    import numpy as np

    p = ForcedShiftPlanner(TM, TM, {r: 1 for r in INFERENCE_ROLES}, 4,
                           np.random.default_rng(0), donate_p=0.7, feasible_only=False)
    plans = [p.plan(_snap((0, 2, 3), (1,))) for _ in range(50)]
    assert any(x is None for x in plans) and any(x is not None for x in plans)


def _tp_snap(rollout_blocks, reward, training=(), idle=()):
    """Rollout replicas of 2 devices (TP), reward of 1, on one host of 4."""
    scheds = {r: ShiftAwareScheduler(r, TM) for r in INFERENCE_ROLES}
    scheds[Role.ROLLOUT].add_replicas([ReplicaView(f"rollout{b[0]}", Role.ROLLOUT, b, 1000)
                                       for b in rollout_blocks])
    scheds[Role.REWARD].add_replicas([ReplicaView(f"reward{d}", Role.REWARD, (d,), 1000)
                                      for d in reward])
    shapes = {Role.ROLLOUT: RoleShape(2, 1000, 2, 0.5), Role.REWARD: RoleShape(1, 1000, 4, 0.5)}
    return snapshot(0.0, scheds, shapes, TrainingLoad(1, tuple(training), busy=True),
                    (0, 0, 0, 0), idle)


def test_with_tp_replicas_a_block_of_donors_shifts_down_together():
    # reward on 0, 1, 2 and training on 3: one reward replica frees no block of 2, two do
    p = forced_shift_planner(TM, TM, seed=0, aligned_blocks=True)
    plan = p.plan(_tp_snap((), (0, 1, 2), training=(3,)))
    assert plan is not None and plan.up_role is Role.ROLLOUT
    assert plan.up_devices == ((0, 1),)
    assert sorted(d.replica_id for d in plan.down) == ["reward0", "reward1"]
    # the TP replica is rollout's last (min_replicas = 1): nothing can shift into reward
    assert p.plan(_tp_snap(((0, 1),), (2,), training=(3,))) is None
    # with a second one, rollout gives a whole block back
    plan = p.plan(_tp_snap(((0, 1), (2, 3)), ()))
    assert plan.up_role is Role.REWARD and len(plan.down) == 1
    assert plan.up_devices in (((0,), (1,)), ((0,),), ((2,), (3,)), ((2,),))
