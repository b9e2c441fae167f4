"""calibrate.py computes its numbers: the two-parameter training fit recovers a known
model and is least squares on verl's rows, the errors are (sim - verl) / verl of what it simulated,
and the shift fit is the least-squares line through the paper's points."""

import numpy as np
import pytest

from launchers import calibrate as C
from pivot.sim import calibrate as cal
from pivot.sim.profile import ModelProfile, ShiftCost, TrainingProfile
from pivot.scheduler.throughput import ThroughputModel

SMALL = ["ModelGroup.prompts_per_step = 16", "ModelGroup.n = 4"]


def test_fit_amdahl_recovers_a_known_model():
    m = ModelProfile("p", 7.6, 7.6, 57344, 1, throughput=ThroughputModel(0, 0, 0, 1e-3))
    true = TrainingProfile(8, update_mfu=0.6, logprob_mfu=0.3, update_serial=0.02,
                           logprob_serial=0.01)
    tokens = 2e6
    ph = {d: true.phase_seconds(m, tokens, d) for d in (16, 32, 128)}
    upd = cal.fit_amdahl([(d, p["update_actor"]) for d, p in ph.items()], 6 * 7.6e9 * tokens)
    lp = cal.fit_amdahl([(d, p["old_log_prob"]) for d, p in ph.items()], 2 * 7.6e9 * tokens)
    assert upd == pytest.approx((0.6, 0.02)) and lp == pytest.approx((0.3, 0.01))


def test_fit_amdahl_is_least_squares_on_every_verl_row():
    pts = cal.training_points()
    assert len(pts["update"]) == len(cal.VERL_ROWS) == 6 and len(pts["logprob"]) == 3
    m = ModelProfile("p", 7.6, 7.6, 57344, 1, throughput=ThroughputModel(0, 0, 0, 1e-3))
    tokens = 9e6
    mfu, serial = cal.fit_amdahl(pts["update"], 6 * 7.6e9 * tokens)
    prof = TrainingProfile(8, update_mfu=mfu, update_serial=serial, old_logprob=False)
    resid = np.array([prof.phase_seconds(m, tokens, d)["update_actor"] - t
                      for d, t in pts["update"]])
    inv_d = np.array([1.0 / d for d, _ in pts["update"]])
    # normal equations of seconds = F + b / devices: residuals orthogonal to 1 and 1/d
    assert abs(resid.sum()) < 1e-6 and abs(resid @ inv_d) < 1e-8
    assert 0 < serial < 1  # verl's update does not scale as 1 / devices
    with pytest.raises(Exception):
        cal.fit_amdahl([(64, 100.0), (64, 120.0)], 1e18)


def test_shift_fit_is_least_squares_on_the_paper_points():
    fit = cal.fit_shift_cost(ShiftCost())
    rows = cal.shift_comparison(fit)
    inf = [r for r in rows if r["role"] == "inference"]
    resid = [r["sim_up_s"] - r["paper_up_s"] for r in inf]
    assert abs(sum(resid)) < 1e-6          # a least-squares line's residuals sum to 0
    assert fit.inference_up_s > 0 and 1 < fit.inference_read_gbs < 63


def test_calibrate_small_config_numbers_are_computed():
    rep = C.calibrate(SMALL, iters=3, steps=2)
    f = rep["fits"]
    colo = next(c for c in rep["checks"] if c["fitted_row"])
    # the fitted phases are the least-squares line through verl's rows (same batch tokens
    # in every run: residuals of the update over the six rows sum to ~0)
    resid = [c["sim"]["update_actor"] - c["verl"]["update_actor"] for c in rep["checks"]]
    assert abs(sum(resid)) < 1e-3 * sum(c["verl"]["update_actor"] for c in rep["checks"])
    assert colo["sim"]["update_actor"] != pytest.approx(113.81, rel=1e-3)
    for c in rep["checks"]:
        for k, e in c["rel_err"].items():
            assert e == pytest.approx((c["sim"][k] - c["verl"][k]) / c["verl"][k])
        assert np.isfinite(c["sim"]["step_s"]) and c["sim"]["step_s"] > 0
    assert 0 < f["update_mfu"] <= 1 and 0 < f["update_serial"] < 1
    assert f["response_median"] > 0
