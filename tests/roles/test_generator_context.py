"""The generator as a device slot's rollout/reward context (sec. 5.2): both roles share one
engine; a shift walks the role-shift tables, releases KV and weights, and Reads back."""

import dataclasses

import pytest

from pivot.roles.engine.requests import GenRequest, SampleSpec
from pivot.shifting.contexts import apply_steps
from pivot.shifting.role_shift import shift_down_steps, shift_up_steps
from pivot.types import Role

pytestmark = pytest.mark.engine


def test_rollout_to_reward_shift_swaps_weights_on_one_engine(engine_config, weights, hf):
    from pivot.roles.engine.loop import close_shared_loops
    from pivot.roles.generator import GeneratorContext

    cfg = dataclasses.replace(engine_config, seed=1)  # its own engine, not the fixture's
    try:
        rollout = GeneratorContext(Role.ROLLOUT, cfg)
        reward = GeneratorContext(Role.REWARD, cfg)
        assert rollout.loop is reward.loop
        up = apply_steps(rollout, shift_up_steps(Role.ROLLOUT), lambda: weights[0])
        assert "load_parameters" in up and rollout.describe()["kv_capacity"] == cfg.kv_capacity
        down = apply_steps(rollout, shift_down_steps(Role.ROLLOUT), lambda: None)
        assert set(down) >= {"discard_temporary", "discard_parameters"}
        d = reward.describe()
        assert d["kv_capacity"] == 0 and not d["engine"]["weights_loaded"]
        apply_steps(reward, shift_up_steps(Role.REWARD), lambda: weights[1])
        spec = SampleSpec(max_tokens=12, ignore_eos=True)
        out = reward.loop.submit([GenRequest(1, [1, 5, 6], spec)])
        assert out == [None]
        res = reward.loop.wait([1])[1]
        assert res.tokens == hf.load(weights[1]).greedy([1, 5, 6], 12)
    finally:
        close_shared_loops()
