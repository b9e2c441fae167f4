"""Random forced shifts on the cluster driver (the reliability run): vLLM CPU engines in
Monarch slots, torchtitan trainer, GPS, on the session's one ``ClusterStack``.

A random rollout <-> reward shift at every planner tick (gin/deployments/forced_shifts.gin),
training up when its batch is ready and down when idle, and the ``ClusterChecker`` after
every tick and poll: no sequence lost or duplicated, staleness <= 2, a device in one role
at a time (in the device map and in the slots themselves), KV capacity never exceeded, and
every resumed sequence's tokens starting with the tokens it had when it was aborted."""

import dataclasses
import json
import time

import pytest

from pivot.cluster.config import PlannerCosts, RunConfig
from pivot.cluster.driver import ClusterDriver
from pivot.cluster.group import ClusterGroup
from pivot.gin_files import configured, configured_deployment
from pivot.reliability.cluster_checks import ClusterChecker
from pivot.rl.data import PromptStream
from pivot.rl.loop import LoopConfig
from pivot.runtime.backend import Backend

pytestmark = [pytest.mark.engine, pytest.mark.monarch]

PROMPTS = 2
STEPS = 3
TICK_S = 0.1     # ~12 ticks in the ~1.2-s run: >= 4 forced shifts on any machine speed
RESPONSE_TOKENS = 48   # tiny_cpu.gin's cap, every response run to it (ignore_eos: the
JUDGE_TOKENS = 32      # policy stops after ~5 tokens), so shifts land mid-generation


def test_forced_shifts_every_tick_keep_every_invariant(stack, tmp_path):
    pids = [stack.ctl.describe(d)["pid"] for d in range(stack.group.devices)]
    checker = ClusterChecker(slot_every=2)
    # generation lengths are per run: the shared stack (16-token caps) serves longer ones
    group = dataclasses.replace(stack.group, max_response_tokens=RESPONSE_TOKENS,
                                max_judge_tokens=JUDGE_TOKENS, ignore_eos=True)
    dep = configured_deployment("forced_shifts")
    d = ClusterDriver(group, dep, PromptStream(prompts_per_step=PROMPTS, num_val=4),
                      LoopConfig(tick_s=TICK_S, timeout_s=300.0),
                      run_config=RunConfig(steps=STEPS, run_dir=str(tmp_path / "run"),
                                           eval_every=-1),
                      costs=configured(PlannerCosts), stack=stack, observer=checker)
    t0 = time.perf_counter()
    try:
        res = d.run()
    finally:
        d.close()
    wall = time.perf_counter() - t0
    c = res.extra["checks"]
    forced = [s for s in res.shifts if s["reason"] == "forced shift"]
    figures = {"wall_s": wall, "loop_s": res.steps[-1]["time_s"], "shifts": len(res.shifts),
               "forced_shifts": len(forced),
               "training_ups": sum(s["up_role"] == "training" for s in res.shifts),
               "reasons": sorted({s["reason"] for s in res.shifts}),
               "migration": res.extra["migration"], "max_staleness": res.extra["max_staleness"],
               "checks": {k: v for k, v in c.items() if k != "messages"}}
    (tmp_path / "forced_shifts.json").write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures))

    assert c["violations"] == 0, c["messages"]
    assert [m["step"] for m in res.steps] == list(range(1, STEPS + 1))
    n = stack.group.n
    for m in res.steps:   # every prompt reached training with exactly n rewarded responses
        assert m["batch/groups"] == {str(i): [n, n] for i in range(PROMPTS)}
        assert m["staleness_max"] <= dep.staleness
    assert res.extra["max_staleness"] <= 2
    # every response ran to its cap across its dispatches: none cut short, none past it
    assert all(m["rollout/response_len_mean"] == RESPONSE_TOKENS for m in res.steps)
    # shifts happened every few ticks, rollout <-> reward and training's own
    assert len(forced) >= 4, figures
    assert {s["up_role"] for s in forced} == {"rollout", "reward"}, figures
    assert any(s["up_role"] == "training" for s in res.shifts)
    # sequences were aborted mid-generation and finished elsewhere with their prefix intact
    assert res.extra["migration"]["aborted"] >= 1
    assert c["aborted_with_tokens"] >= 1 and c["resumed"] >= 1, figures
    # the checks ran: every tick and poll, the slots' own roles, every finished sequence
    assert c["checks"]["tick"] >= len(res.shifts) and c["checks"]["poll"] > c["checks"]["tick"]
    assert c["checks"]["end"] == 1 and c["slot_checks"] >= 2
    assert c["finished"] == 2 * STEPS * PROMPTS * n   # each response and judgement once
    assert c["prefix_checks"] >= c["finished"] + c["aborts"]
    # a shift restarts no engine: the same slot processes
    assert [stack.ctl.describe(d)["pid"] for d in range(stack.group.devices)] == pids


@pytest.mark.slow
def test_forced_shifts_with_tp2_policy_replicas_keep_every_invariant(tmp_path):
    """The same on a stack of its own with a process per role and the policy as TP=2
    replicas on aligned blocks of slots (gin/tiny_cpu_tp2.gin): a forced shift into rollout
    takes a whole block, shifting down as many GenRM slots as it holds."""
    group = ClusterGroup(n=2, max_response_tokens=RESPONSE_TOKENS, max_judge_tokens=JUDGE_TOKENS,
                       ignore_eos=True, policy_replica_devices=2,
                       backend=Backend("cpu", proc_per_role=True))
    # aligned blocks for the planner, PivotRL's first split of one policy block
    dep = configured_deployment("forced_shifts",
                                group=("gin/tiny_cpu.gin", "gin/tiny_cpu_tp2.gin"))
    assert dep.planner.keywords == {"aligned_blocks": True}
    assert (dep.rollout_devices, dep.reward_devices) == (2, 2)
    checker = ClusterChecker(slot_every=2)
    d = ClusterDriver(group, dep, PromptStream(prompts_per_step=PROMPTS, num_val=4),
                      LoopConfig(tick_s=TICK_S, timeout_s=900.0),
                      run_config=RunConfig(steps=STEPS, run_dir=str(tmp_path / "run"),
                                           eval_every=-1),
                      costs=configured(PlannerCosts), observer=checker)
    try:
        res = d.run()
    finally:
        d.close()
    c = res.extra["checks"]
    ups = [(s["up_role"], len(u["devices"])) for s in res.shifts for u in s["up"]]
    print(json.dumps({"shifts": len(res.shifts), "ups": ups,
                      "checks": {k: v for k, v in c.items() if k != "messages"}}))
    assert c["violations"] == 0, c["messages"]
    assert [m["step"] for m in res.steps] == list(range(1, STEPS + 1))
    assert res.extra["max_staleness"] <= 2
    assert c["finished"] == 2 * STEPS * PROMPTS * group.n
    # the TP=2 rollout replica came up by a forced shift, and GenRM slots did too
    assert any(s["up_role"] == "rollout" and s["reason"].startswith("forced")
               and [len(u["devices"]) for u in s["up"]] == [2] for s in res.shifts), ups
    assert any(s["up_role"] == "reward" and s["reason"].startswith("forced")
               for s in res.shifts), ups
