import json

import numpy as np
import pytest

from pivot.errors import ConfigError, StateError
from pivot.scheduler.throughput import (BinaryThroughputModel, LatencySample, ThroughputModel,
                                        fit_throughput_model, samples_from_arrays)

MODEL = ThroughputModel(A=2e-6, B=0.02, C=4e-4, D=0.005)


def grid_samples(model, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for n in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        for per_seq in (100, 1000, 8000):
            tok = n * per_seq
            lat = model.step_latency(n, tok) * (1 + noise * rng.standard_normal())
            out.append(LatencySample(n, tok, lat))
    return out


def test_throughput_follows_the_formula_of_section_6_1():
    n, tok = 10, 5000
    expected = n / (2e-6 * tok + max(0.02, 4e-4 * n) + 0.005)
    assert MODEL.throughput(n, tok) == pytest.approx(expected)
    assert MODEL.throughput(0, 0) == 0.0


def test_gain_is_throughput_after_minus_before():
    assert MODEL.gain(3, 900, 300) == pytest.approx(
        MODEL.throughput(4, 1200) - MODEL.throughput(3, 900))
    vec = MODEL.gains(np.array([0.0, 3.0]), np.array([0.0, 900.0]), 300)
    assert vec[0] == pytest.approx(MODEL.gain(0, 0, 300))
    assert vec[1] == pytest.approx(MODEL.gain(3, 900, 300))


def test_fit_recovers_the_constants_from_exact_samples():
    model, report = fit_throughput_model(grid_samples(MODEL))
    for name in "ABCD":
        assert getattr(model, name) == pytest.approx(getattr(MODEL, name), rel=1e-3)
    assert report.mean_rel_error < 1e-6
    assert report.breakpoint_seqs == pytest.approx(50, rel=1e-2)


def test_fit_reports_its_error_on_noisy_samples():
    model, report = fit_throughput_model(grid_samples(MODEL, noise=0.02))
    assert 0 < report.mean_rel_error < 0.05
    assert report.r2 > 0.99
    assert report.num_samples == 27
    assert model.A == pytest.approx(MODEL.A, rel=0.1)


def test_fit_refuses_too_few_or_nonpositive_samples():
    with pytest.raises(StateError, match="at least 4"):
        fit_throughput_model(grid_samples(MODEL)[:3])
    with pytest.raises(StateError, match="latency > 0"):
        fit_throughput_model(samples_from_arrays([1, 2, 3, 4], [1, 2, 3, 4], [0.1, 0.1, 0, 1]))


def test_negative_constants_are_rejected_with_their_name():
    with pytest.raises(StateError, match="C=-1"):
        ThroughputModel(A=0, B=1, C=-1, D=0)


def test_profile_round_trips_and_malformed_profile_names_the_file(tmp_path):
    path = tmp_path / "profile.json"
    MODEL.save(path, fit={"rmse": 0.1})
    assert ThroughputModel.load(path) == MODEL
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model": {"A": 1}}))
    with pytest.raises(ConfigError, match="bad.json"):
        ThroughputModel.load(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        ThroughputModel.load(tmp_path / "missing.json")


def test_binary_model_prefers_an_empty_replica_then_the_least_loaded():
    m = BinaryThroughputModel()
    assert m.throughput(0, 0) == 0 and m.throughput(5, 100) == 1
    g = m.gains(np.array([2.0, 0.0, 1.0]), np.array([500.0, 0.0, 100.0]), 10)
    assert int(np.argmax(g)) == 1
    g = m.gains(np.array([2.0, 1.0]), np.array([500.0, 100.0]), 10)
    assert int(np.argmax(g)) == 1
