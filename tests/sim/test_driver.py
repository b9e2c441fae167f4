"""End-to-end properties of the sim driver: conservation, determinism, exclusive devices."""

import pytest

from pivot.planner import NoShiftPlanner, PivotPlanner
from pivot.shifting.device_map import replay
from pivot.spec.deployment import Deployment
from pivot.sim.driver import SimDriver
from pivot.planner.baselines import ColocatedPlanner, RolloutRewardColocatedPlanner

DEPLOYMENTS = [
    Deployment("disaggregated", NoShiftPlanner, rollout_devices=4, reward_devices=8),
    Deployment("colocated", ColocatedPlanner, staleness=0, training_home=False,
               training_devices=-1),
    Deployment("rr_colocated", RolloutRewardColocatedPlanner),
    Deployment("pivotrl", PivotPlanner, training_home=False, rollout_devices=8,
               reward_devices=8),
]


@pytest.mark.parametrize("dep", DEPLOYMENTS, ids=lambda d: d.name)
def test_work_is_conserved(dep, make_group):
    d = SimDriver(make_group(), dep, steps=3, seed=1)
    res = d.run()
    wf = d.workflow
    responses = [it for sid, it in wf.items.items() if sid == it.response_id]
    assert len(responses) == 3 * 8 * 4
    assert all(it.rewarded and it.judge_id is not None for it in responses)
    # every token decoded exactly once: aborts keep tokens, only re-prefill repeats work
    assert res.generated_tokens == res.expected_tokens
    for s in d.schedulers.values():
        s.check()


def test_runs_are_deterministic_for_a_seed(make_group):
    dep = DEPLOYMENTS[3]
    a = SimDriver(make_group(), dep, steps=3, seed=7).run()
    b = SimDriver(make_group(), dep, steps=3, seed=7).run()
    c = SimDriver(make_group(), dep, steps=3, seed=8).run()
    assert a.throughput == b.throughput and a.shift_log == b.shift_log
    assert a.throughput != c.throughput


@pytest.mark.parametrize("dep", DEPLOYMENTS[1:], ids=lambda d: d.name)
def test_shifts_never_give_a_device_to_two_roles(dep, make_group):
    d = SimDriver(make_group(), dep, steps=3, seed=2)
    d.run()
    assert d.tracer.shifts or dep.name == "disaggregated"
    replay(d.device_map.device_host, d.device_map.events)  # every transition valid
    # at no instant is a device active in two replicas: replay state by state
    owner = {}
    for e in d.device_map.events:
        if e.after.kind.value == "active":
            assert owner.get(e.device) is None, f"device {e.device} given twice"
            owner[e.device] = e.after.replica_id
        elif e.before.kind.value == "active":
            owner[e.device] = None
    # virtual time: a new replica decodes only after its devices were freed
    for rep in d.cluster.replicas.values():
        assert rep.busy_until >= max(d.cluster.free_at.get(x, 0.0) for x in rep.devices)
