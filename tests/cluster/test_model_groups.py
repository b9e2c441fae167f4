"""A paper model group on the real driver: one extra gin file switches
``gin/qwen*.gin`` from the simulator to the real driver on a backend, and what the
backend cannot run is refused before any process starts."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import gin
import pytest

from pivot import gin_setup
from pivot.errors import ConfigError
from pivot.cluster.model_groups import cluster_group, cluster_stream
from pivot.paths import REPO_ROOT
from pivot.runtime.backend import Backend, visible_gpus
from pivot.spec.model_group import ModelGroup


@pytest.fixture
def qwen7b_30b():
    gin_setup.parse([str(REPO_ROOT / "gin/qwen7b_30b.gin")], [])
    yield ModelGroup()
    gin.clear_config()


def test_the_group_maps_its_own_settings_without_restating_them(qwen7b_30b, tmp_path):
    g = qwen7b_30b
    big = 1e6   # a CPU host with the memory, so that only the mapping is left to check
    # the GenRM's TP x EP = 4 replica needs a process per role on each slot
    with pytest.raises(ConfigError, match="genrm_replica_devices=4.*process per role"):
        cluster_group(g, Backend("cpu"), memory_budget_gb=big)
    one = dataclasses.replace(g, genrm=dataclasses.replace(g.genrm, devices=1))
    lg = cluster_group(one, Backend("cpu"), checkpoints=str(tmp_path), load_format="dummy",
                       memory_budget_gb=big)
    assert (lg.name, lg.devices, lg.training_devices, lg.n) == (
        "qwen7b_30b", g.devices, g.training.devices, g.n)
    assert (lg.policy_dir, lg.genrm_dir) == (str(tmp_path / "Qwen2.5-7B"),
                                             str(tmp_path / "Qwen3-30B-A3B"))
    assert (lg.max_response_tokens, lg.max_judge_tokens) == (
        g.lengths.response_cap, g.lengths.judge_cap)
    assert lg.backend == Backend("cpu", hosts=g.devices // 8, devices_per_host=8)
    assert lg.load_format == "dummy"
    assert cluster_stream(g).prompts_per_step == g.prompts_per_step


def test_a_cpu_host_refuses_a_paper_group_by_its_memory(qwen7b_30b):
    # Qwen2.5-7B + Qwen3-30B-A3B in fp32 engines plus the 7B's AdamW state: 274 GB a slot
    with pytest.raises(ConfigError, match=r"8 slots a host x 274 GB.*qwen7b_30b"):
        cluster_group(qwen7b_30b, Backend("cpu"))


@pytest.mark.skipif(visible_gpus() > 0, reason="this machine has a GPU")
@pytest.mark.parametrize("group", ["qwen7b_30b", "qwen72b_122b"])
def test_run_py_on_the_cuda_backend_refuses_a_machine_without_gpus_before_any_process(group):
    out = subprocess.run(
        [sys.executable, "launchers/run.py", "--gin", f"gin/{group}.gin", "--gin",
         "gin/backends/cuda.gin", "--no_progress"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Backend.kind='cuda': this machine has no CUDA device" in out.stderr
    assert "run.driver = @ClusterDriver from gin/backends/cuda.gin" in out.stderr
    assert "engines up" not in out.stderr and "allocated" not in out.stderr
