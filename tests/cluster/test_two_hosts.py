"""The real driver on 2 hosts of a Monarch ``ProcessJob`` : 4 slots, 2 a
host, with real engines and trainer; one GPS actor per host, every trained policy Written
across both hosts and Read back by the slots of either."""

import pytest

from pivot.cluster.config import PlannerCosts, RunConfig
from pivot.cluster.driver import ClusterDriver
from pivot.cluster.group import ClusterGroup
from pivot.rl.data import PromptStream
from pivot.runtime.backend import Backend
from pivot.gin_files import configured, configured_deployment
from pivot.types import POLICY

pytestmark = [pytest.mark.engine, pytest.mark.monarch, pytest.mark.slow]

GROUP = dict(n=2, max_response_tokens=16, max_judge_tokens=16)   # as the shared stack's


def test_pivotrl_trains_on_two_hosts_with_a_gps_actor_on_each(tmp_path):
    group = ClusterGroup(**GROUP, backend=Backend("cpu", hosts=2))
    d = ClusterDriver(group, configured_deployment("pivotrl"),
                      PromptStream(prompts_per_step=2, num_val=4),
                      run_config=RunConfig(steps=3, run_dir=str(tmp_path), eval_every=-1),
                      costs=configured(PlannerCosts))
    try:
        res = d.run()
        ctl, gps = d.stack.ctl, d.stack.source.gps
        assert [ctl.describe(x)["host"] for x in range(4)] == [0, 0, 1, 1]
        assert len(d.stack.source.hosts) == 2
        # every step's Write reached both hosts: each one holds the latest version
        latest = [h.latest(POLICY) for h in gps.hosts]
        assert latest[0] == latest[1] == gps.latest(POLICY) >= 3
        # and slots on both hosts Read it: inference ran on each host
        hosts_used = {ctl.device_map.device_host[x] for s in res.trace
                      for x in s["rollout"] + s["reward"]}
        assert hosts_used == {0, 1}
        assert [m["step"] for m in res.steps] == [1, 2, 3]
        assert any(s["up_role"] == "training" for s in res.shifts)
    finally:
        d.close()
