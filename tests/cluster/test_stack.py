"""The shared ``ClusterStack`` (sec. 5.2): every slot holds a policy engine
and a GenRM engine, started with the stack, each configured from its own model folder and
asleep while its role is not held; shifts never start one."""

import pytest

from pivot.types import GENRM, POLICY, Role

pytestmark = pytest.mark.engine


def test_each_slot_holds_a_policy_and_a_genrm_engine_asleep_when_idle(stack):
    assert {m: c.model for m, c in stack.engine_configs.items()} == {
        POLICY: stack.policy_dir, GENRM: stack.genrm_dir}
    for d in range(stack.group.devices):
        assert set(stack.engine_start_s[d]) == {Role.ROLLOUT.value, Role.REWARD.value}
        if stack.ctl.device_map.replicas():
            continue  # a run left replicas up: the idle check needs an idle stack
        info = stack.ctl.describe(d)
        ctx = info["contexts"]
        assert (ctx["rollout"]["model"], ctx["reward"]["model"]) == (POLICY, GENRM)
        for r in ("rollout", "reward"):
            assert ctx[r]["kv_capacity"] == 0 and not ctx[r]["engine"]["weights_loaded"]


def test_a_shift_wakes_the_role_engine_and_starts_none(stack):
    """Rollout then reward on slot 0: each shift up wakes its own engine (the other one
    stays asleep), and the engines' start times are those of the stack's start."""
    if stack.ctl.device_map.replicas():
        stack.reset()
    sh = stack.ctl.shifter
    starts = {r: c["engine_start_s"] for r, c in stack.ctl.describe(0)["contexts"].items()
              if "engine_start_s" in c}
    for role, other in ((Role.ROLLOUT, "reward"), (Role.REWARD, "rollout")):
        sh.shift_up(role, f"t-{role.value}", (0,))
        ctx = stack.ctl.describe(0)["contexts"]
        assert ctx[role.value]["kv_capacity"] > 0 and ctx[role.value]["weights_loaded"]
        assert ctx[other]["kv_capacity"] == 0 and not ctx[other]["engine"]["weights_loaded"]
        sh.shift_down(f"t-{role.value}")
    after = {r: c["engine_start_s"] for r, c in stack.ctl.describe(0)["contexts"].items()
             if "engine_start_s" in c}
    assert after == starts
