"""End-to-end smoke runs of the cluster driver on real engines (vLLM CPU in Monarch slots,
torchtitan trainer, GPS), all on the session's one ``ClusterStack``: a few RL steps per
deployment, the staleness bound at every step, n rewarded responses per prompt of every
batch, and stop plus resume continuing at the same step with the same data order."""

import pytest

from pivot.cluster.config import PlannerCosts, RunConfig
from pivot.cluster.driver import ClusterDriver
from pivot.gin_files import configured, configured_deployment, split_bindings
from pivot.rl import checkpoint
from pivot.rl.data import PromptStream
from pivot.rl.loop import LoopConfig

pytestmark = [pytest.mark.engine, pytest.mark.monarch]

PROMPTS = 2
DEPLOYMENTS = ("colocated", "disaggregated", "rr_colocated", "pivotrl")   # sec. 8.2


def run(stack, dep, run_dir, steps=3, stop_after=None, resume=False):
    d = ClusterDriver(stack.group, dep, PromptStream(prompts_per_step=PROMPTS, num_val=4),
                      LoopConfig(stop_after=stop_after),
                      run_config=RunConfig(steps=steps, run_dir=str(run_dir), resume=resume,
                                           eval_every=-1),
                      costs=configured(PlannerCosts), stack=stack)
    try:
        return d.run()
    finally:
        d.close()


@pytest.mark.parametrize("name", DEPLOYMENTS)
def test_each_deployment_trains_a_few_steps_within_the_staleness_bound(name, stack, tmp_path):
    dep = configured_deployment(name)
    pids = [stack.ctl.describe(d)["pid"] for d in range(stack.group.devices)]
    res = run(stack, dep, tmp_path)
    assert [m["step"] for m in res.steps] == [1, 2, 3]
    assert all(m["staleness_max"] <= dep.staleness for m in res.steps)
    assert res.extra["max_staleness"] <= dep.staleness
    assert all(m["tokens"] > 0 for m in res.steps)
    # each batch's rollout and judgement tokens, counted when it trains
    assert all(m["batch_tokens"] > 0 for m in res.steps)
    assert res.steps[-1]["trained_tokens"] == sum(m["batch_tokens"] for m in res.steps)
    assert res.to_dict(trace=False)["throughput"] > 0
    # the trace says which inference device holds how many sequences
    assert all(set(s["device_seqs"]) == {str(d) for d in s["rollout"] + s["reward"]}
               for s in res.trace)
    for m in res.steps:   # every prompt reached training with exactly n rewarded responses
        n = stack.group.n
        assert m["batch/groups"] == {str(i): [n, n] for i in range(PROMPTS)}
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 3
    # the engines fed real lengths back to the schedulers
    assert res.extra["lengths_fed"] > 0
    assert res.extra["sequences_retried"] == 0   # no engine step failed
    # a deployment switch restarts no engine: same slot processes
    assert [stack.ctl.describe(d)["pid"] for d in range(stack.group.devices)] == pids
    if name in ("pivotrl", "colocated", "rr_colocated"):
        assert res.shifts, f"{name} never shifted"
    if name == "pivotrl":
        assert any(s["up_role"] == "training" for s in res.shifts)
    if name == "disaggregated":
        assert not res.shifts
    # training's slots: all of them for colocated (FSDP2 across 4), else the group's 1
    want = stack.group.devices if name == "colocated" else 1
    assert all(m["trainer/world_size"] == want for m in res.steps)


def test_a_stopped_run_resumes_at_the_same_step_with_the_same_data(stack, tmp_path):
    dep = configured_deployment("disaggregated")
    first = run(stack, dep, tmp_path, steps=3, stop_after=1)
    assert [m["step"] for m in first.steps] == [1]
    state = checkpoint.load(checkpoint.latest(tmp_path))
    assert state["workflow"]["version"] == 1 and state["trainer"]["optimizer"] is not None
    assert set(state["trainer"]["policy"]) and state["allocation"]["training"]
    rest = run(stack, dep, tmp_path, steps=3, resume=True)
    assert [m["step"] for m in rest.steps] == [1, 2, 3]
    # steps 0..2 were released (staleness 2) before the stop; the resumed run draws none
    expected = [r["extra_info"]["question"] for s in range(3)
                for r in PromptStream(prompts_per_step=PROMPTS, num_val=4).batch(s)]
    assert first.extra["data_order"] == [expected]
    assert rest.extra["data_order"] == []


@pytest.mark.parametrize("name,training_devices", [("pivotrl", 2), ("disaggregated", 2)])
def test_training_on_two_slots_completes(name, training_devices, stack, tmp_path):
    """Training holds 2 slots (FSDP2 over gloo across them, beside each slot's engines):
    PivotRL shifts it up and down as a whole on 2 slots, disaggregated keeps 2 slots."""
    split = (1, 1, training_devices) if name == "disaggregated" else (
        None, None, training_devices)
    dep = configured_deployment(name, bindings=split_bindings(split))
    res = run(stack, dep, tmp_path)
    assert [m["step"] for m in res.steps] == [1, 2, 3]
    assert all(m["staleness_max"] <= dep.staleness for m in res.steps)
    assert all(m["trainer/world_size"] == 2 for m in res.steps)
    trained = [s for s in res.trace if s["training"]]
    assert trained and all(len(s["training"]) == 2 for s in trained)
    if name == "pivotrl":
        ups = [s for s in res.shifts if s["up_role"] == "training"]
        assert ups and all(len(u["up"][0]["devices"]) == 2 for u in ups)
    # each rank Read only its rows of the policy (FsdpShardLayouts: the tiny policy's 2 KV
    # heads and every dim 0 halve), half the bytes of a full copy each
    ctxs = [c["contexts"]["training"] for c in stack.ctl.describe_all()]
    reads = [c for c in ctxs if c["last_read"] is not None and c["group"] is not None
             and len(c["group"]["devices"]) == 2]
    assert reads and {c["last_read"] for c in reads} == {"rows"}
    assert len({c["read_bytes"] for c in reads}) == 1
