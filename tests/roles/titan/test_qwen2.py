"""The Qwen2 trainer model (pivot/roles/titan/qwen2.py, hf_shards.py) against transformers'
``Qwen2ForCausalLM`` built here from a random tiny config (no download): per-token
log-probs, the HF adapter both ways, the real Qwen2.5 shapes, and a meta-device build
sharded with FSDP2 on 2 gloo ranks, each Reading only its rows of a safetensors checkpoint.
"""

import dataclasses

import pytest
import torch

from pivot.errors import ConfigError, StateError
from pivot.losses.grpo import token_logprobs
from pivot.roles.titan.hf_shards import (
    StateDictRows,
    hf_shapes,
    hf_shards,
    load_hf_shards,
    merge_hf_shards,
)
from pivot.roles.titan.qwen2 import (
    Qwen2Shape,
    build_qwen2,
    qwen2_model_config,
    state_dict_adapter,
)
from pivot.roles.titan.qwen2_config import QWEN2_5, QWEN2_5_1_5B, QWEN2_5_7B

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=512, max_position_embeddings=128, rope_theta=1e4)
"""A tiny Qwen2 (head_dim 16, 2 query heads per KV head); theta 1e4, not the default 1e6,
so a theta that is not read from the config shows."""

LOGPROB_ATOL = 1e-5
"""fp32 on CPU. Measured: 0.0 (torchtitan's and transformers' kernels agree bit for bit on
this build), untied and tied, single process and 2 FSDP2 ranks."""


