"""Bad input fails with a clear error before any engine starts (launchers/run.py)."""

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pivot import gin_setup
from pivot.errors import ConfigError
from pivot.cluster.group import ClusterGroup
from pivot.rl.data import PromptStream

ROOT = Path(__file__).resolve().parents[2]


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
        "gin/local/pivotrl.gin", "--gin", "gin/local/tp2.gin",
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
    from pivot.cluster.deployments import split_deployment
    from pivot.cluster.driver import ClusterDriver
    from pivot.runtime.backend import Backend

    with pytest.raises(ConfigError, match="policy_replica_devices.*proc_per_role = True"):
        ClusterGroup(policy_replica_devices=2)
    group = ClusterGroup(policy_replica_devices=2, backend=Backend("cpu", proc_per_role=True))
    # a split of 1 rollout slot does not make a replica of 2
    with pytest.raises(ConfigError, match="rollout_devices=1.*multiple of 2"):
        ClusterDriver(group, split_deployment("disaggregated_1_2_1"), PromptStream())


def test_every_planner_that_places_tp_replicas_must_place_them_on_aligned_blocks():
    from functools import partial

    from pivot.cluster.deployments import split_deployment
    from pivot.cluster.driver import ClusterDriver
    from pivot.runtime.backend import Backend
    from pivot.planner.baselines import RolloutRewardColocatedPlanner

    group = ClusterGroup(policy_replica_devices=2, backend=Backend("cpu", proc_per_role=True))
    rr = split_deployment("rr_colocated_2")
    with pytest.raises(ConfigError, match="bind RolloutRewardColocatedPlanner.aligned_blocks"):
        ClusterDriver(group, rr, PromptStream())
    aligned = partial(RolloutRewardColocatedPlanner, aligned_blocks=True)
    assert ClusterDriver(group, replace(rr, planner=aligned), PromptStream()).planner.aligned_blocks
    # a static split places no replica after provisioning (which takes aligned blocks)
    ClusterDriver(group, split_deployment("disaggregated_2_1_1"), PromptStream())


def test_provisioning_takes_aligned_blocks_of_free_slots():
    from pivot.cluster.driver import take_blocks

    free = [0, 1, 2, 4, 5]
    assert take_blocks(free, 2, 4) == ((0, 1), (4, 5)) and free == [2]
    free = [1, 2, 3]
    assert take_blocks(free, 2, 2) == ((2, 3),) and free == [1]
    free = [0, 1, 2]
    assert take_blocks(free, 1, 2) == ((0,), (1,)) and free == [2]
