"""A slot process SIGKILLed in the middle of a local run (real engines, real Monarch
procs): the run goes on and loses nothing. The dead replica's sequences finish on the
other replica of its role, the slot is replaced by a new process in the background and
serves again (``pivot.cluster.faults``, ``MeshController.replace``)."""

import dataclasses
import json
import os

import pytest

from pivot.cluster.config import PlannerCosts, RunConfig
from pivot.cluster.driver import ClusterDriver
from pivot.cluster.faults import SlotDied, lost_replicas, stopped_by
from pivot.gin_files import configured, configured_deployment, split_bindings
from pivot.runtime.pending import SlotProcessDied
from pivot.reliability.injectors import KillSlotMidRun
from pivot.reliability.cluster_checks import ClusterChecker
from pivot.rl.data import PromptStream
from pivot.rl.loop import LoopConfig
from pivot.shifting.role_shift import SlotKind
from pivot.testing.replicas import generate
from pivot.types import Role

PROMPTS = [[1, 5 + 7 * i, 17 + i, 42 + 3 * i, 9] for i in range(3)]
# Not in the default suite. Killing slots of the session's shared stack left the full
# suite's pytest process to abort at exit ("FATAL: exception not rethrown", exit 134, in 2
# runs of 3), and a pytest process of their own (with a second stack beside the suite's)
# failed once in a full run. Alone they pass: PIVOT_KILL_TESTS=1 pytest -s <this file>.
KILLS = pytest.mark.skipif(os.environ.get("PIVOT_KILL_TESTS") != "1",
                           reason="kills slots: run alone with PIVOT_KILL_TESTS=1 (see the "
                                  "comment above)")
STEPS, PROMPTS_PER_STEP = 4, 4


def split(rollout: int, reward: int, training: int):
    """gin/deployments/disaggregated.gin on this static split."""
    return configured_deployment("disaggregated",
                                 bindings=split_bindings((rollout, reward, training)))


def run_killed(stack, group, dep, killer, prompts: int, steps: int, tmp_path):
    """A run on the shared stack whose observer ``killer`` kills a slot; prints what
    died and how the run dealt with it."""
    d = ClusterDriver(group, dep, PromptStream(prompts_per_step=prompts, num_val=4),
                      LoopConfig(tick_s=0.1, timeout_s=600.0),
                      run_config=RunConfig(steps=steps, run_dir=str(tmp_path / "run"),
                                           eval_every=-1),
                      costs=configured(PlannerCosts), stack=stack, observer=killer)
    try:
        res = d.run()
    finally:
        d.close()
    print(json.dumps({"killed": killer.killed, "deaths": res.extra["slot_deaths"],
                      "steps_lost": res.extra["steps_lost"]}))
    return res


def test_the_replicas_a_death_takes_and_the_error_that_stops_a_run():
    reps = {Role.ROLLOUT: {"rollout-0": (0,)}, Role.REWARD: {"reward-0": (1,),
                                                             "reward-1": (2, 3)},
            Role.TRAINING: {}}
    assert lost_replicas(reps, (3,)) == {"reward-1": (Role.REWARD, (2, 3))}
    assert lost_replicas(reps, (0, 1)) == {"rollout-0": (Role.ROLLOUT, (0,)),
                                           "reward-0": (Role.REWARD, (1,))}
    assert lost_replicas(reps, ()) == {}
    err = stopped_by(SlotProcessDied("slot 3 (c0slot3): its process died"), "runs/x")
    assert isinstance(err, SlotDied)
    assert "RunConfig.resume = True, run folder runs/x" in str(err)
    assert stopped_by(err, "elsewhere") is err


@KILLS
@pytest.mark.engine
@pytest.mark.monarch
@pytest.mark.slow
def test_a_killed_reward_slot_loses_no_sequence_and_is_replaced(stack, tmp_path):
    group = dataclasses.replace(stack.group, max_response_tokens=32, max_judge_tokens=48,
                                ignore_eos=True)
    killer = KillSlotMidRun(ClusterChecker(slot_every=2), Role.REWARD, after_steps=1)
    res = run_killed(stack, group, split(1, 2, 1), killer,
                     PROMPTS_PER_STEP, STEPS, tmp_path)
    k, deaths, c = killer.killed, res.extra["slot_deaths"], res.extra["checks"]
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


@KILLS
@pytest.mark.engine
@pytest.mark.monarch
@pytest.mark.slow
@pytest.mark.parametrize("name", ["disaggregated_1_2_1", "pivotrl", "disaggregated_1_1_2"])
def test_a_killed_training_slot_loses_its_step_which_trains_again(name, stack, tmp_path):
    # the training slot dies as step 2 starts; the driver's AdamW state and GPS hold step
    # 1's, so the batch trains again once training is back: on the replaced slot in a
    # static split, wherever the planner puts it in PivotRL (the replaced slot then
    # returns to the idle pool if training is up elsewhere). Training on 2 slots (1/1/2):
    # rank 0 dies, rank 1 (maybe waiting in the step's all-reduce) is killed with it, and
    # both come back as one replica
    killer = KillSlotMidRun(ClusterChecker(slot_every=2), Role.TRAINING, after_steps=1)
    dep = (configured_deployment(name) if name == "pivotrl" else
           split(*map(int, name.removeprefix("disaggregated_").split("_"))))
    res = run_killed(stack, stack.group, dep, killer, 2, 3, tmp_path)
    k, deaths, c = killer.killed, res.extra["slot_deaths"], res.extra["checks"]
    assert k is not None and k["replica"].startswith("training")
    assert len(deaths) == 1 and deaths[0]["replicas"] == {k["replica"]: "training"}
    width = 2 if name.endswith("_2") else 1
    assert len(deaths[0]["killed"]) == width - 1
    assert deaths[0]["requeued"] == 0
    assert deaths[0]["returned_to"] in (("training",) if name != "pivotrl" else
                                        ("training", "idle", "idle (after the run)"))
    assert res.extra["steps_lost"] == 1
    assert [m["step"] for m in res.steps] == [1, 2, 3]   # each batch trained once
    assert c["violations"] == 0, c["messages"]
    assert c["finished"] == 2 * 3 * 2 * stack.group.n
    assert all(m["trainer/world_size"] == width for m in res.steps)
    assert k["pid"] not in stack.ctl.describe(k["device"])["pids"]

