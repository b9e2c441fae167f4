"""The fluid bound on the local step period (analysis/local_bound.py), by hand-worked cases."""

import pytest

from analysis.local_bound import measure, step_bound
from pivot.cluster.results import row_name, row_training_slots, summary_devices


def test_training_sets_the_bound_when_inference_is_light():
    b = step_bound(4, inference_slot_s=2.0, train_s={1: 4.0, 2: 2.5})
    # k=1: max(4, 6/4) = 4; k=2: max(2.5, 7/4) = 2.5; a mix only adds training time
    assert b.per_k == {1: 4.0, 2: 2.5}
    assert b.period_s == 2.5 and b.mix == {2: 1.0} and b.limit == "training"


def test_slot_time_sets_the_bound_when_inference_is_heavy():
    b = step_bound(4, inference_slot_s=12.0, train_s={1: 4.0, 2: 2.5})
    # k=1: max(4, 16/4) = 4; k=2: max(2.5, 17/4) = 4.25
    assert b.per_k == {1: 4.0, 2: 4.25}
    assert b.period_s == 4.0 and b.mix == {1: 1.0}


def test_a_mix_of_two_slot_counts_beats_either_alone():
    # k=1: max(4, 9.5/4) = 4; k=2: max(2.5, 10.5/4 = 2.625) = 2.625. On a share x of steps
    # with 1 slot: training 2.5 + 1.5x, slot-time 2.625 - 0.25x; they cross at x = 1/14
    b = step_bound(4, inference_slot_s=5.5, train_s={1: 4.0, 2: 2.5})
    assert b.per_k[2] == pytest.approx(2.625)
    assert b.mix[1] == pytest.approx(1 / 14) and b.mix[2] == pytest.approx(13 / 14)
    assert b.period_s == pytest.approx(2.5 + 1.5 / 14)
    assert b.period_s < min(b.per_k.values())
    assert b.limit == "both"


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        step_bound(4, 1.0, {})


@pytest.mark.parametrize("name, k", [("colocated", 4), ("disaggregated_1_2_1", 1),
                                     ("disaggregated_1_1_2", 2), ("rr_colocated_2", 2),
                                     ("pivotrl", 1), ("pivotrl_rule_train2_min0", 2),
                                     ("disaggregated_1_2", 1), ("static", 1)])
def test_legacy_rows_give_their_training_slots_by_their_names(name, k):
    assert row_training_slots({"deployment": name}, 4, 1) == k


def test_rows_that_record_their_training_slots_are_read_as_recorded():
    row = {"deployment": "pivotrl_train2", "name": "pivotrl_train2", "training_slots": 2}
    assert row_training_slots(row, 4, 1) == 2 and row_name(row) == "pivotrl_train2"
    assert row_name({"deployment": "rr_colocated_2"}) == "rr_colocated"
    assert summary_devices({"devices": 6}) == 6
    assert summary_devices({"gin_params": ["ClusterGroup.devices = 8"]}) == 8
    assert summary_devices({}) == 4


def test_measure_takes_the_best_efficiency_and_ranks_against_the_best_static_split():
    def run(dep, tok_s, period, train):
        return {"deployment": dep, "throughput": tok_s, "trainer_step_s": [9.0, train, train],
                "time_s": [10.0, 10.0 + period, 10.0 + 2 * period]}
    summary = {"runs": [run("disaggregated_1_2_1", 1000.0, 4.0, 4.0),
                        run("disaggregated_1_1_2", 900.0, 4.0, 2.0),
                        run("pivotrl", 950.0, 4.0, 4.0)]}
    util = {"mean_over_seeds": {"disaggregated_1_2_1": {"infer": 0.5},
                                "disaggregated_1_1_2": {"infer": 0.3},
                                "pivotrl": {"infer": 0.5}}}
    out = measure(summary, util)
    # the same runs as a summary that records names and slots reads the same
    named = {"devices": 4, "runs": [dict(r, name=r["deployment"].rstrip("_0123456789"),
                                         training_slots=int(r["deployment"][-1])
                                         if r["deployment"][-1].isdigit() else 1)
                                    for r in summary["runs"]]}
    assert measure(named, util) == out
    # 3,800 tokens a step (mean); the best efficiency is 1_1_2's 900 / 1.2 = 750 tok per
    # busy slot-s, so W = 5.07 slot-s; k=2: max(2, (5.07 + 4) / 4 = 2.27)
    assert out["efficiency_from"] == "disaggregated_1_1_2"
    assert out["inference_slot_s"] == pytest.approx(3800 / 750)
    assert out["train_step_s"] == {1: 4.0, 2: 2.0}
    assert out["best_static"] == "disaggregated_1_2_1"
    assert out["bound_over_best_static"] == pytest.approx(
        3800 / out["bound"]["period_s"] / 1000.0)
    assert out["bound"]["period_s"] <= (3800 / 750 + 4) / 4
