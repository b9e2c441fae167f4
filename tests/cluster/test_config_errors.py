"""Bad input fails with a clear error before any engine starts (launchers/run.py)."""

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pivot import gin_setup
from pivot.errors import ConfigError
from pivot.cluster.config import PlannerCosts
from pivot.cluster.group import ClusterGroup
from pivot.rl.data import PromptStream

ROOT = Path(__file__).resolve().parents[2]
COSTS = PlannerCosts((2e-6, 0.012, 6e-4, 0.002), None)
"""A decode-latency model for drivers these tests only build (no fit: nothing runs)."""


def test_a_missing_gin_file_is_named():
    with pytest.raises(ConfigError, match="does not exist"):
        gin_setup.parse(["gin/nope.gin"], [])


def test_an_unknown_binding_is_named():
    with pytest.raises(ConfigError, match="ClusterDriver.no_such"):
        gin_setup.parse([str(ROOT / "gin/tiny_cpu.gin")], ["ClusterDriver.no_such = 1"])


def test_a_group_whose_slots_do_not_fit_the_machine_is_refused():
    with pytest.raises(ConfigError, match="memory_budget_gb"):
        ClusterGroup(devices=8).check()
    with pytest.raises(ConfigError, match="cores"):
        ClusterGroup(devices=64, gb_per_slot=0.1, memory_budget_gb=1000).check()


def test_a_data_file_with_the_wrong_schema_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"problem": ["1+1"], "answer": ["2"]}), f)
    with pytest.raises(ConfigError, match="DAPO-Math-17k schema"):
        PromptStream(parquet=str(f))


