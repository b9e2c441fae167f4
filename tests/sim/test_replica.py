"""A hand-checkable replica: fixed lengths against the closed-form time (app. A)."""

import pytest

from pivot.scheduler.throughput import ThroughputModel
from pivot.sim.replica import SimReplica
from pivot.types import Role


def test_two_sequences_finish_at_the_arithmetic_series_time():
    m = ThroughputModel(A=1e-6, B=0.01, C=0.001, D=0.002)
    r = SimReplica("r", Role.ROLLOUT, (0,), m, kv_capacity=10**6, prefill_rate=1e9)
    r.admit(1, 100, 110, 0.0)   # 10 tokens to go
    r.admit(2, 100, 120, 0.0)   # 20 tokens to go
    t0 = 200 / 1e9              # prefill of both prompts
    # first 10 steps: N=2, N_tok = 200 + 2j
    first = sum(1e-6 * (200 + 2 * j) + max(0.01, 0.002) + 0.002 for j in range(10))
    assert r.next_event_time() == pytest.approx(t0 + first)
    done, overflow = r.advance(r.next_event_time())
    assert done == [1] and not overflow
    r.remove(1, r.time)
    second = sum(1e-6 * (110 + j) + 0.01 + 0.002 for j in range(10))
    done, _ = r.advance(r.next_event_time())
    assert done == [2]
    assert r.time == pytest.approx(t0 + first + second)
    assert r.generated == 30


def test_kv_overflow_is_reported_before_capacity_is_exceeded():
    m = ThroughputModel(A=0.0, B=0.01, C=0.0, D=0.0)
    r = SimReplica("r", Role.ROLLOUT, (0,), m, kv_capacity=250, prefill_rate=1e9)
    r.admit(1, 100, 500, 0.0)
    r.admit(2, 100, 500, 0.0)
    done, overflow = r.advance(1e9)
    assert overflow and not done and r.num_tokens <= 250
    assert r.newest() == 2


def test_partial_advance_keeps_whole_steps():
    m = ThroughputModel(A=0.0, B=0.01, C=0.0, D=0.0)
    r = SimReplica("r", Role.ROLLOUT, (0,), m, kv_capacity=10**6, prefill_rate=1e12)
    r.admit(1, 10, 1000, 0.0)
    r.advance(0.055)
    assert r.length(1) == 15
