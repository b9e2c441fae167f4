"""The invariant checker catches each kind of violation and passes a healthy state."""

from __future__ import annotations

import pytest

from pivot.reliability.invariants import (ControlState, EngineReplica, InvariantError,
                                          PrefixLedger, check_state, raise_if)
from pivot.scheduler.scheduler import ShiftAwareScheduler
from pivot.scheduler.throughput import ThroughputModel
from pivot.shifting.device_map import DeviceMap
from pivot.types import POLICY, ReplicaView, Role, SequenceState

MODEL = ThroughputModel(A=1e-6, B=0.01, C=1e-4, D=0.001)


def _state(**kw):
    dm = DeviceMap((0, 0, 0, 0), clock=lambda: 0.0)
    ro = ShiftAwareScheduler(Role.ROLLOUT, MODEL)
    rm = ShiftAwareScheduler(Role.REWARD, MODEL)
    dm.begin_shift_up((0,), Role.ROLLOUT, "ro-0")
    dm.end_shift_up((0,))
    ro.add_replicas([ReplicaView("ro-0", Role.ROLLOUT, (0,), 1000)])
    for i in range(3):
        ro.submit(SequenceState(i, POLICY, 10, 100))
    ro.dispatch()
    base = dict(schedulers={Role.ROLLOUT: ro, Role.REWARD: rm}, device_map=dm, version=0,
                released=1, staleness=2, expected_live={Role.ROLLOUT: {0, 1, 2}})
    base.update(kw)
    return base, ro, dm


def test_a_healthy_state_has_no_violations():
    s, _, _ = _state()
    assert check_state(ControlState(**s)) == []


def test_a_lost_sequence_is_reported():
    s, _, _ = _state(expected_live={Role.ROLLOUT: {0, 1, 2, 3}})
    v = check_state(ControlState(**s))
    assert any("lost" in x and "[3]" in x for x in v)


def test_staleness_beyond_the_bound_is_reported():
    s, _, _ = _state(version=0, released=4)
    assert any(x.startswith("I2") for x in check_state(ControlState(**s)))


def test_a_device_active_in_the_map_but_held_by_nobody_is_reported():
    s, _, dm = _state()
    dm.begin_shift_up((1,), Role.REWARD, "rm-0")
    dm.end_shift_up((1,))
    assert any("no replica" in x for x in check_state(ControlState(**s)))


def test_a_lost_device_still_held_by_a_replica_is_reported():
    s, _, dm = _state()
    dm.mark_lost((0,), "test")
    v = check_state(ControlState(**s))
    assert any("I3" in x and "lost" in x for x in v)


def test_an_engine_over_its_kv_capacity_is_reported():
    s, ro, _ = _state()
    eng = {"ro-0": EngineReplica(Role.ROLLOUT, (0,), 20, dict(ro.replicas["ro-0"].running))}
    v = check_state(ControlState(**s, engines=eng))
    assert any(x.startswith("I4") for x in v)


def test_a_shrunken_resumed_sequence_breaks_the_prefix_invariant():
    led = PrefixLedger()
    seq = SequenceState(7, POLICY, 10, 100, generated_len=5, generated_tokens=[1, 2, 3, 4, 5])
    assert led.observe({7: seq}) == []
    seq.generated_tokens = [1, 2, 9, 4, 5, 6]
    seq.generated_len = 6
    assert any("token ids" in x for x in led.observe({7: seq}))
    seq.generated_len = 2
    assert any("fewer" in x for x in led.observe({7: seq}))


def test_raise_if_raises_with_every_violation():
    with pytest.raises(InvariantError) as e:
        raise_if(["a", "b"])
    assert e.value.violations == ["a", "b"]