def test_run_py_reports_a_bad_binding_without_starting_engines():
    out = subprocess.run([sys.executable, "launchers/run.py", "--gin", "gin/tiny_cpu.gin",
                          "--gin_param", "ClusterGroup.devices = 16"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "ClusterGroup.devices=16: 16 slots a host do not fit" in out.stderr
    assert "slots with engines up" not in out.stderr


def test_run_py_refuses_experts_that_do_not_divide_among_a_replica(tmp_path):
    """An MoE GenRM's replica of 2 slots divides its experts among them (EP); 3 experts
    do not divide, so the stack refuses before any process starts."""
    from pivot.roles.engine.tiny import make_tiny_qwen3, make_tiny_qwen3_moe

    policy = make_tiny_qwen3(tmp_path / "policy")
    genrm = make_tiny_qwen3_moe(tmp_path / "genrm", experts=3)
    out = subprocess.run([
        sys.executable, "launchers/run.py", "--gin", "gin/tiny_cpu.gin", "--gin",
        "gin/deployments/pivotrl.gin", "--gin", "gin/tiny_cpu_tp2.gin",
        "--gin_param", "ClusterGroup.policy_replica_devices = 1",
        "--gin_param", "ClusterGroup.genrm_replica_devices = 2",
        "--gin_param", f"ClusterGroup.policy_dir = '{policy}'",
        "--gin_param", f"ClusterGroup.genrm_dir = '{genrm}'"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    said = out.stdout + out.stderr
    assert "3 experts do not divide among 2 expert-parallel ranks" in said
    assert "slots with" not in said


def test_a_tp_replica_needs_a_process_per_role_and_whole_replicas():
    from pivot.cluster.driver import ClusterDriver
    from pivot.gin_files import configured_deployment, split_bindings
    from pivot.runtime.backend import Backend

    with pytest.raises(ConfigError, match="policy_replica_devices.*proc_per_role = True"):
        ClusterGroup(policy_replica_devices=2)
    group = ClusterGroup(policy_replica_devices=2, backend=Backend("cpu", proc_per_role=True))
    # a split of 1 rollout slot does not make a replica of 2
    split = configured_deployment("disaggregated", bindings=split_bindings((1, 2, 1)))
    with pytest.raises(ConfigError, match="rollout_devices=1.*multiple of 2"):
        ClusterDriver(group, split, PromptStream(), costs=COSTS)


def test_every_planner_that_places_tp_replicas_must_place_them_on_aligned_blocks():
    from functools import partial

    from pivot.cluster.driver import ClusterDriver
    from pivot.gin_files import configured_deployment, split_bindings
    from pivot.runtime.backend import Backend
    from pivot.planner.baselines import RolloutRewardColocatedPlanner

    group = ClusterGroup(policy_replica_devices=2, backend=Backend("cpu", proc_per_role=True))
    rr = configured_deployment("rr_colocated", bindings=split_bindings((None, None, 2)))
    with pytest.raises(ConfigError, match="bind RolloutRewardColocatedPlanner.aligned_blocks"):
        ClusterDriver(group, rr, PromptStream(), costs=COSTS)
    aligned = partial(RolloutRewardColocatedPlanner, aligned_blocks=True)
    assert ClusterDriver(group, replace(rr, planner=aligned), PromptStream(),
                         costs=COSTS).planner.aligned_blocks
    # a static split places no replica after provisioning (which takes aligned blocks)
    ClusterDriver(group, configured_deployment("disaggregated", bindings=split_bindings(
        (2, 1, 1))), PromptStream(), costs=COSTS)


def test_provisioning_takes_aligned_blocks_of_free_slots():
    from pivot.cluster.driver import take_blocks

    free = [0, 1, 2, 4, 5]
    assert take_blocks(free, 2, 4) == ((0, 1), (4, 5)) and free == [2]
    free = [1, 2, 3]
    assert take_blocks(free, 2, 2) == ((2, 3),) and free == [1]
    free = [0, 1, 2]
    assert take_blocks(free, 1, 2) == ((0,), (1,)) and free == [2]


def test_the_fitted_costs_are_required_and_their_absence_is_named():
    """The decode-latency constants have no default: a group file binds its engines' fit
    (gin/tiny_cpu.gin), a run without one fails naming the binding."""
    import gin

    from pivot.cluster.driver import ClusterDriver
    from pivot.gin_files import configured_deployment
    gin.clear_config()
    with pytest.raises(ConfigError, match=r"PlannerCosts.throughput, PlannerCosts."
                                          r"judge_throughput: required .*gin/tiny_cpu.gin"):
        ClusterDriver(ClusterGroup(), configured_deployment("pivotrl"), PromptStream())
    gin_setup.parse([str(ROOT / "gin/tiny_cpu.gin")], ["PlannerCosts.throughput = None"])
    try:
        with pytest.raises(ConfigError,
                           match=r"PlannerCosts.throughput=None: must be \(A, B, C, D\)"):
            gin_setup.build()
    finally:
        gin.clear_config()


@pytest.mark.parametrize("make, match", [
    (lambda c: c.RunConfig(steps=0), r"RunConfig.steps=0: must be an integer >= 1"),
    (lambda c: c.RunConfig(eval_every=-2), r"RunConfig.eval_every=-2: .*-1: never"),
    (lambda c: c.RunConfig(resume="yes"), r"RunConfig.resume='yes': must be True or False"),
    (lambda c: c.RunConfig(run_dir=""), r"RunConfig.run_dir='': must be a non-empty string"),
    (lambda c: c.PlannerCosts((1.0, 2.0), None), r"PlannerCosts.throughput=\(1.0, 2.0\)"),
    (lambda c: c.PlannerCosts((0, 0, 0, 1e-3), (0, -1, 0, 0)),
     r"PlannerCosts.judge_throughput \(B\)=-1: must be a number >= 0"),
    (lambda c: c.PlannerCosts((0, 0, 0, 1e-3), None, tau_training=-1.0),
     r"PlannerCosts.tau_training=-1.0"),
    (lambda c: c.OptimizerConfig(lr=0.0), r"OptimizerConfig.lr=0.0: must be a number in \(0, 1\]"),
    (lambda c: c.FaultBudget(max_slot_deaths=-1), r"FaultBudget.max_slot_deaths=-1: .*first death"),
    (lambda c: c.FaultBudget(max_shift_failures=1.5), r"FaultBudget.max_shift_failures=1.5"),
])
def test_each_config_checks_its_own_fields_naming_the_binding(make, match):
    from pivot.cluster import config
    with pytest.raises(ConfigError, match=match):
        make(config)


def test_the_driver_cross_checks_slots_against_cores_and_rows():
    import os

    from pivot.cluster.cpu.config import CpuConfig
    from pivot.cluster.driver import ClusterDriver
    from pivot.gin_files import configured_deployment
    cores = os.cpu_count() or 1
    with pytest.raises(ConfigError, match=r"CpuConfig.share=.*: must be a number in \[0, "):
        CpuConfig(share=cores + 1.0)
    dep = configured_deployment("pivotrl")
    with pytest.raises(ConfigError, match=r"CpuConfig.share=.*4 slots \(ClusterGroup.devices\)"):
        ClusterDriver(ClusterGroup(), dep, costs=COSTS, cpu=CpuConfig(share=float(cores)))
    colocated = configured_deployment("colocated")   # trains on all 4 slots
    with pytest.raises(ConfigError, match=r"PromptStream.prompts_per_step=1: .* 2 rows a step, "
                                          r"fewer than the 4 training slots"):
        ClusterDriver(ClusterGroup(n=2), colocated, PromptStream(prompts_per_step=1),
                      costs=COSTS)
    with pytest.raises(ConfigError, match=r"ClusterDriver.faults=.*must be a FaultBudget"):
        ClusterDriver(ClusterGroup(), dep, costs=COSTS, faults=2)
