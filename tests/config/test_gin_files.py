"""The deployments as gin files (pivot.gin_files): one file each under gin/deployments/,
splits as bindings, and the Deployment a model group, a deployment and bindings build."""

from __future__ import annotations

import functools
from pathlib import Path

import gin
import pytest

from pivot import gin_setup
from pivot.errors import ConfigError
from pivot.gin_files import (all_splits, configured_deployment, deployment_file,
                             split_bindings, split_label, split_of, takes_split)

ROOT = Path(__file__).resolve().parents[2]
DEPLOYMENTS = sorted(p.stem for p in (ROOT / "gin/deployments").glob("*.gin"))
GROUPS = ["qwen1.5b_glm9b", "qwen7b_30b", "qwen32b_30b", "qwen72b_122b"]


def test_the_deployments_of_the_paper_are_one_file_each():
    assert set(DEPLOYMENTS) == {
        "colocated", "disaggregated", "rr_colocated", "pivotrl",            # sec. 8.2
        "static", "rule_based", "vanilla", "throughput_model", "full",      # sec. 8.4
        "forced_shifts", "pivotrl_train2"}
    assert not (ROOT / "gin/local").exists() and not (ROOT / "gin/strategies").exists()


def test_a_bare_stem_is_a_file_under_gin_deployments():
    assert deployment_file("pivotrl") == "gin/deployments/pivotrl.gin"
    assert deployment_file("gin/deployments/static.gin") == "gin/deployments/static.gin"
    with pytest.raises(ConfigError, match="no gin/deployments/pivotrl_H10.gin"):
        deployment_file("pivotrl_H10")
    with pytest.raises(ConfigError, match="does not exist"):
        deployment_file("gin/nope.gin")


def test_the_configured_deployment_carries_its_planners_bindings():
    d = configured_deployment("pivotrl_train2")
    assert (d.name, d.rollout_devices, d.reward_devices, d.training_home,
            d.training_devices) == ("pivotrl_train2", 3, 1, False, 2)
    assert isinstance(d.planner, functools.partial)
    assert d.planner.keywords == {"min_replicas": 0, "scheduler_rule": True}
    # the config is cleared: the planner builds the same without it
    with pytest.raises(ValueError):
        gin.query_parameter("PivotPlanner.min_replicas")
    from pivot.scheduler.throughput import ThroughputModel
    tm = ThroughputModel(1e-6, 1e-2, 4e-4, 0.0)
    p = d.planner(tm, tm)
    assert (p.min_replicas, p.scheduler_rule, p.H) == (0, True, 60.0)
    static = configured_deployment("static")
    assert static.planner.keywords == {"home_devices": (3,)}   # gin/tiny_cpu.gin's
    assert configured_deployment("pivotrl", bindings=["PIVOT_ROLLOUT = 2"]).rollout_devices == 2


def test_a_planner_that_takes_another_ones_bindings_is_refused_as_a_value():
    with pytest.raises(ConfigError, match="VanillaPlanner takes PivotPlanner's bindings"):
        configured_deployment("vanilla")   # gin/tiny_cpu.gin binds PivotPlanner.min_replicas
    d = configured_deployment("vanilla", carry_planner=False)
    assert (d.name, d.binary_scheduler, d.migrate_on_shift_up) == ("vanilla", True, False)


def test_splits_are_bindings_and_labels():
    assert all_splits(4) == [(1, 2, 1), (2, 1, 1), (1, 1, 2)]
    assert len(all_splits(6)) == 10
    dis, rr = configured_deployment("disaggregated"), configured_deployment("rr_colocated")
    assert (takes_split(dis), takes_split(rr)) == ("full", "training")
    assert takes_split(configured_deployment("colocated")) is None
    assert takes_split(configured_deployment("pivotrl")) is None
    assert takes_split(configured_deployment("static")) == "full"
    s = split_of("training", (1, 1, 2))
    assert split_label("rr_colocated", s) == "rr_colocated_2"
    assert split_label("disaggregated", (1, 2, 1)) == "disaggregated_1_2_1"
    assert split_label("pivotrl", None) == "pivotrl"
    d = configured_deployment("rr_colocated", bindings=split_bindings(s))
    assert (d.rollout_devices, d.reward_devices, d.training_devices) == (-1, 0, 2)
    d = configured_deployment("disaggregated", bindings=split_bindings((1, 1, 2)))
    assert (d.rollout_devices, d.reward_devices, d.training_devices) == (1, 1, 2)


@pytest.mark.parametrize("dep", DEPLOYMENTS)
def test_every_deployment_builds_on_the_cluster_driver_and_on_every_paper_group(dep):
    """Over gin/tiny_cpu.gin (the cluster driver; constructors only) and over each paper
    model group (the simulator); the deployment's name is the file's."""
    try:
        for files in [["gin/tiny_cpu.gin"], ["gin/tiny_cpu.gin", "gin/tiny_cpu_tp2.gin"],
                      *([f"gin/{g}.gin"] for g in GROUPS)]:
            if dep == "forced_shifts" and not files[0].startswith("gin/tiny"):
                continue   # the cluster driver's reliability run (ClusterChecker)
            gin_setup.parse([str(ROOT / f) for f in files] + [str(ROOT / deployment_file(dep))],
                            [])
            d = gin_setup.build()
            assert d.dep.name == dep, files
    finally:
        gin.clear_config()
