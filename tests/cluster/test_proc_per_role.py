"""The real driver with a process per role on each slot (``Backend.proc_per_role``, the
``cuda`` layout) run on this machine's CPUs: 2 slots, each a policy
engine process, a GenRM engine process and a trainer process; colocated shifts every role
over both slots, so rollout, reward and FSDP2 training over gloo all cross the routing.
The policy's replica is tensor-parallel over both slots (TP=2 through vLLM's
``external_launcher``, rank 0 mirroring its engine calls to rank 1); the GenRM's replicas
are one slot each."""

from dataclasses import replace
from functools import partial

import pytest

from pivot.config.validation import default_of
from pivot.cluster.config import OptimizerConfig, PlannerCosts, RunConfig
from pivot.cluster.cpu.config import CpuConfig
from pivot.cluster.driver import ClusterDriver
from pivot.cluster.group import ClusterGroup
from pivot.cluster.stack import ClusterStack
from pivot.rl.data import PromptStream
from pivot.gin_files import configured, configured_deployment
from pivot.runtime.backend import Backend
from pivot.planner.baselines import ColocatedPlanner
from pivot.types import Role

pytestmark = [pytest.mark.engine, pytest.mark.monarch, pytest.mark.slow]

GROUP = dict(n=2, max_response_tokens=16, max_judge_tokens=16)   # as the shared stack's


def test_colocated_trains_with_a_tp2_policy_replica_on_slots_of_one_process_per_role(
        tmp_path):
    group = ClusterGroup(**GROUP, devices=2, backend=Backend("cpu", proc_per_role=True),
                       policy_replica_devices=2)
    settings = [default_of(RunConfig, "seed"), default_of(OptimizerConfig, "lr"),
                default_of(CpuConfig, "share")]
    # the TP replica is fixed to its block: every turn places it there (aligned_blocks)
    colocated = replace(configured_deployment("colocated"),
                        planner=partial(ColocatedPlanner, aligned_blocks=True))
    stack, d = ClusterStack(group, *settings).start(), None
    try:
        d = ClusterDriver(group, colocated, PromptStream(prompts_per_step=2, num_val=4),
                          run_config=RunConfig(steps=2, run_dir=str(tmp_path), eval_every=-1),
                          costs=configured(PlannerCosts), stack=stack)
        ctl = stack.ctl
        before = [ctl.describe(x)["pids"] for x in range(2)]
        assert all(len(set(p)) == 3 for p in before)
        res = d.run()
        assert [m["step"] for m in res.steps] == [1, 2]
        assert all(m["tokens"] > 0 and m["batch_tokens"] > 0 for m in res.steps)
        ups = {s["up_role"] for s in res.shifts}
        assert {"rollout", "reward", "training"} <= ups
        # rollout ran as one replica on both slots, reward as a replica per slot
        ro = [s["up"] for s in res.shifts if s["up_role"] == "rollout"]
        assert ro and all(u["devices"] == [0, 1] for up in ro for u in up)
        rm = [u["devices"] for s in res.shifts if s["up_role"] == "reward" for u in s["up"]]
        assert rm and all(len(x) == 1 for x in rm)
        # training ran on both slots' trainer processes: one FSDP2 group of 2
        assert all(m["trainer/world_size"] == 2 for m in res.steps)
        # each engine lives in its own process for the whole run: none restarted
        assert [ctl.describe(x)["pids"] for x in range(2)] == before
        for x in range(2):
            info = ctl.describe(x)
            by_role = {r.value: ctl.slots[x][k].describe.call_one().get()["pid"]
                       for k, r in enumerate(ctl.keys)}
            assert by_role == dict(zip((r.value for r in ctl.keys), before[x]))
            assert set(info["contexts"]) == {Role.ROLLOUT.value, Role.REWARD.value,
                                             Role.TRAINING.value}
            assert info["contexts"]["rollout"]["tp_rank"] == x
            assert info["contexts"]["reward"]["tp_rank"] is None
    finally:
        if d is not None:
            d.close()
        stack.close()
