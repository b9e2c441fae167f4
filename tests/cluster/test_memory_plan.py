"""The memory plan of ``--dry_run`` (pivot.cluster.memory_plan): its formulas on small
numbers, the paper groups on the paper's cluster (16 x 8 H20 96 GB; 2 TB host memory and
1 TB /dev/shm assumed), and the launcher on this CPU-only machine. No engine starts."""

from __future__ import annotations

import subprocess
import sys

import gin
import pytest

from pivot import gin_setup
from pivot.cluster.memory_plan import (GB, ClusterSpec, activation_bytes_per_token,
                                       engine_memory, plan, trainer_memory)
from pivot.paths import REPO_ROOT
from pivot.spec.model_group import ModelGroup
from pivot.spec.profile import ModelProfile
from pivot.spec.roofline import Architecture

GROUPS = ["qwen1.5b_glm9b", "qwen7b_30b", "qwen32b_30b", "qwen72b_122b"]
SHORT = ["LengthModel.prompt_cap = 256", "LengthModel.prompt_median = 100",
         "LengthModel.response_cap = 256", "LengthModel.response_median = 100",
         "LengthModel.judge_cap = 512", "LengthModel.judge_median = 100",
         "ModelGroup.prompts_per_step = 8"]
ENGINES = {"policy_max_model_len": 512, "genrm_max_model_len": 1024,
           "policy_max_num_seqs": 64, "genrm_max_num_seqs": 64,
           "policy_memory_share": 0.45, "genrm_memory_share": 0.45}


def group(name: str, extra: list[str] = ()) -> ModelGroup:
    gin_setup.parse([str(REPO_ROOT / f"gin/{name}.gin")], list(extra))
    try:
        return ModelGroup()
    finally:
        gin.clear_config()


def small_model() -> ModelProfile:
    arch = Architecture(layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4,
                        intermediate=16, vocab=10)
    return ModelProfile("tiny", arch.total_params / 1e9, arch.total_params / 1e9,
                        arch.kv_bytes_per_token, 1, arch=arch)


def test_the_formulas_on_small_numbers():
    m = small_model()
    # A = 2 (5 h + 2 q + 2 kv + 3 I) = 2 (40 + 16 + 8 + 48) = 224 a layer; logits 10 V
    assert activation_bytes_per_token(m.arch) == 2 * 224 + 100
    t = trainer_memory(m, ranks=2, rows=3, seq_len=5)
    p = m.params_b * 1e9
    assert (t.params, t.grads, t.optimizer) == (2 * p, 2 * p, 4 * p)   # 16 B / param / 2
    assert t.activations == 3 * 5 * (2 * 224 + 100)
    assert t.offload == t.grads + t.optimizer
    e = engine_memory(m, 0.5, 10 * GB, 512, 8)
    assert e.pool == 5 * GB and e.weights == 2 * p
    assert e.kv == 5 * GB - 2 * p - 1 * GB
    assert e.kv_tokens == int(e.kv / m.kv_bytes_per_token)


def test_a_too_small_gpu_is_refused_naming_the_binding():
    g = group("qwen72b_122b")
    p = plan(ClusterSpec(gpu_gb=40), name=g.name, devices=128, policy=g.policy,
             genrm=g.genrm, engines=ENGINES, train_ranks=64, train_rows=64)
    bindings = {r.binding for r in p.refusals}
    assert "ClusterGroup.genrm_memory_share" in bindings   # 30.5 GB of weights in 18 GB
    with pytest.raises(Exception, match="ClusterGroup.genrm_memory_share"):
        p.check()


@pytest.mark.parametrize("name", GROUPS)
def test_every_paper_group_fits_the_paper_cluster_on_a_short_workload(name):
    g = group(name, SHORT)
    ln = g.lengths
    engines = dict(ENGINES, policy_max_model_len=ln.prompt_cap + ln.response_cap,
                   genrm_max_model_len=8192)
    p = plan(ClusterSpec(), name=name, devices=g.devices, policy=g.policy, genrm=g.genrm,
             engines=engines, train_ranks=g.training.devices,
             train_rows=g.prompts_per_step * g.n)
    assert p.refusals == [], p.refusals
    p.check()


@pytest.mark.parametrize("name", GROUPS)
def test_paper_lengths_are_refused_by_the_trainer_alone(name):
    g = group(name)
    ln = g.lengths
    engines = dict(ENGINES, policy_max_model_len=ln.prompt_cap + ln.response_cap,
                   genrm_max_model_len=30624)
    p = plan(ClusterSpec(), name=name, devices=g.devices, policy=g.policy, genrm=g.genrm,
             engines=engines, train_ranks=g.training.devices,
             train_rows=g.prompts_per_step * g.n)
    assert [r.binding for r in p.refusals] == ["ModelGroup.prompts_per_step"]
    assert "without micro-batches" in p.refusals[0].why


@pytest.mark.parametrize("name,fits", [("qwen1.5b_glm9b", True), ("qwen7b_30b", True),
                                       ("qwen32b_30b", False), ("qwen72b_122b", False)])
def test_one_host_of_8_h100(name, fits):
    g = group(name, SHORT)
    spec = ClusterSpec(hosts=1, gpu_gb=80, gpu_name="H100")
    p = plan(spec, name=name, devices=8, policy=g.policy, genrm=g.genrm,
             engines=dict(ENGINES, genrm_max_model_len=8192), train_ranks=8,
             train_rows=g.prompts_per_step * g.n)
    if fits:
        assert p.refusals == [], p.refusals
    else:   # 32.8B (72.7B) x 16 B over 8 ranks: 66 (145) GB of trainer state a GPU
        assert "ModelGroup.prompts_per_step" in {r.binding for r in p.refusals}
        with pytest.raises(Exception, match="trainer rank needs"):
            p.check()


def run_py(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "launchers/run.py", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)


def test_run_py_dry_run_prints_a_plan_on_this_cpu_machine():
    params = [x for b in SHORT for x in ("--gin_param", b)]
    out = run_py("--gin", "gin/qwen7b_30b.gin", "--gin", "gin/backends/cuda.gin",
                 "--dry_run", *params)
    assert out.returncode == 0, out.stderr[-3000:]
    for s in ("per GPU (each of 32)", "policy engine", "GenRM engine", "trainer rank",
              "GPS arenas", "fits"):
        assert s in out.stdout, out.stdout
    full = run_py("--gin", "gin/qwen7b_30b.gin", "--gin", "gin/backends/cuda.gin",
                  "--dry_run")
    assert full.returncode == 2 and "trainer rank needs" in full.stderr
    cpu = run_py("--dry_run")
    assert cpu.returncode == 0 and "Nothing started" in cpu.stdout, cpu.stderr[-2000:]
