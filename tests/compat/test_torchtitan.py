"""``pivot.compat.torchtitan`` against the installed torchtitan and torch: versions, the
private names its shims rely on, and one functional check per shim on a tiny Qwen3."""

import importlib.metadata
import inspect
import subprocess
import sys
import typing

import pytest
import torch
import torch.distributed as dist

from pivot.compat import torchtitan as tt
from pivot.roles.titan.model import Qwen3Shape, build_qwen3, qwen3_model_config

RECHECK = ("re-check every shim of pivot/compat/torchtitan.py (qwen3_inits, "
           "qwen3_sdpa_layers, merge_fused_qkv, use_partial_dtensor, sum_reduction_over_gloo) "
           "and update WRITTEN_FOR")
TINY = dict(model_type="qwen3", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=128,
            max_position_embeddings=64, rope_theta=1e6)


@pytest.fixture(scope="module")
def tiny_config():
    return qwen3_model_config(Qwen3Shape.from_hf(TINY), max_seq_len=32)


def test_installed_torchtitan_and_torch_are_the_ones_the_shims_were_written_for():
    got = importlib.metadata.version(tt.DIST)
    assert got == tt.VERSION, f"torchtitan {got} installed, shims written for " \
                              f"{tt.WRITTEN_FOR}: {RECHECK}"
    torch_got = torch.__version__.split("+")[0]
    assert torch_got == tt.TORCH_VERSION, f"torch {torch_got} installed, shims written for " \
                                          f"{tt.WRITTEN_FOR}: re-check use_partial_dtensor " \
                                          f"and sum_reduction_over_gloo"


def test_importing_the_compat_module_imports_neither_torchtitan_nor_torch():
    code = ("import sys, pivot.compat.torchtitan; "
            "print('torchtitan' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False False"


def test_qwen3_private_builder_and_init_tables_still_exist():
    import torchtitan.models.qwen3 as q

    for name in ("_EMBEDDING_INIT", "_LINEAR_INIT", "_NORM_INIT"):
        table = getattr(q, name, None)
        assert isinstance(table, dict) and "weight" in table, f"{name} changed: " \
                                                              f"re-check qwen3_inits"
    sig = inspect.signature(getattr(q, "_build_qwen3_layers"))
    want = {"n_layers", "dim", "n_heads", "n_kv_heads", "head_dim", "hidden_dim", "fuse_qkv",
            "attn_backend", "rope"}
    assert want <= set(sig.parameters), f"_build_qwen3_layers{sig}: re-check " \
                                        f"qwen3_sdpa_layers"


def test_the_attention_swap_gives_sdpa_layers_that_train_on_cpu(tiny_config):
    from torchtitan.models.common.attention import ScaledDotProductAttention

    model = build_qwen3(tiny_config)
    kinds = {type(layer.attention.inner_attention) for layer in model.layers.values()}
    assert kinds == {ScaledDotProductAttention}, f"{kinds}: re-check qwen3_sdpa_layers"
    ids = torch.randint(0, TINY["vocab_size"], (2, 16))
    model(ids).float().logsumexp(-1).mean().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_merge_fused_qkv_undoes_the_split_of_the_state_dict(tiny_config):
    from torchtitan.models.common.attention import FusedQKVLinear

    params = list(inspect.signature(FusedQKVLinear._merge_qkv_on_load).parameters)
    assert params[:3] == ["module", "state_dict", "prefix"], f"{params}: re-check " \
                                                             f"merge_fused_qkv"
    model = build_qwen3(tiny_config)
    sd = model.state_dict()
    assert any(".wq." in k for k in sd), "the state dict no longer splits wqkv: " \
                                         "merge_fused_qkv may be unneeded"
    merged = tt.merge_fused_qkv(model, dict(sd))
    named = dict(model.named_parameters())
    assert set(named) <= set(merged) and not any(".wq." in k for k in merged)
    assert all(torch.equal(merged[n], p) for n, p in named.items())


def test_partial_dtensor_is_an_spmd_backend_and_is_selected():
    from torchtitan.config import configs
    from torchtitan.distributed import utils

    hint = typing.get_type_hints(configs.ParallelismConfig)["spmd_backend"]
    assert tt.SPMD_BACKEND in typing.get_args(hint), f"{hint}: re-check use_partial_dtensor"
    before = utils.get_spmd_backend()
    try:
        tt.use_partial_dtensor()
        assert utils.get_spmd_backend() == tt.SPMD_BACKEND
    finally:
        utils.set_spmd_backend(before)


def test_sum_reduction_over_gloo_gives_the_single_process_gradient(tiny_config, tmp_path):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard
    from torchtitan.distributed import utils

    for name in ("set_force_sum_reduction_for_comms", "set_gradient_divide_factor"):
        assert callable(getattr(FSDPModule, name, None)), f"FSDPModule.{name} is gone: " \
                                                          f"re-check sum_reduction_over_gloo"
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    before = utils.get_spmd_backend()
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1),
                            rank=0, world_size=1)
    try:
        tt.use_partial_dtensor()
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))
        ref, sharded = build_qwen3(tiny_config), build_qwen3(tiny_config)
        for block in sharded.layers.values():
            fully_shard(block, mesh=mesh)
        fully_shard(sharded, mesh=mesh)
        assert tt.sum_reduction_over_gloo(sharded) == 1 + len(sharded.layers)
        ids = torch.randint(0, TINY["vocab_size"], (2, 16))
        for m in (ref, sharded):
            m(ids).float().logsumexp(-1).sum().backward()
        got = {n: p.grad.full_tensor() for n, p in sharded.named_parameters()}
        for n, p in ref.named_parameters():
            torch.testing.assert_close(got[n], p.grad, rtol=0, atol=1e-6)
    finally:
        dist.destroy_process_group()
        utils.set_spmd_backend(before)
