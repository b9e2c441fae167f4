"""Names the local measurements accept, and their summaries (no engine)."""

import pytest

from experiments.local import deployment_of, throughput_table
from pivot.errors import ConfigError


def test_pivotrl_variants_set_the_planner_knobs_and_keep_the_rest():
    d = deployment_of("pivotrl_H10_min1")
    assert d.name == "pivotrl_H10_min1"
    assert d.planner.keywords == {"H": 10.0, "min_replicas": 1}
    assert deployment_of("pivotrl_rule_train2").planner.keywords == {"scheduler_rule": True}
    assert deployment_of("pivotrl_rule_train2").training_devices == 2
    home = deployment_of("pivotrl_train2_home_min0")
    assert (home.training_home, home.training_devices, home.rollout_devices,
            home.reward_devices) == (True, 2, -1, 1)
    assert home.planner.keywords == {"min_replicas": 0}
    base = deployment_of("pivotrl")
    assert (d.staleness, d.rollout_devices, d.reward_devices) == (
        base.staleness, base.rollout_devices, base.reward_devices)


@pytest.mark.parametrize("bad", ["pivotrl_x", "nope", "pivotrl_minX"])
def test_an_unknown_deployment_is_a_config_error_naming_it(bad):
    with pytest.raises(ConfigError, match=bad):
        deployment_of(bad)


def test_ratios_are_taken_against_the_best_split_of_each_static_baseline():
    rows = [{"deployment": d, "throughput": t, "throughput_run": t, "throughput_finished": t}
            for d, t in (("colocated", 100.0), ("disaggregated_2_1_1", 200.0),
                         ("disaggregated_1_2_1", 300.0), ("disaggregated_1_1_2", 250.0),
                         ("rr_colocated_1", 150.0), ("rr_colocated_2", 240.0),
                         ("pivotrl", 330.0), ("pivotrl", 270.0))]
    out = throughput_table(rows)
    assert out["disaggregated_best_split"] == "disaggregated_1_2_1"
    assert out["rr_colocated_best_split"] == "rr_colocated_2"
    assert out["throughput_mean"]["pivotrl"] == pytest.approx(300.0)
    assert out["ratios"]["pivotrl"] == {
        "vs_colocated": pytest.approx(3.0), "vs_disaggregated": pytest.approx(1.0),
        "vs_rr_colocated": pytest.approx(1.25), "vs_best_static": pytest.approx(1.0)}


def test_throughput_runs_every_static_split_with_each_role_on_a_slot():
    from experiments.local import throughput_deployments
    deps = throughput_deployments(4)
    assert set(deps) == {"colocated", "disaggregated_2_1_1", "disaggregated_1_2_1",
                         "disaggregated_1_1_2", "rr_colocated_1", "rr_colocated_2", "pivotrl"}
    d = deployment_of("disaggregated_1_1_2")
    assert (d.rollout_devices, d.reward_devices, d.training_devices) == (1, 1, 2)
    assert deployment_of("rr_colocated_2").training_devices == 2


def test_a_summary_row_without_its_run_folder_names_the_command_to_run():
    from experiments.local import run_result
    with pytest.raises(ConfigError, match=r"local.py nosuchtag"):
        run_result("nosuchtag", {"deployment": "pivotrl", "seed": 0})
