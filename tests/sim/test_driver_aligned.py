"""The sim driver with the planner's aligned blocks: the provisioning
and every shift the executor carries out put each replica on an aligned block of one
host, through the real executor and device map."""

from functools import partial

import pytest

from pivot.errors import ConfigError
from pivot.planner import PivotPlanner
from pivot.planner.blocks import is_aligned
from pivot.shifting.device_map import replay
from pivot.shifting.role_shift import Transition
from pivot.spec.deployment import Deployment
from pivot.sim.driver import SimDriver
from pivot.types import INFERENCE_ROLES

ALIGNED = Deployment("pivotrl_aligned", partial(PivotPlanner, aligned_blocks=True),
                     training_home=False, rollout_devices=2, reward_devices=8)


def placed_replicas(dm) -> dict[str, tuple]:
    """Every inference replica the device map ever made active: id -> (role, devices)."""
    out: dict[str, tuple] = {}
    for e in dm.events:
        if e.transition is Transition.END_UP and e.after.role in INFERENCE_ROLES:
            role, devs = out.get(e.after.replica_id, (e.after.role, ()))
            out[e.after.replica_id] = (role, devs + (e.device,))
    return out


def test_every_replica_the_sim_places_is_an_aligned_block(make_group):
    # 16 devices on 2 hosts of 8; policy replicas of 1, GenRM replicas of 4. Unaligned,
    # the sim would provision rollout on 0-1 and one GenRM replica on 2-5, off its block.
    d = SimDriver(make_group(), ALIGNED, steps=3, seed=2)
    result = d.run()
    replay(d.device_map.device_host, d.device_map.events)
    placed = placed_replicas(d.device_map)
    shifted_up = [s for s in d.tracer.shifts if s["up_role"] != "training"]
    assert shifted_up, "the planner never shifted an inference role up"
    sizes = {role: d.shapes[role].replica_devices for role in INFERENCE_ROLES}
    assert {len(devs) for _, devs in placed.values()} == {1, 4}
    for rid, (role, devs) in placed.items():
        assert is_aligned(devs, d.device_map.device_host, sizes[role]), (rid, devs)
    assert result.throughput > 0


def test_a_replica_larger_than_a_host_is_refused_before_the_run(make_group):
    with pytest.raises(ConfigError, match="reward replica needs 4 devices"):
        SimDriver(make_group(devices_per_host=2), ALIGNED, steps=2, seed=0)
