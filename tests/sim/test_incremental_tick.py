"""The event loop's tick touches only what changed (``SimCluster.sync_all`` skips idle
replicas and views already at their true lengths; ``settle`` records lengths in bulk, and a
preemption settles only its victim and the replica's total): a run must be identical to
one whose tick and preemptions bring every replica and every view up to date with
``update_lengths``, as the loop did before."""

import pytest

from pivot import gin_setup
from pivot.sim.engine import SimCluster

VOLATILE = ("wall_s", "events_per_s", "planner")


def _full_scan_sync_all(self: SimCluster) -> None:
    for rid in list(self.replicas):
        self.sync(rid)
    for rid, rep in self.replicas.items():
        if rep.num_seqs:
            self.schedulers[rep.role].update_lengths(rid, rep.lengths())


def _full_sync_lengths(self: SimCluster, rid, rep) -> None:
    self.schedulers[rep.role].update_lengths(rid, rep.lengths())


def _run(deployment: str) -> dict:
    files = ["gin/qwen7b_30b.gin"] + ([f"gin/deployments/{deployment}.gin"]
                                     if deployment != "pivotrl" else [])
    gin_setup.parse(files, ["ModelGroup.prompts_per_step = 16", "SimDriver.steps = 3"])
    out = gin_setup.build().run().to_dict(trace=True)
    return {k: v for k, v in out.items() if k not in VOLATILE}


@pytest.mark.parametrize("deployment", ["pivotrl", "disaggregated", "colocated"])
def test_incremental_tick_equals_the_full_scan(deployment, monkeypatch):
    from pivot.paths import REPO_ROOT
    monkeypatch.chdir(REPO_ROOT)
    fast = _run(deployment)
    monkeypatch.setattr(SimCluster, "sync_all", _full_scan_sync_all)
    monkeypatch.setattr(SimCluster, "_sync_lengths", _full_sync_lengths)
    monkeypatch.setattr(SimCluster, "lazy_lengths", False)
    assert _run(deployment) == fast


@pytest.mark.parametrize("deployment", ["pivotrl", "disaggregated", "rr_colocated"])
def test_lazy_waiting_equals_the_eager_snapshot(deployment, monkeypatch):
    """The tick's snapshot reads the waiting queues only when a planner does
    (``WaitingEntries``): the run equals one whose snapshot copies them every tick."""
    from pivot.paths import REPO_ROOT
    from pivot.planner import monitor
    from pivot.sim import driver
    monkeypatch.chdir(REPO_ROOT)
    lazy = _run(deployment)

    def eager(*args, lazy_waiting: bool = False, **kw):
        return monitor.snapshot(*args, **kw)

    monkeypatch.setattr(driver, "snapshot", eager)
    assert _run(deployment) == lazy
