"""End-to-end smoke runs of the local driver on real engines (vLLM CPU in Monarch slots,
torchtitan trainer, GPS): a few RL steps per deployment, the staleness bound at every
step, n rewarded responses per prompt (asserted by the workflow at every batch), and stop
plus resume continuing at the same step with the same data order.

Each run starts its own 4 slots (about 80 s on 2 cores); they are not shared across tests.
"""

import pytest

from pivot.local.driver import LocalDriver
from pivot.local.group import LocalGroup
from pivot.planner.pivot_planner import PivotPlanner
from pivot.planner.strategies import NoShiftPlanner
from pivot.rl import checkpoint
from pivot.rl.data import PromptStream
from pivot.rl.loop import LoopConfig
from pivot.sim.deployment import Deployment
from pivot.sim.phased import ColocatedPlanner

pytestmark = [pytest.mark.engine, pytest.mark.monarch]

DEPLOYMENTS = {
    "colocated": Deployment("colocated", ColocatedPlanner, 0, -1, 0, False, -1),
    "disaggregated": Deployment("disaggregated", NoShiftPlanner, 2, 2, 1, True),
    "pivotrl": Deployment("pivotrl", PivotPlanner, 2, 3, 1, False),
}


def run(dep, run_dir, steps=3, stop_after=None, resume=False):
    d = LocalDriver(LocalGroup(n=2, max_response_tokens=16, max_judge_tokens=16), dep,
                    PromptStream(prompts_per_step=2, num_val=4),
                    LoopConfig(stop_after=stop_after), steps=steps, run_dir=str(run_dir),
                    resume=resume, eval_every=-1)
    try:
        return d.run()
    finally:
        d.close()


@pytest.mark.parametrize("name", list(DEPLOYMENTS))
def test_each_deployment_trains_a_few_steps_within_the_staleness_bound(name, tmp_path):
    dep = DEPLOYMENTS[name]
    res = run(dep, tmp_path)
    assert [m["step"] for m in res.steps] == [1, 2, 3]
    assert all(m["staleness_max"] <= dep.staleness for m in res.steps)
    assert res.extra["max_staleness"] <= dep.staleness
    assert all(m["tokens"] > 0 for m in res.steps)
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 3
    if name == "pivotrl":
        assert res.shifts, "PivotRL never shifted"
        assert any(s["up_role"] == "training" for s in res.shifts)


def test_a_stopped_run_resumes_at_the_same_step_with_the_same_data(tmp_path):
    dep = DEPLOYMENTS["disaggregated"]
    first = run(dep, tmp_path, steps=3, stop_after=1)
    assert [m["step"] for m in first.steps] == [1]
    state = checkpoint.load(checkpoint.latest(tmp_path))
    assert state["workflow"]["version"] == 1 and state["optimizer"] is not None
    assert set(state["trainer"]["policy"]) and state["allocation"]["training"]
    rest = run(dep, tmp_path, steps=3, resume=True)
    assert [m["step"] for m in rest.steps] == [1, 2, 3]
    # steps 0..2 were released (staleness 2) before the stop; the resumed run draws none
    expected = [r["extra_info"]["question"] for s in range(3)
                for r in PromptStream(prompts_per_step=2, num_val=4).batch(s)]
    assert first.extra["data_order"] == [expected]
    assert rest.extra["data_order"] == []
