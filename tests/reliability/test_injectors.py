"""The forced-shift planner on a few devices (the local driver's slots): with
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
