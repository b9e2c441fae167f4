"""The device backend: selection, and what it refuses before any
process starts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pivot.errors import ConfigError
from pivot.runtime.backend import Backend, fit_errors, visible_gpus


def test_cpu_and_cuda_differ_only_in_their_fields():
    cpu, cuda = Backend("cpu"), Backend("cuda")
    assert (cpu.device_type, cpu.dist, cpu.dtype, cpu.precision, cpu.sleep_mode) == (
        "cpu", "gloo", "float32", "fp32", False)
    assert (cuda.device_type, cuda.dist, cuda.dtype, cuda.precision, cuda.sleep_mode) == (
        "cuda", "nccl", "bfloat16", "bf16", True)


def test_a_process_per_role_on_cuda_by_default_and_on_cpu_when_asked():
    assert Backend("cuda").procs_per_role and not Backend("cpu").procs_per_role
    assert Backend("cpu", proc_per_role=True).procs_per_role
    with pytest.raises(ConfigError, match="Backend.proc_per_role.*process per role"):
        Backend("cuda", proc_per_role=False)


def test_an_unknown_kind_names_the_binding_and_the_choices():
    with pytest.raises(ConfigError, match=r"Backend.kind='tpu'.*\('cpu', 'cuda'\)"):
        Backend("tpu")
    with pytest.raises(ConfigError, match="Backend.hosts=0"):
        Backend("cpu", hosts=0)


@pytest.mark.skipif(visible_gpus() > 0, reason="this machine has a GPU")
def test_cuda_on_a_machine_without_gpus_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"no CUDA device.*gin/x.gin.*Backend.kind = 'cpu'"):
        Backend("cuda").check(4, {"rollout": 1}, where="gin/x.gin")


def test_cuda_asking_more_gpus_than_the_host_has_is_refused():
    with pytest.raises(ConfigError, match="devices_per_host=16: this host has 8 GPUs"):
        Backend("cuda", devices_per_host=16).check(16, {"rollout": 1}, gpus=8)


def test_a_replica_larger_than_a_host_is_refused_before_any_engine():
    # gin/qwen72b_122b.gin's GenRM (Qwen3.5-122B-A10B) runs TP x EP = 8: on hosts of 4
    # GPUs it cannot start
    with pytest.raises(ConfigError, match=r"genrm replica of 8 devices.*more than one host"):
        Backend("cuda", hosts=32).check(128, {"rollout": 4, "genrm": 8}, gpus=4)
    # on hosts of 8 they fit; what stops a cuda run then is that no GPU run checked it
    with pytest.raises(ConfigError, match=r"no GPU run has checked.*gpu_check.py.*"
                                          r"Backend.untested_cuda = True"):
        Backend("cuda", hosts=16).check(128, {"rollout": 4, "genrm": 8}, gpus=8)
    opted = Backend("cuda", hosts=16, untested_cuda=True)
    opted.check(128, {"rollout": 4, "genrm": 8}, gpus=8)
    assert "never run on a GPU" in opted.warning
    assert Backend("cpu", untested_cuda=True).warning is None


def test_replicas_must_tile_a_host_in_aligned_blocks():
    assert fit_errors(8, 1, 8, {"rollout": 3})[0].startswith(
        "a rollout replica of 3 devices does not tile a host of 8")
    assert fit_errors(16, 2, 8, {"rollout": 2, "genrm": 4, "training": 8}) == []
    assert "do not fit 1 hosts x 4" in fit_errors(8, 1, 4, {"rollout": 1})[0]


def test_cpu_spreads_the_group_over_its_hosts():
    assert Backend("cpu").per_host(4) == 4
    assert Backend("cpu", hosts=2).per_host(4) == 2
    Backend("cpu", hosts=2).check(4, {"rollout": 1, "training": 2})
    with pytest.raises(ConfigError, match="training replica of 4 devices"):
        Backend("cpu", hosts=2).check(4, {"training": 4})


@given(per_host=st.integers(1, 16), hosts=st.integers(1, 8), k=st.integers(1, 16))
def test_a_fitting_replica_tiles_every_host_exactly(per_host, hosts, k):
    errs = fit_errors(hosts * per_host, hosts, per_host, {"r": k})
    if not errs:   # then hosts * per_host / k replicas of k tile the job with no straddler
        assert per_host % k == 0
        blocks = [(d // k) for d in range(hosts * per_host)]
        assert all(blocks[d] // (per_host // k) == d // per_host
                   for d in range(hosts * per_host))
    else:
        assert per_host % k or k > per_host


def test_the_gps_budget_is_the_binding_or_a_share_of_this_host():
    import os

    from pivot.gps.layout import plan_storage, qwen3_model
    from pivot.runtime.backend import GPS_HOST_FRACTION

    assert Backend(gps_host_gb=2).gps_budget_bytes() == 2 << 30
    phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert Backend().gps_budget_bytes() == int(GPS_HOST_FRACTION * phys)
    with pytest.raises(ConfigError, match="Backend.gps_host_gb"):
        Backend(gps_host_gb=-1)
    # the budget picks the layout: a model of ~0.9 GiB on 2 hosts replicates under 1 GiB a
    # host, shards in halves under 0.5 GiB, and is refused, naming the fix, under 0.25
    m = qwen3_model("policy", layers=2, hidden=4096, intermediate=4096, heads=32,
                    kv_heads=8, head_dim=128, vocab=1024)
    assert 0.5 < m.nbytes / 2**30 < 1
    assert plan_storage([m], 2, Backend(gps_host_gb=1).gps_budget_bytes()).k == 1
    assert plan_storage([m], 2, Backend(gps_host_gb=0.5).gps_budget_bytes()).k == 2
    with pytest.raises(ConfigError, match="raise the per-host budget"):
        plan_storage([m], 2, Backend(gps_host_gb=0.25).gps_budget_bytes())
