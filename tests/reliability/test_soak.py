"""A short soak: forced shifts and replica kills lose no sequence and break no invariant."""

from __future__ import annotations

from pivot.reliability.soak import SoakConfig, run_soak


def test_a_short_soak_with_kills_loses_nothing():
    rep = run_soak(SoakConfig(devices=256, target_shifts=150, kill_rate=0.3, seed=3))
    assert rep.violations == []
    assert rep.shift_plans >= 150
    assert rep.faults_injected > 0 and rep.devices_recovered > 0
    assert rep.sequences_lost == 0
    assert rep.sequences_finished == rep.sequences_released > 0
    assert rep.invariant_checks >= rep.events
