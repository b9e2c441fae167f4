"""calibrate.py computes its numbers: the two-parameter training fit recovers a known
model and is least squares on verl's rows, the errors are (sim - verl) / verl of what it simulated,
and the shift fit is the least-squares line through the paper's points."""

import numpy as np
import pytest

from benchmarks import calibrate as C
from pivot.sim import verl_fit as cal
from pivot.spec.profile import ModelProfile, ShiftCost, TrainingProfile
from pivot.scheduler.throughput import ThroughputModel

SMALL = ["ModelGroup.prompts_per_step = 16", "ModelGroup.n = 4"]


def test_fits_recover_a_known_training_model():
    m = ModelProfile("p", 7.6, 7.6, 57344, 1, throughput=ThroughputModel(0, 0, 0, 1e-3))
    true = TrainingProfile(8, update_mfu=0.6, logprob_mfu=0.3, update_serial=0.02,
                           logprob_serial=0.01, old_logprob=True)   # explicit: gin may bind it
    tokens = 2e6
    ph = {d: true.phase_seconds(m, tokens, d) for d in (16, 32, 128)}
    upd = cal.fit_floor([(d, p["update_actor"]) for d, p in ph.items()], 6 * 7.6e9 * tokens)
    lp = cal.fit_amdahl([(d, p["old_log_prob"]) for d, p in ph.items()], 2 * 7.6e9 * tokens)
    assert upd == pytest.approx((0.6, 0.02)) and lp == pytest.approx((0.3, 0.01))
    # the update is its parallel work or the floor, whichever is longer
    assert ph[16]["update_actor"] == pytest.approx(2 * ph[32]["update_actor"])
    assert ph[128]["update_actor"] == pytest.approx(6 * 7.6e9 * tokens / (148e12 * 0.6) * 0.02)


def test_each_trainer_fits_its_own_verl_rows():
    m = ModelProfile("p", 7.6, 7.6, 57344, 1, throughput=ThroughputModel(0, 0, 0, 1e-3))
    tokens = 9e6
    for rows in (C.COLOCATED, C.ASYNC):
        pts = cal.training_points(rows)
        assert len(pts["update"]) == 3
        mfu, floor = cal.fit_floor(pts["update"], 6 * 7.6e9 * tokens)
        prof = TrainingProfile(8, update_mfu=mfu, update_serial=floor, old_logprob=False,
                               logprob_mfu=1.0, logprob_serial=0.0)   # no log-prob phase
        for d, t in pts["update"]:   # max(floor, work / devices): within 1% on every row
            assert prof.phase_seconds(m, tokens, d)["update_actor"] == pytest.approx(t, rel=0.01)
    pts = cal.training_points(C.COLOCATED)["logprob"]
    mfu, serial = cal.fit_amdahl(pts, 2 * 7.6e9 * tokens)
    prof = TrainingProfile(8, logprob_mfu=mfu, logprob_serial=serial, old_logprob=True,
                           update_mfu=1.0, update_serial=0.0)   # only the log-prob is read
    resid = np.array([prof.phase_seconds(m, tokens, d)["old_log_prob"] - t for d, t in pts])
    inv_d = np.array([1.0 / d for d, _ in pts])
    # normal equations of seconds = F + b / devices: residuals orthogonal to 1 and 1/d
    assert abs(resid.sum()) < 1e-6 and abs(resid @ inv_d) < 1e-8
    with pytest.raises(Exception):
        cal.fit_amdahl([(64, 100.0), (64, 120.0)], 1e18)
    with pytest.raises(Exception):          # no trainer does 1e20 FLOPs in those seconds
        cal.fit_floor(cal.training_points(C.ASYNC)["update"], 1e20)


def test_batch_tokens_are_the_simulated_batches():
    b = SMALL + ["LengthModel.response_median = 500"]
    d, r = C.simulate(cal.VERL_COLOCATED, b, steps=2)
    assert C.batch_tokens(cal.VERL_COLOCATED, b, C.GIN, 2) == pytest.approx(
        np.mean(list(d.workflow.step_tokens.values())))


def test_shift_fit_is_least_squares_on_the_paper_points():
    # the fit replaces the four fitted fields; the rest is ShiftCost's defaults
    fit = cal.fit_shift_cost(ShiftCost(inference_read_gbs=1.0, inference_up_s=0.0,
                                       training_read_gbs=1.0, training_up_s=0.0))
    rows = cal.shift_comparison(fit)
    inf = [r for r in rows if r["role"] == "inference"]
    resid = [r["sim_up_s"] - r["paper_up_s"] for r in inf]
    assert abs(sum(resid)) < 1e-6          # a least-squares line's residuals sum to 0
    assert fit.inference_up_s > 0 and 1 < fit.inference_read_gbs < 63


def test_calibrate_small_config_numbers_are_computed():
    rep = C.calibrate(SMALL, iters=3, steps=2)
    f = rep["fits"]
    assert set(f["response_median"]) == {"colocated", "disaggregated"}
    assert all(m > 0 for m in f["response_median"].values())
    for c in rep["checks"]:
        for k, e in c["rel_err"].items():
            assert e == pytest.approx((c["sim"][k] - c["verl"][k]) / c["verl"][k])
        assert np.isfinite(c["sim"]["step_s"]) and c["sim"]["step_s"] > 0
        assert set(c["fitted"]) <= set(c["rel_err"])
    for mode, t in f["training"].items():
        assert 0 < t["update_mfu"] <= 1 and 0 <= t["update_serial"] < 1
    assert "logprob_mfu" in f["training"]["colocated"]
    assert rep["decode_model"]["holdout"]["infersim_h20"]
