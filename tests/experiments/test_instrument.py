"""instrument.summarise weights allocation by time between samples, clipped to the measured
window (end of training step 0 to the end of the last step), and counts a role as starved
while it has sequences but no devices."""

import pytest

from experiments.instrument import summarise, thin


def _sample(t, ro, rm, tr, n_ro, n_rm):
    return {"time": t, "alloc": {"rollout": ro, "reward": rm, "training": tr},
            "n_rollout": n_ro, "n_reward": n_rm}


def test_summary_is_time_weighted_and_counts_starvation():
    res = {"devices": 8, "steps": 3, "throughput": 1.0, "step_time": 50.0, "split": (4, 4),
           "train_steps": [[0, 0.0, 10.0], [1, 40.0, 60.0], [2, 90.0, 110.0]],
           "shift_log": [{"reason": "rule: x", "up_role": "idle"}], "shifts_per_step": 1 / 3,
           "shift_phases": {},
           "trace": [_sample(0.0, 8, 0, 0, 5, 0),       # before the window: ignored
                     _sample(10.0, 4, 0, 4, 5, 3),      # 10-60: reward starved 50 s
                     _sample(60.0, 2, 2, 0, 0, 3),      # 60-110: 4 idle devices
                     _sample(110.0, 2, 2, 0, 0, 0)]}
    s = summarise(res)
    assert s["mean_devices"]["rollout"] == pytest.approx((4 * 50 + 2 * 50) / 100)
    assert s["mean_devices"]["training"] == pytest.approx(2.0)
    assert s["mean_idle_devices"] == pytest.approx(2.0)
    assert s["starved_s_per_step"] == {"reward": pytest.approx(25.0)}
    assert s["train_busy_fraction"] == pytest.approx(40 / 100)
    assert s["shift_kinds"] == {"rule:idle": 1}
    assert len(thin(res["trace"], keep=2)) == 2
