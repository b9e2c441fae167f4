"""The trainer builds the policy's family from its config: a Qwen2
policy (the paper's Qwen2.5) trains through the same ``Trainer`` as the tiny Qwen3, checked
against transformers' ``Qwen2ForCausalLM`` before and after a GRPO step."""

import copy

import pytest
import torch

from pivot.errors import ConfigError
from pivot.roles.titan.family import family_of
from pivot.roles.trainer import Trainer

LOGPROB_ATOL = 1e-5   # fp32 on CPU (measured 0.0 for the model alone: test_qwen2.py)
QWEN2 = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
             max_position_embeddings=128, rope_theta=1e4)


def hf_qwen2(seed=0):
    import transformers
    torch.manual_seed(seed)
    m = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**QWEN2)).eval()
    with torch.no_grad():   # zero biases (the default) would hide a dropped bias
        for n, p in m.named_parameters():
            if n.endswith("_proj.bias"):
                p.normal_(0.0, 0.5)
    return m


def test_the_family_follows_model_type(tmp_path):
    assert family_of({"model_type": "qwen2"}).name == "qwen2"
    assert family_of({"model_type": "qwen3"}).name == "qwen3"
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ConfigError, match=r"config.json: model_type 'llama' has no trainer"):
        family_of(tmp_path)


def test_a_qwen2_policy_trains_through_the_trainer_like_transformers(make_batch,
                                                                     hf_logprobs):
    hf = hf_qwen2()
    tr = Trainer(Trainer.Config(model=hf.config.to_dict(),
                                optimizer=Trainer.Optimizer(lr=1e-3)))
    tr.setup()
    tr.load_hf_state_dict(hf.state_dict())
    assert tr.family.name == "qwen2"
    batch = make_batch()
    got = tr.compute_logprobs(batch)
    want = hf_logprobs(hf, batch.input_ids)
    assert (got - want)[batch.response_mask.bool()].abs().max() <= LOGPROB_ATOL
    out = tr.state_dict_hf()
    assert set(out) == set(hf.state_dict()) and all(
        torch.equal(out[k], v) for k, v in hf.state_dict().items())

    tr.forward_backward(make_batch(seed=1, old_noise=0.3, ref_lp=got))
    assert tr.optim_step()["trainer/optim/grad_norm"] > 0
    after = tr.state_dict_hf()
    assert not torch.equal(after["model.layers.0.self_attn.q_proj.bias"],
                           out["model.layers.0.self_attn.q_proj.bias"])
    updated = copy.deepcopy(hf)
    updated.load_state_dict(after, strict=True)
    probe = make_batch(seed=2)
    got2 = tr.compute_logprobs(probe)
    assert (got2 - hf_logprobs(updated, probe.input_ids))[
        probe.response_mask.bool()].abs().max() <= LOGPROB_ATOL
