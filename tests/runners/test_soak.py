"""A short soak: forced shifts and replica kills lose no sequence and break no invariant."""

from __future__ import annotations

from pivot.runners.soak import SoakConfig, run_soak


def test_a_short_soak_with_kills_loses_nothing():
    rep = run_soak(SoakConfig(devices=256, target_shifts=150, kill_rate=0.3, seed=3))
    assert rep.violations == []
    assert rep.shift_plans >= 150
    assert rep.faults_injected > 0 and rep.devices_recovered > 0
    assert rep.sequences_lost == 0
    assert rep.sequences_finished == rep.sequences_released > 0
    assert rep.invariant_checks >= rep.events


def test_the_journal_misses_nothing_when_every_event_is_also_fully_checked():
    # the full check compares the incremental indexes with a rebuild at every event: any
    # change the simulated control plane makes without journaling it would be reported
    rep = run_soak(SoakConfig(devices=128, target_shifts=80, kill_rate=0.3, seed=5,
                              full_check_every=1))
    assert rep.violations == [] and rep.sequences_lost == 0
    assert rep.full_checks >= rep.events and rep.faults_injected > 0


def _started(devices: int = 64):
    from pivot.reliability.incremental import IncrementalChecker
    from pivot.reliability.sim_state import SimSource
    from pivot.runners.soak import build_driver
    from pivot.types import INFERENCE_ROLES, Role
    driver = build_driver(SoakConfig(devices=devices))
    for seq in driver.workflow.release():
        driver.schedulers[Role.ROLLOUT].submit(seq)
    driver._provision()
    driver.cluster._dirty.update(INFERENCE_ROLES)
    driver.cluster.dispatch_dirty()
    checker = IncrementalChecker(SimSource(driver))
    assert checker.full() == []
    return driver, checker


def test_an_engine_that_vanishes_unjournaled_is_caught_by_the_incremental_counters():
    driver, checker = _started()
    driver.cluster.replicas.pop(next(iter(driver.cluster.replicas)))
    assert any("engines" in x for x in checker.check())


def test_a_sequence_dropped_unjournaled_is_caught_by_the_incremental_counters():
    from pivot.types import Role
    driver, checker = _started()
    sched = driver.schedulers[Role.ROLLOUT]
    rid = next(r for r, v in sched.replicas.items() if v.running)
    v = sched.replicas[rid]
    sid = next(iter(v.running))
    v.num_tokens -= v.running.pop(sid)
    del sched.seqs[sid]
    assert any("expected" in x for x in checker.check())


def test_journaled_sim_calls_reach_the_incremental_checker():
    from pivot.types import Role
    driver, checker = _started()
    sched = driver.schedulers[Role.ROLLOUT]
    rid = next(r for r, v in sched.replicas.items() if v.running)
    sid = next(iter(sched.replicas[rid].running))
    driver.cluster.apply(sched.abort(rid, sid))  # a real abort, through the wrapped calls
    assert sid in checker.src.touched.seqs and rid in checker.src.touched.replicas
    assert checker.check() == []
    seq = sched.seqs[sid]
    seq.generated_len = 5
    checker.src.touched.seqs.add(sid)
    assert checker.check() == []
    seq.generated_len = 2  # the waiting sequence lost progress it had
    checker.src.touched.seqs.add(sid)
    assert any(x.startswith("I5") and "fewer" in x for x in checker.check())
