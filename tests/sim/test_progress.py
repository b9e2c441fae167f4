"""A deployment that cannot make progress fails fast with a clear message."""

import time

import pytest

from pivot.errors import ConfigError
from pivot.planner import NoShiftPlanner
from pivot.spec.deployment import Deployment
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


def test_preemption_livelock_fails_with_the_fix_named():
    """A replica that preempts again and again at one instant without decoding (admission
    leaves less than a decode step of room) raises ConfigError instead of looping."""
    import os

    import pytest

    from pivot import gin_setup
    from pivot.errors import ConfigError
    from pivot.paths import REPO_ROOT
    os.chdir(REPO_ROOT)
    gin_setup.parse(["gin/qwen7b_30b.gin"], ["ModelGroup.prompts_per_step = 16"])
    drv = gin_setup.build()
    c = drv.cluster
    drv._provision()
    rid, rep = next(iter(c.replicas.items()))
    for _ in range(10_000):
        c._check_thrash(rid, rep)
    with pytest.raises(ConfigError, match="max_num_seqs"):
        c._check_thrash(rid, rep)
    c.clock.now += 1.0  # a new instant starts a new count
    c._check_thrash(rid, rep)
