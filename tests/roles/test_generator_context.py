"""The generator as a device slot's rollout/reward context (sec. 5.2): each role has its
own model's engine, started once; a shift walks the role-shift tables, putting one engine
to sleep (KV cache and weights released) and waking the other (weights Read back)."""

import pytest

from pivot.roles.engine.requests import GenRequest, SampleSpec
from pivot.shifting.contexts import apply_steps
from pivot.shifting.role_shift import shift_down_steps, shift_up_steps
from pivot.testing.engine import poisoned_heap
from pivot.types import Role

pytestmark = pytest.mark.engine

PROMPT = [1, 5, 6]
SPEC = SampleSpec(max_tokens=12, ignore_eos=True)


def greedy(ctx, seq_id: int) -> list[int]:
    assert ctx.loop.submit([GenRequest(seq_id, PROMPT, SPEC)]) == [None]
    return ctx.loop.wait([seq_id])[seq_id].tokens


def test_a_rollout_to_reward_shift_sleeps_one_engine_and_wakes_the_other(
        slot_pair, weights, genrm_weights, hf, hf_genrm):
    from pivot.roles.engine.loop import shared_engines

    rollout, reward = slot_pair
    engines = shared_engines()
    assert rollout.loop is not reward.loop and rollout.model != reward.model
    assert reward.loop.engine.cfg.max_model_len == 256  # its own config, not the policy's
    for ctx in slot_pair:  # both asleep from their build on
        d = ctx.describe()
        assert d["kv_capacity"] == 0 and not d["engine"]["weights_loaded"]
    up = apply_steps(rollout, shift_up_steps(Role.ROLLOUT), lambda: weights[0])
    assert "load_parameters" in up and rollout.describe()["kv_capacity"] == rollout.cfg.kv_capacity
    assert greedy(rollout, 1) == hf.load(weights[0]).greedy(PROMPT, 12)
    down = apply_steps(rollout, shift_down_steps(Role.ROLLOUT), lambda: None)
    assert set(down) >= {"discard_temporary", "discard_parameters"}
    assert rollout.describe()["kv_capacity"] == 0
    apply_steps(reward, shift_up_steps(Role.REWARD), lambda: genrm_weights[0])
    assert greedy(reward, 2) == hf_genrm.load(genrm_weights[0]).greedy(PROMPT, 12)
    apply_steps(reward, shift_down_steps(Role.REWARD), lambda: None)
    assert shared_engines() == engines  # no engine started or replaced by a shift


def test_a_weight_swap_is_served_even_when_the_heap_hands_back_nan(
        slot_pair, weights, genrm_weights, hf_genrm):
    """The reward engine once decoded only token 0 after a swap. Cause:
    ``UntypedStorage.resize_`` re-allocates the released KV cache with whatever the heap
    holds; a NaN in a KV slot past the sequence's length enters masked attention as
    0 x NaN, the logits turn NaN and greedy picks token 0. ``StorageSet.restore`` zero-fills;
    here the heap hands out NaN bytes during every shift up (``poisoned_heap``), so the
    test fails on every swap without the zero-fill, not once in many suites."""
    rollout, reward = slot_pair
    want = [hf_genrm.load(w).greedy(PROMPT, 12) for w in genrm_weights]
    for i in range(4):
        with poisoned_heap():
            apply_steps(rollout, shift_up_steps(Role.ROLLOUT), lambda: weights[i % 2])
        apply_steps(rollout, shift_down_steps(Role.ROLLOUT), lambda: None)
        with poisoned_heap():
            apply_steps(reward, shift_up_steps(Role.REWARD), lambda: genrm_weights[i % 2])
        got = greedy(reward, 100 + i)
        apply_steps(reward, shift_down_steps(Role.REWARD), lambda: None)
        assert got == want[i % 2], f"swap {i}: the reward engine decoded {got}"
