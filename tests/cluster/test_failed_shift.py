"""A shift up that fails half-way (a fault injected into a real slot's GPS Read) is rolled
back in its slot: the device, marked lost, goes back to the idle pool without a reset or
an engine restart and serves as before; a run whose shifts fail goes on and loses nothing
(``SlotActor._roll_back``, ``MeshController.restore``, ``ClusterControl._survive``)."""

import dataclasses
import json

import pytest

from pivot.cluster.config import FaultBudget, PlannerCosts, RunConfig
from pivot.gin_files import configured, configured_deployment
from pivot.cluster.driver import ClusterDriver
from pivot.reliability.injectors import ReadFaultsAfterStart
from pivot.reliability.cluster_checks import ClusterChecker
from pivot.rl.data import PromptStream
from pivot.rl.loop import LoopConfig
from pivot.shifting.role_shift import SlotKind
from pivot.shifting.shifter import ShiftError
from pivot.testing.replicas import generate
from pivot.types import Role

pytestmark = [pytest.mark.engine, pytest.mark.monarch]

PROMPTS = [[1, 5 + 7 * i, 17 + i, 42 + 3 * i, 9] for i in range(3)]


def test_a_rolled_back_shift_up_returns_its_device_to_idle_without_a_reset(stack):
    stack.reset()
    ctl, sh = stack.ctl, stack.ctl.shifter
    pid = ctl.describe(3)["pids"]
    ctl.actor(3, Role.REWARD).inject_fault.call_one(Role.REWARD, 0).get()
    with pytest.raises(ShiftError, match="injected fault in the GPS Read of reward"):
        sh.shift_up(Role.REWARD, "fails", (3,))
    assert ctl.device_map.state(3).kind is SlotKind.LOST
    with pytest.raises(Exception, match="device 3 is lost"):
        ctl.describe(3)
    assert ctl.restore((3,)) == (3,)
    assert ctl.device_map.state(3).kind is SlotKind.IDLE
    info = ctl.describe(3)
    assert info["pids"] == pid and info["role"] is None
    assert info["failed_shift"]["clean"] and "InjectedFault" in info["failed_shift"]["error"]
    rm = info["contexts"]["reward"]
    assert rm["kv_capacity"] == 0 and not rm["weights_loaded"]   # nothing left half-up
    # it serves as a slot that never failed: greedy tokens equal slot 2's
    for d in (2, 3):
        sh.shift_up(Role.REWARD, f"ok-{d}", (d,))
    try:
        assert generate(ctl, 3, PROMPTS) == generate(ctl, 2, PROMPTS)
        assert ctl.describe(3)["failed_shift"] is None
    finally:
        for d in (2, 3):
            sh.shift_down(f"ok-{d}")


def test_a_run_whose_shifts_fail_goes_on_and_loses_nothing(stack, tmp_path):
    """Forced shifts every tick, with every slot's first shift up to reward after the
    first tick failing in its Read: each failed plan's devices come back to the pool and
    the run trains every step on every sequence."""
    group = dataclasses.replace(stack.group, max_response_tokens=32, max_judge_tokens=24,
                                ignore_eos=True)
    checker = ReadFaultsAfterStart(ClusterChecker(slot_every=2), Role.REWARD)
    d = ClusterDriver(group, configured_deployment("forced_shifts"),
                      PromptStream(prompts_per_step=2, num_val=4),
                      LoopConfig(tick_s=0.1, timeout_s=300.0),
                      run_config=RunConfig(steps=3, run_dir=str(tmp_path / "run"),
                                           eval_every=-1),
                      costs=configured(PlannerCosts), faults=FaultBudget(max_shift_failures=4),
                      stack=stack, observer=checker)
    try:
        res = d.run()
    finally:
        d.close()
    failed, c = res.extra["failed_shifts"], res.extra["checks"]
    print(json.dumps({"failed": [{k: v for k, v in f.items() if k != "error"}
                                 for f in failed], "shifts": len(res.shifts)}))
    assert failed and all(f["stage"] == "shift_up" and f["up_role"] == "reward"
                          and f["cause"].startswith("pivot.runtime.slot.InjectedFault: slot")
                          for f in failed), [f["cause"] for f in failed]
    assert all(f["restored"] == f["lost"] for f in failed), failed
    assert c["violations"] == 0, c["messages"]
    assert [m["step"] for m in res.steps] == [1, 2, 3]
    assert c["finished"] == 2 * 3 * 2 * group.n   # each response and judgement once
    assert not res.trace[-1]["lost"]
    # the faults no shift met were disarmed: the shared stack's next run meets none
    met = sum(len(f["lost"]) for f in failed)
    assert checker.left == group.devices - met and stack.ctl.disarm_faults() == 0
    assert sum(s["failed"] is not None for s in res.shifts) == len(failed)
