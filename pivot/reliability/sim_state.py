"""Reads a ``SimDriver``'s live state into the checker's ``ControlState``."""

from __future__ import annotations

from pivot.reliability.invariants import ControlState, EngineReplica
from pivot.sim.workflow import Workflow
from pivot.types import Role


class LiveIndex:
    """Response ids not yet rewarded, kept incrementally (workflow ids are dense and
    increasing), so ``expected_live`` costs O(live) per event instead of O(all items)."""

    def __init__(self) -> None:
        self.next_id = 0
        self.open: set[int] = set()

    def update(self, wf: Workflow) -> set[int]:
        while self.next_id in wf.items:
            it = wf.items[self.next_id]
            if self.next_id == it.response_id:
                self.open.add(self.next_id)
            self.next_id += 1
        self.open = {s for s in self.open if not wf.items[s].rewarded}
        return self.open


def expected_live(wf: Workflow, index: LiveIndex | None = None) -> dict[Role, set[int]]:
    """The sequences the workflow says must be live: released responses not yet done and
    GenRM judgements submitted but not yet rewarded (sec. 8.1's per-response judgement)."""
    ro: set[int] = set()
    rm: set[int] = set()
    ids = index.update(wf) if index is not None else [
        s for s, it in wf.items.items() if s == it.response_id]
    for sid in ids:
        it = wf.items[sid]
        if wf.genrm:
            if it.judge_id is None:
                ro.add(sid)
            elif not it.rewarded:
                rm.add(it.judge_id)
        elif not it.rewarded:
            ro.add(sid)
    return {Role.ROLLOUT: ro, Role.REWARD: rm}


def sim_state(driver, index: LiveIndex | None = None) -> ControlState:
    """The control state of a ``pivot.sim.driver.SimDriver`` (between two events)."""
    c, wf = driver.cluster, driver.workflow
    engines = {rid: EngineReplica(r.role, r.devices, r.kv_capacity, r.lengths())
               for rid, r in c.replicas.items()}
    return ControlState(driver.schedulers, driver.device_map, wf.version, wf.released,
                        wf.staleness, expected_live(wf, index), engines, c.training.devices)