def hf_qwen2(tie: bool = False, seed: int = 0):
    """A random transformers Qwen2 whose q/k/v biases are far from zero (the default init
    is zeros, which would hide a dropped bias)."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(
        transformers.Qwen2Config(**TINY, tie_word_embeddings=tie)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("_proj.bias"):
                p.normal_(0.0, 0.5)
    return model


def hf_logprobs(model, ids):
    with torch.no_grad():
        return token_logprobs(model(ids).logits, ids)


def titan_from(hf):
    config = qwen2_model_config(Qwen2Shape.from_hf(hf.config.to_dict()))
    model = build_qwen2(config, seed=1)
    adapter = state_dict_adapter(config)
    load_hf_shards(model, adapter, StateDictRows(hf.state_dict()))
    return model, adapter


def right_padded(seed=0, b=4, length=24):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, TINY["vocab_size"], (b, length), generator=g)
    ids[1, 15:] = 0
    return ids


@pytest.mark.parametrize("tie", [False, True])
def test_log_probs_equal_transformers(tie):
    hf = hf_qwen2(tie=tie)
    model, _ = titan_from(hf)
    ids = right_padded()
    with torch.no_grad():
        got = token_logprobs(model(ids), ids)
    worst = float((got - hf_logprobs(hf, ids)).abs().max())
    assert worst <= LOGPROB_ATOL, f"max |titan - transformers| = {worst:.2e}"
    # the biases matter: without them the log-probs move far beyond the tolerance
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("wqkv.bias"):
                p.zero_()
        off = token_logprobs(model(ids), ids)
    assert float((off - got).abs().max()) > 100 * LOGPROB_ATOL


@pytest.mark.parametrize("tie", [False, True])
def test_to_hf_and_back_is_exact(tie):
    from pivot.compat.torchtitan import merge_fused_qkv

    hf = hf_qwen2(tie=tie, seed=3)
    model, adapter = titan_from(hf)
    want = {k: v for k, v in hf.state_dict().items() if not (tie and k == "lm_head.weight")}
    out = adapter.to_hf(model.state_dict())
    assert set(out) == set(want)
    assert all(torch.equal(out[k], want[k]) for k in want)
    back = merge_fused_qkv(model, adapter.from_hf(dict(out)))
    params = dict(model.named_parameters(remove_duplicate=False))
    assert set(back) == set(params)
    assert all(torch.equal(back[k], params[k]) for k in params)
    # the Write pieces of a single process are every HF tensor, whole
    full = merge_hf_shards(hf_shards(model, adapter), hf_shapes(model, adapter))
    assert set(full) == set(want) and all(torch.equal(full[k], want[k]) for k in want)


def test_a_checkpoint_of_another_shape_is_refused():
    hf = hf_qwen2()
    config = qwen2_model_config(Qwen2Shape.from_hf({**hf.config.to_dict(),
                                                    "intermediate_size": 96}))
    model = build_qwen2(config)
    with pytest.raises(StateError, match="gate_proj.weight has shape"):
        load_hf_shards(model, state_dict_adapter(config), StateDictRows(hf.state_dict()))
    sd = {k: v for k, v in hf.state_dict().items() if k != "model.layers.1.self_attn.k_proj.bias"}
    config = qwen2_model_config(Qwen2Shape.from_hf(hf.config.to_dict()))
    with pytest.raises(StateError, match="no 'model.layers.1.self_attn.k_proj.bias'"):
        load_hf_shards(build_qwen2(config), state_dict_adapter(config), StateDictRows(sd))


@pytest.mark.parametrize("size", sorted(QWEN2_5))
def test_real_qwen2_5_shapes_match_transformers(size):
    """The shipped configs give transformers' parameter names and shapes, and the torchtitan
    model built from them on the meta device asks for exactly those HF tensors."""
    import transformers

    cfg = dict(QWEN2_5[size])
    shape = Qwen2Shape.from_hf(cfg)
    with torch.device("meta"):
        hf = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            **{k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")}))
        config = qwen2_model_config(shape, max_seq_len=64)
        model = config.build()
    want = {k: tuple(v.shape) for k, v in hf.state_dict().items()
            if not (shape.tie_word_embeddings and k == "lm_head.weight")}
    assert shape.hf_param_shapes() == want
    assert hf_shapes(model, state_dict_adapter(config)) == want
    assert shape.num_params() == sum(p.numel() for p in hf.parameters())


def test_real_configs_read_as_published():
    s7, s15 = Qwen2Shape.from_hf(QWEN2_5_7B), Qwen2Shape.from_hf(QWEN2_5_1_5B)
    assert (s7.num_params(), s15.num_params()) == (7_615_616_512, 1_543_714_304)
    assert (s7.head_dim, s7.num_key_value_heads, s7.tie_word_embeddings) == (128, 4, False)
    assert (s15.head_dim, s15.rope_theta, s15.tie_word_embeddings) == (128, 1e6, True)


@pytest.mark.parametrize("change,match", [
    ({"model_type": "qwen3"}, "model_type is 'qwen3'"),
    ({"use_sliding_window": True}, "sliding-window"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn'"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"num_key_value_heads": 5}, "not a multiple"),
    ({"vocab_size": None}, "'vocab_size' is missing"),
])
def test_a_config_this_builder_cannot_reproduce_is_refused(change, match):
    with pytest.raises(ConfigError, match=match):
        Qwen2Shape.from_hf({**QWEN2_5_1_5B, **change})


def test_a_missing_config_file_names_it(tmp_path):
    with pytest.raises(ConfigError, match="config.json"):
        Qwen2Shape.from_hf(tmp_path)


def test_shape_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Qwen2Shape.from_hf(QWEN2_5_1_5B).hidden_size = 1


@pytest.mark.slow
def test_meta_build_sharded_on_two_gloo_ranks_equals_one(tmp_path):
    """Two processes, FSDP2 over gloo: each builds on the meta device, allocates only its
    shards, Reads only its rows of the safetensors checkpoint (half the bytes, together
    all of them once), and gets the single-process log-probs; their Write pieces
    reassemble transformers' state dict exactly."""
    import torch.multiprocessing as mp

    from pivot.testing.titan_shards import sharded_qwen2_rank

    tie = True  # the tied embedding is one parameter, sharded once
    hf = hf_qwen2(tie=tie, seed=5)
    hf.save_pretrained(tmp_path / "model")
    ids = right_padded(seed=1)
    mp.start_processes(sharded_qwen2_rank, args=(2, str(tmp_path / "init"),
                                                 str(tmp_path / "model"), ids, str(tmp_path)),
                       nprocs=2, start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]

    single, adapter = titan_from(hf)
    with torch.no_grad():
        want = token_logprobs(single(ids), ids)
    for r in ranks:
        assert torch.allclose(r["logprobs"], want, atol=LOGPROB_ATOL, rtol=0)
        assert torch.allclose(r["logprobs"], hf_logprobs(hf, ids), atol=LOGPROB_ATOL, rtol=0)

    hf_bytes = sum(v.numel() * v.element_size() for k, v in hf.state_dict().items()
                   if not (tie and k == "lm_head.weight"))
    assert [r["bytes_read"] for r in ranks] == [r["local_bytes"] for r in ranks]
    assert sum(r["bytes_read"] for r in ranks) == hf_bytes
    assert max(r["bytes_read"] for r in ranks) <= hf_bytes // 2 + 4096  # chunk rounding

    from pivot.roles.titan.hf_shards import HFShard

    pieces = [HFShard(*p) for r in ranks for p in r["pieces"]]
    full = merge_hf_shards(pieces, hf_shapes(single, adapter))
    assert all(torch.equal(full[k], hf.state_dict()[k]) for k in full)
    assert len(full) == len(hf.state_dict()) - int(tie)
