"""A deployment that cannot make progress fails fast with a clear message."""

import time

import pytest

from pivot.errors import ConfigError
from pivot.planner import NoShiftPlanner
from pivot.sim.deployment import Deployment
from pivot.sim.driver import SimDriver


def test_reward_without_devices_fails_fast(make_group):
    # every inference device goes to rollout: GenRM judgements can never run
    dep = Deployment("no_reward", NoShiftPlanner, rollout_devices=-1, reward_devices=0)
    d = SimDriver(make_group(), dep, steps=3, seed=0, max_virtual_s=1e9)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="makes no progress.*reward_devices"):
        d.run()
    assert time.perf_counter() - t0 < 10
    assert d.clock.now < 1e5   # far from max_virtual_s
