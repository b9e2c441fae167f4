"""calibrate.py computes its numbers: on a small config the fitted MFUs reproduce verl's
update / old-log-prob seconds, the errors are (sim - verl) / verl of what it simulated,
and the shift fit is the least-squares line through the paper's points."""

import numpy as np
import pytest

from launchers import calibrate as C
from pivot.sim import calibrate as cal
from pivot.sim.profile import ModelProfile, ShiftCost, TrainingProfile
from pivot.scheduler.throughput import ThroughputModel

SMALL = ["ModelGroup.prompts_per_step = 16", "ModelGroup.n = 4"]


def test_fit_mfu_inverts_the_training_model():
    m = ModelProfile("p", 7.6, 7.6, 57344, 1, throughput=ThroughputModel(0, 0, 0, 1e-3))
    upd = cal.fit_mfu(113.81, 6.0, 7.6, 2e6, 128)
    lp = cal.fit_mfu(53.92, 2.0, 7.6, 2e6, 128)
    ph = TrainingProfile(128, update_mfu=upd, logprob_mfu=lp).phase_seconds(m, 2e6, 128)
    assert ph["update_actor"] == pytest.approx(113.81)
    assert ph["old_log_prob"] == pytest.approx(53.92)


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
    # the fitted phases reproduce verl's seconds for the simulated batch
    assert colo["sim"]["update_actor"] == pytest.approx(113.81, rel=1e-6)
    for c in rep["checks"]:
        for k, e in c["rel_err"].items():
            assert e == pytest.approx((c["sim"][k] - c["verl"][k]) / c["verl"][k])
        assert np.isfinite(c["sim"]["step_s"]) and c["sim"]["step_s"] > 0
    assert 0 < f["update_mfu"] <= 1 and f["response_median"] > 0
