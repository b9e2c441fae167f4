"""The torchtitan trainer (pivot/roles/trainer.py) against Hugging Face transformers.

A tiny random ``Qwen3ForCausalLM`` built by transformers is the outside reference: its
weights go into the trainer through the HF -> torchtitan adapter, and log-probs, weights
and updates are compared in fp32.
"""

import copy
import json

import pytest
import torch
import transformers

from pivot.errors import ConfigError, StateError
from pivot.roles.titan.context import CATEGORIES
from pivot.roles.titan.model import Qwen3Shape
from pivot.rl.batch import TrainBatch

LOGPROB_ATOL = 1e-5  # fp32, same maths in a different order


@pytest.fixture(scope="module")
def hf(hf_model):
    return hf_model()


@pytest.mark.parametrize("tie", [False, True])
def test_trainer_logprobs_equal_transformers_in_fp32(
        tie, hf_model, hf_logprobs, make_batch, make_trainer):
    model = hf_model(tie=tie)
    tr = make_trainer(model)
    batch = make_batch()
    got = tr.compute_logprobs(batch)
    want = hf_logprobs(model, batch.input_ids)
    assert got.shape == batch.input_ids.shape
    diff = (got - want)[batch.response_mask.bool()].abs().max()
    assert diff <= LOGPROB_ATOL, f"max |trainer - transformers| = {diff:.2e}"


@pytest.mark.parametrize("tie", [False, True])
def test_hf_state_dict_round_trips_exactly(tie, hf_model, make_trainer):
    model = hf_model(tie=tie)
    tr = make_trainer(model)
    out = tr.state_dict_hf()
    ref = model.state_dict()
    if tie:
        ref = {k: v for k, v in ref.items() if k != "lm_head.weight"}
    assert set(out) == set(ref)
    for k in ref:
        assert torch.equal(out[k], ref[k]), k


def test_after_a_step_the_new_weights_give_the_trainers_logprobs_in_transformers(
        hf, hf_logprobs, make_batch, make_trainer):
    tr = make_trainer(hf)
    before = tr.state_dict_hf()
    lp0 = tr.compute_logprobs(make_batch())
    batch = make_batch(seed=1, old_noise=0.3, ref_lp=lp0)
    m = tr.forward_backward(batch)
    assert m["trainer/fb/clip_frac"] > 0  # the noisy old log-probs exercise the clip
    s = tr.optim_step()
    assert s["trainer/optim/version"] == 1 and s["trainer/optim/grad_norm"] > 0
    after = tr.state_dict_hf()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) == len(before), f"unchanged: {set(before) - set(changed)}"
    updated = copy.deepcopy(hf)
    updated.load_state_dict(after, strict=True)
    probe = make_batch(seed=2)
    got = tr.compute_logprobs(probe)
    want = hf_logprobs(updated, probe.input_ids)
    assert (got - want)[probe.response_mask.bool()].abs().max() <= LOGPROB_ATOL
    assert not torch.allclose(got, lp0)


def test_on_policy_batches_have_ratio_one_and_no_clipping(hf, make_batch, make_trainer):
    tr = make_trainer(hf)
    m = tr.forward_backward(make_batch())
    assert m["trainer/fb/ratio_mean"] == pytest.approx(1.0)
    assert m["trainer/fb/clip_frac"] == 0.0


def test_offload_then_reload_is_bit_identical_and_the_next_step_matches(
        hf, make_batch, make_trainer):
    a, b = make_trainer(hf), make_trainer(hf)
    batches = [make_batch(seed=s) for s in (3, 4)]
    for tr in (a, b):
        tr.forward_backward(batches[0])
        tr.optim_step()
    state = [t.clone() for st in a.optimizer.state.values() for t in st.values()]
    a.forward_backward(batches[1])  # gradients pending: they are offloaded too
    grads = [p.grad.clone() for p in a.model.parameters()]
    off = a.offload()
    assert off["trainer/offload/bytes"] > 0
    assert all(t.untyped_storage().nbytes() == 0 for st in a.optimizer.state.values()
               for t in st.values())
    with pytest.raises(StateError, match="reload"):
        a.forward_backward(batches[1])
    back = a.reload()
    assert back["trainer/reload/bytes"] == off["trainer/offload/bytes"]
    after = [t for st in a.optimizer.state.values() for t in st.values()]
    assert all(torch.equal(x, y) for x, y in zip(state, after))
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, a.model.parameters()))
    a.optim_step()
    b.forward_backward(batches[1])
    b.optim_step()
    sa, sb = a.state_dict_hf(), b.state_dict_hf()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_released_parameters_come_back_from_a_gps_read(hf, make_batch, make_trainer):
    tr = make_trainer(hf)
    weights = tr.state_dict_hf()
    lp = tr.compute_logprobs(make_batch())
    freed = tr.release_parameters()["trainer/release/bytes"]
    assert freed == 4 * sum(p.numel() for p in tr.model.parameters())
    assert all(p.untyped_storage().nbytes() == 0 for p in tr.model.parameters())
    with pytest.raises(StateError, match="load_hf_state_dict"):
        tr.compute_logprobs(make_batch())
    tr.load_hf_state_dict(weights)
    assert torch.equal(tr.compute_logprobs(make_batch()), lp)


