import pytest

from pivot.planner.evaluate import (IncrementalShiftDown, IncrementalShiftUp,
                                    overall_throughput, simulate_shift_down,
                                    simulate_shift_up)
from pivot.planner.monitor import RoleShape, snapshot
from pivot.scheduler import ShiftAwareScheduler
from pivot.testing.planner import MODEL, make_snapshot
from pivot.types import ReplicaView, Role, SequenceState, TrainingLoad


def test_overall_throughput_is_the_weighted_harmonic_mean_of_equation_1():
    assert overall_throughput(10, 100.0, 30, 300.0) == pytest.approx(40 / (10 / 100 + 30 / 300))
    assert overall_throughput(0, 0.0, 30, 300.0) == pytest.approx(300.0)
    assert overall_throughput(10, 0.0, 30, 300.0) == 0.0  # waiting work, no capacity
    assert overall_throughput(0, 0.0, 0, 0.0) == 0.0


def test_incremental_shift_down_stays_within_one_percent_of_a_fresh_simulation():
    # Evacuating nested donor sets one after another places sequences in a different
    # order than evacuating the union at once; the planner accepts that small error.
    snap = make_snapshot(ro_busy=8)
    load = snap.rollout
    inc = IncrementalShiftDown(load, MODEL)
    ids = [r.replica_id for r in load.replicas]
    assert inc.throughput_without(ids[:1]) == pytest.approx(
        simulate_shift_down(load, MODEL, ids[:1]))
    for k in range(2, 6):
        assert inc.throughput_without(ids[:k]) == pytest.approx(
            simulate_shift_down(load, MODEL, ids[:k]), rel=0.01)
    # A non-nested donor set restarts from the snapshot.
    assert inc.throughput_without(ids[5:6]) == pytest.approx(
        simulate_shift_down(load, MODEL, ids[5:6]))


def test_incremental_shift_up_matches_a_fresh_simulation_for_one_replica_and_grows():
    snap = make_snapshot(waiting=0)
    load = snap.reward
    groups = [tuple(range(100 + 4 * i, 104 + 4 * i)) for i in range(4)]
    inc = IncrementalShiftUp(load, MODEL)
    first = inc.throughput_with(groups[:1])
    assert first == pytest.approx(simulate_shift_up(load, MODEL, groups[:1]))
    before = sum(MODEL.throughput(r.num_seqs, r.num_tokens) for r in load.replicas)
    values = [first] + [inc.throughput_with(groups[:k]) for k in range(2, 5)]
    assert values[0] >= before
    assert values == sorted(values)  # more replicas never model less throughput
    for k, v in enumerate(values, start=1):
        assert v == pytest.approx(simulate_shift_up(load, MODEL, groups[:k]), rel=0.01)


def test_monitor_snapshot_copies_the_schedulers_state():
    scheds = {}
    for role, dev in ((Role.ROLLOUT, 0), (Role.REWARD, 1)):
        s = ShiftAwareScheduler(role, MODEL)
        s.add_replicas([ReplicaView(f"{role.value}0", role, (dev,), 10_000)])
        scheds[role] = s
    scheds[Role.ROLLOUT].submit(SequenceState(0, "policy", 100, 10))
    scheds[Role.ROLLOUT].submit(SequenceState(1, "policy", 20_000, 10))
    scheds[Role.ROLLOUT].dispatch()
    shapes = {r: RoleShape(1, 10_000, 4, 1.0) for r in scheds}
    snap = snapshot(3.0, scheds, shapes, TrainingLoad(2, (), busy=False), (0, 0, 0, 0),
                    idle_devices=(2, 3))
    snap.check()
    assert snap.rollout.waiting == [(1, 20_000)]
    assert snap.rollout.num_seqs == 2
    snap.rollout.replicas[0].running.clear()
    assert scheds[Role.ROLLOUT].replicas["rollout0"].running  # a copy, not the live view
