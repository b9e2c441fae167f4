"""What the local measurements run (gin files, splits as bindings) and their summaries
(no engine)."""

import pytest

from experiments.local import (GROUP, THROUGHPUT, build_driver, parse_split, run_bindings,
                               throughput_table, variants)
from pivot.errors import ConfigError

COMMON = ["PromptStream.prompts_per_step = 32"]


def test_throughput_runs_every_static_split_with_each_role_on_a_slot():
    got = variants(THROUGHPUT, ["all"], GROUP, COMMON, 4)
    assert [v.label for v in got] == [
        "colocated", "disaggregated_1_2_1", "disaggregated_2_1_1", "disaggregated_1_1_2",
        "rr_colocated_1", "rr_colocated_2", "pivotrl"]
    by = {v.label: v for v in got}
    assert by["disaggregated_1_1_2"].bindings == (
        "Deployment.rollout_devices = 1", "Deployment.reward_devices = 1",
        "Deployment.training_devices = 2")
    assert by["rr_colocated_2"].bindings == ("Deployment.training_devices = 2",)
    assert by["pivotrl"].bindings == () and by["pivotrl"].file == "gin/deployments/pivotrl.gin"
    d = build_driver([*GROUP, by["disaggregated_1_1_2"].file],
                     run_bindings(by["disaggregated_1_1_2"], COMMON, 1, 20, -1), None, None)
    assert (d.dep.name, d.split, d.train_needed) == ("disaggregated", (1, 1), 2)
    assert (d.steps, d.seed, d.stream.seed, d.eval_every, d.stream.prompts_per_step) == (
        20, 1, 1, -1, 32)


def test_named_splits_go_to_the_deployments_that_take_one():
    got = variants(["disaggregated", "rr_colocated", "static", "colocated", "pivotrl_train2"],
                   ["1/1/2", "2/1/1"], GROUP, COMMON, 4)
    assert [v.label for v in got] == [
        "disaggregated_1_1_2", "disaggregated_2_1_1", "rr_colocated_2", "rr_colocated_1",
        "static_1_1_2", "static_2_1_1", "colocated", "pivotrl_train2"]
    # without --splits each file runs with its own split (the group's DISAGG_*)
    assert [v.label for v in variants(["disaggregated"], None, GROUP, COMMON, 4)] == [
        "disaggregated"]


def test_sensitivity_runs_pivotrl_per_time_window():
    got = variants(["pivotrl"], None, GROUP, COMMON, 4, H=[1.0, 10.0])
    assert [(v.label, v.bindings) for v in got] == [
        ("pivotrl_H1", ("PivotPlanner.H = 1.0",)), ("pivotrl_H10", ("PivotPlanner.H = 10.0",))]
    d = build_driver([*GROUP, got[1].file], list(got[1].bindings), None, None)
    assert d.planner.H == 10.0 and d.planner.min_replicas == 1   # gin/tiny_cpu.gin's


@pytest.mark.parametrize("deps, splits, match", [
    (["nope"], None, "nope"), (["pivotrl"], ["1/1"], "1/1"),
    (["disaggregated"], ["0/2/2"], "0/2/2"),
    (["pivotrl", "gin/deployments/pivotrl.gin"], None, "share a label")])
def test_a_bad_file_or_split_is_a_config_error_naming_it(deps, splits, match):
    with pytest.raises(ConfigError, match=match):
        variants(deps, splits, GROUP, COMMON, 4)


def test_a_split_that_does_not_fit_fails_when_its_driver_is_built():
    v = variants(["disaggregated"], ["2/2/1"], GROUP, COMMON, 4)[0]
    with pytest.raises(ConfigError, match="together at most 3"):
        build_driver([*GROUP, v.file], run_bindings(v, COMMON, 0, 2, -1), None, None)
    assert parse_split("1/2/1") == (1, 2, 1)


def _rows(named: bool):
    out = []
    for label, t in (("colocated", 100.0), ("disaggregated_2_1_1", 200.0),
                     ("disaggregated_1_2_1", 300.0), ("disaggregated_1_1_2", 250.0),
                     ("rr_colocated_1", 150.0), ("rr_colocated_2", 240.0),
                     ("pivotrl", 330.0), ("pivotrl", 270.0)):
        row = {"deployment": label, "throughput": t, "throughput_run": t,
               "throughput_finished": t}
        if named:
            row["name"] = label.rstrip("_0123456789")
        out.append(row)
    return out


@pytest.mark.parametrize("named", [True, False], ids=["rows with names", "legacy rows"])
def test_ratios_are_taken_against_the_best_split_of_each_static_baseline(named):
    out = throughput_table(_rows(named))
    assert out["disaggregated_best_split"] == "disaggregated_1_2_1"
    assert out["rr_colocated_best_split"] == "rr_colocated_2"
    assert out["throughput_mean"]["pivotrl"] == pytest.approx(300.0)
    assert out["ratios"]["pivotrl"] == {
        "vs_colocated": pytest.approx(3.0), "vs_disaggregated": pytest.approx(1.0),
        "vs_rr_colocated": pytest.approx(1.25), "vs_best_static": pytest.approx(1.0)}


def test_a_row_of_another_name_is_no_static_split():
    rows = _rows(True) + [{"deployment": "disaggregated_tuned", "name": "mine",
                           "throughput": 999.0, "throughput_run": 1.0,
                           "throughput_finished": 1.0}]
    assert throughput_table(rows)["disaggregated_best_split"] == "disaggregated_1_2_1"


def test_a_summary_row_without_its_run_folder_names_the_command_to_run():
    from pivot.cluster.results import run_result
    with pytest.raises(ConfigError, match=r"local.py nosuchtag"):
        run_result("nosuchtag", {"deployment": "pivotrl", "seed": 0})