def test_context_items_describe_the_role_by_category(hf, make_batch, make_trainer):
    tr = make_trainer(hf)
    tr.forward_backward(make_batch())
    tr.optim_step()
    items = {name: (cat, n) for name, cat, n in tr.context_items()}
    assert {cat for cat, _ in items.values()} == set(CATEGORIES)
    params = items["model.parameters"][1]
    assert params == 4 * sum(p.numel() for p in tr.model.parameters())
    assert items["optimizer.state"][1] >= 2 * params  # exp_avg + exp_avg_sq (+ steps)
    assert items["activations"][1] > 0
    assert items["model.parameters"][0] == "parameters"
    assert items["optimizer.state"][0] == items["gradients"][0] == "offloadable"


def test_the_shape_is_read_from_a_saved_config_folder(tmp_path, tiny_qwen3):
    transformers.Qwen3Config(**tiny_qwen3).save_pretrained(tmp_path)
    shape = Qwen3Shape.from_hf(tmp_path)
    assert (shape.hidden_size, shape.num_hidden_layers, shape.head_dim) == (64, 2, 32)
    assert shape.rope_theta == 1e6 and shape.vocab_size == 512


def test_unsupported_configs_name_the_field(tmp_path, tiny_qwen3):
    cfg = transformers.Qwen3Config(**tiny_qwen3).to_dict()
    with pytest.raises(ConfigError, match="attention_bias"):
        Qwen3Shape.from_hf({**cfg, "attention_bias": True})
    with pytest.raises(ConfigError, match="hidden_size"):
        Qwen3Shape.from_hf({k: v for k, v in cfg.items() if k != "hidden_size"})
    with pytest.raises(ConfigError, match="config.json"):
        Qwen3Shape.from_hf(tmp_path / "nowhere")
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    with pytest.raises(ConfigError, match="model_type"):
        Qwen3Shape.from_hf(tmp_path)


def test_bad_batches_and_weights_are_rejected_with_the_field_named(hf, make_batch, make_trainer):
    tr = make_trainer(hf)
    good = make_batch()
    bad = TrainBatch(good.input_ids, good.response_mask, good.advantages[:3])
    with pytest.raises(ValueError, match="advantages"):
        tr.forward_backward(bad)
    too_big = TrainBatch(good.input_ids + 10_000, good.response_mask, good.advantages)
    with pytest.raises(ValueError, match="vocabulary"):
        tr.compute_logprobs(too_big)
    with pytest.raises(ValueError, match=r"response_mask\[:, 0\]"):
        mask = good.response_mask.clone()
        mask[:, 0] = 1
        tr.forward_backward(TrainBatch(good.input_ids, mask, good.advantages))
    sd = dict(hf.state_dict())
    sd.pop("model.norm.weight")
    with pytest.raises(StateError, match="norm.weight"):
        tr.load_hf_state_dict(sd)
    with pytest.raises(StateError, match="no gradients"):
        tr.optim_step()


def test_accumulating_two_half_batches_with_the_global_token_count_equals_one_batch(
        hf, make_batch, make_trainer):
    a, b = make_trainer(hf), make_trainer(hf)
    batch = make_batch(seed=9)
    n = batch.num_response_tokens
    a.forward_backward(batch)
    a.optim_step()
    for half in (slice(0, 4), slice(4, 8)):
        b.forward_backward(batch.rows(half), num_tokens=n)
    b.optim_step()
    sa, sb = a.state_dict_hf(), b.state_dict_hf()
    assert max(float((sa[k] - sb[k]).abs().max()) for k in sa) <= 5e-5  # 5% of one lr step
