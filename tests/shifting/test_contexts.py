"""Role contexts in one process: every category's action, with real tensors (sec. 5.2)."""

import pytest
import torch

from pivot.errors import StateError
from pivot.shifting.contexts import apply_steps
from pivot.shifting.role_shift import shift_down_steps, shift_up_steps
from pivot.testing.shifting import (InMemoryParameterSource, InferenceContext, TinyMLP,
                                    TrainingContext)
from pivot.types import POLICY, Role


def policy_state(seed=0):
    torch.manual_seed(seed)
    return TinyMLP((8, 16, 4))().state_dict()


def test_an_inference_context_drops_weights_and_kv_on_shift_down_and_reads_them_back():
    src = InMemoryParameterSource({POLICY: policy_state()})
    ctx = InferenceContext(Role.ROLLOUT, kv_tokens=100, kv_bytes_per_token=8)
    read = lambda: src.read(POLICY, (0,))[0]  # noqa: E731
    up = apply_steps(ctx, shift_up_steps(Role.ROLLOUT), read)
    assert list(up) == ["keep_preserved", "gps_read", "load_parameters", "reload_offloadable",
                        "reallocate_temporary"]
    assert ctx.kv_capacity == 100 and ctx.describe()["kv_bytes"] == 800
    assert all(torch.equal(ctx.weights[k], v) for k, v in policy_state().items())
    down = apply_steps(ctx, shift_down_steps(Role.ROLLOUT), read)
    assert list(down) == ["discard_temporary", "discard_parameters", "offload_offloadable",
                          "keep_preserved"]
    assert ctx.describe() == {"weights_bytes": 0, "kv_bytes": 0, "kv_capacity": 0}


def test_a_shift_down_never_reads_parameters():
    ctx = InferenceContext(Role.REWARD)

    def read():
        raise AssertionError("read on shift down")

    apply_steps(ctx, shift_down_steps(Role.REWARD), read)


def test_training_offload_and_reload_keep_optimizer_state_and_gradients_bit_identical():
    src = InMemoryParameterSource({POLICY: policy_state()})
    ctx = TrainingContext(TinyMLP((8, 16, 4)))
    read = lambda: src.read(POLICY, (0,))[0]  # noqa: E731
    apply_steps(ctx, shift_up_steps(Role.TRAINING), read)
    for s in range(3):
        ctx.train_step(seed=s)
    src.write(POLICY, (0,), None, {0: dict(ctx.weights)})
    opt = {k: v.clone() for k, v in ctx.optimizer_tensors().items()}
    grads = {k: v.clone() for k, v in ctx.gradient_tensors().items()}
    weights = {k: v.clone() for k, v in ctx.weights.items()}
    apply_steps(ctx, shift_down_steps(Role.TRAINING), read)
    assert ctx.optimizer_tensors() == {} and ctx.gradient_tensors() == {}
    assert ctx.describe()["weights_bytes"] == 0 and ctx.describe()["offloaded_bytes"] > 0
    with pytest.raises(StateError, match="training is shifted down"):
        ctx.train_step(seed=0)
    apply_steps(ctx, shift_up_steps(Role.TRAINING), read)
    for got, want in ((ctx.optimizer_tensors(), opt), (ctx.gradient_tensors(), grads),
                      (ctx.weights, weights)):
        assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    # The next step continues exactly as it would have without the shift.
    twin = TrainingContext(TinyMLP((8, 16, 4)))
    twin.load_parameters(policy_state())
    for s in range(3):
        twin.train_step(seed=s)
    assert ctx.train_step(seed=3) == twin.train_step(seed=3)
    assert all(torch.equal(ctx.weights[k], twin.weights[k]) for k in weights)


def test_bad_context_input_is_refused_with_the_field_and_the_fix():
    with pytest.raises(StateError, match="use TrainingContext"):
        InferenceContext(Role.TRAINING)
    with pytest.raises(StateError, match="kv_tokens and kv_bytes_per_token must be > 0"):
        InferenceContext(Role.ROLLOUT, kv_tokens=0)
    ctx = TrainingContext(TinyMLP((8, 16, 4)))
    bad = policy_state()
    bad["0.weight"] = torch.zeros(3, 3)
    with pytest.raises(StateError, match="0.weight has shape \\(3, 3\\), the module expects "
                                         "\\(16, 8\\)"):
        ctx.load_parameters(bad)
    with pytest.raises(StateError, match="parameter names differ"):
        ctx.load_parameters({"x": torch.zeros(1)})
