"""A slot process SIGKILLed in the middle of a local run (real engines, real Monarch
procs): the run goes on and loses nothing. The dead replica's sequences finish on the
other replica of its role, the slot is replaced by a new process in the background and
serves again (``pivot.local.faults``, ``MeshController.replace``)."""

import dataclasses
import json

import pytest

from pivot.local.deployments import split_deployment
from pivot.local.driver import LocalDriver
from pivot.local.faults import SlotDied, lost_replicas, stopped_by
from pivot.runtime.pending import SlotProcessDied
from pivot.reliability.injectors import KillSlotMidRun
from pivot.reliability.local_checks import LocalChecker
from pivot.rl.data import PromptStream
from pivot.rl.loop import LoopConfig
from pivot.shifting.role_shift import SlotKind
from pivot.testing.replicas import generate
from pivot.types import Role

PROMPTS = [[1, 5 + 7 * i, 17 + i, 42 + 3 * i, 9] for i in range(3)]
STEPS, PROMPTS_PER_STEP = 4, 4


def test_the_replicas_a_death_takes_and_the_error_that_stops_a_run():
    reps = {Role.ROLLOUT: {"rollout-0": (0,)}, Role.REWARD: {"reward-0": (1,),
                                                             "reward-1": (2, 3)},
            Role.TRAINING: {}}
    assert lost_replicas(reps, (3,)) == {"reward-1": (Role.REWARD, (2, 3))}
    assert lost_replicas(reps, (0, 1)) == {"rollout-0": (Role.ROLLOUT, (0,)),
                                           "reward-0": (Role.REWARD, (1,))}
    assert lost_replicas(reps, ()) == {}
    err = stopped_by(SlotProcessDied("slot 3 (c0slot3): its process died"), "runs/x")
    assert isinstance(err, SlotDied) and "LocalDriver.resume = True, run folder runs/x" in str(err)
    assert stopped_by(err, "elsewhere") is err


@pytest.mark.engine
@pytest.mark.monarch
@pytest.mark.slow
def test_a_killed_reward_slot_loses_no_sequence_and_is_replaced(stack, tmp_path):
    group = dataclasses.replace(stack.group, max_response_tokens=32, max_judge_tokens=48,
                                ignore_eos=True)
    killer = KillSlotMidRun(LocalChecker(slot_every=2), Role.REWARD, after_steps=1)
    d = LocalDriver(group, split_deployment("disaggregated_1_2_1"),
                    PromptStream(prompts_per_step=PROMPTS_PER_STEP, num_val=4),
                    LoopConfig(tick_s=0.1, timeout_s=600.0), steps=STEPS,
                    run_dir=str(tmp_path / "run"), eval_every=-1, stack=stack,
                    observer=killer)
    try:
        res = d.run()
    finally:
        d.close()
    k, deaths, c = killer.killed, res.extra["slot_deaths"], res.extra["checks"]
    print(json.dumps({"killed": k, "deaths": deaths}))
    assert k is not None, "no reward replica ever had sequences running after step 1"
    assert len(deaths) == 1
    death = deaths[0]
    assert death["devices"] == [k["device"]] and death["replicas"] == {k["replica"]: "reward"}
    # what ran on the dead engine went back to the queue and finished on the other one
    assert death["requeued"] >= k["running"] >= 1
    assert c["violations"] == 0, c["messages"]
    assert [m["step"] for m in res.steps] == list(range(1, STEPS + 1))
    assert c["finished"] == 2 * STEPS * PROMPTS_PER_STEP * group.n   # each exactly once
    # the slot was replaced by a new process and is back (in reward, or idle if the run
    # ended first); it serves like any other slot
    assert death["replaced_s"] is not None or death["returned_to"] == "idle (after the run)"
    assert death["returned_to"] in ("reward", "idle (after the run)")
    dev, ctl = k["device"], stack.ctl
    assert ctl.device_map.state(dev).kind is not SlotKind.LOST and dev not in ctl.dead
    stack.reset()
    assert k["pid"] not in ctl.describe(dev)["pids"]
    other = next(x for x in range(group.devices) if x != dev)
    sh = ctl.shifter
    for x in (dev, other):
        sh.shift_up(Role.REWARD, f"after-{x}", (x,))
    try:
        assert generate(ctl, dev, PROMPTS) == generate(ctl, other, PROMPTS)
    finally:
        for x in (dev, other):
            sh.shift_down(f"after-{x}")


@pytest.mark.engine
@pytest.mark.monarch
@pytest.mark.slow
def test_a_killed_training_slot_stops_the_run_which_resumes_from_its_checkpoint(
        stack, tmp_path):
    # training's step in flight and its FSDP2 rank die with the slot: the run stops with
    # an error that says how to go on, and the resumed run trains every step once
    dep = split_deployment("disaggregated_1_2_1")
    stream = PromptStream(prompts_per_step=2, num_val=4)
    killer = KillSlotMidRun(LocalChecker(slot_every=0), Role.TRAINING, after_steps=1)
    run_dir = tmp_path / "run"

    def driver(**kw):
        return LocalDriver(stack.group, dep, stream, LoopConfig(tick_s=0.1, timeout_s=600.0),
                           steps=3, run_dir=str(run_dir), eval_every=-1, stack=stack, **kw)
    d = driver(observer=killer)
    try:
        with pytest.raises(SlotDied, match="resume .* from its last checkpoint"):
            d.run()
    finally:
        d.close()
    assert killer.killed is not None and killer.killed["replica"].startswith("training")
    done = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    d = driver(resume=True)   # its stack reset replaces the dead slot first
    try:
        res = d.run()
    finally:
        d.close()
    assert done and [m["step"] for m in res.steps] == list(range(1, 4))
    assert killer.killed["pid"] not in stack.ctl.describe(killer.killed["device"])["pids"]
