"""Reads a ``SimDriver``'s live state into the checker's ``ControlState``."""

from __future__ import annotations

from pivot.reliability.invariants import ControlState, EngineReplica
from pivot.sim.workflow import Workflow
from pivot.types import Role


def expected_live(wf: Workflow) -> dict[Role, set[int]]:
    """The sequences the workflow says must be live: released responses not yet done and
    GenRM judgements submitted but not yet rewarded (sec. 8.1's per-response judgement)."""
    ro: set[int] = set()
    rm: set[int] = set()
    for sid, it in wf.items.items():
        if sid != it.response_id:
            continue
        if wf.genrm:
            if it.judge_id is None:
                ro.add(sid)
            elif not it.rewarded:
                rm.add(it.judge_id)
        elif not it.rewarded:
            ro.add(sid)
    return {Role.ROLLOUT: ro, Role.REWARD: rm}


def sim_state(driver) -> ControlState:
    """The control state of a ``pivot.sim.driver.SimDriver`` (between two events)."""
    c, wf = driver.cluster, driver.workflow
    engines = {rid: EngineReplica(r.role, r.devices, r.kv_capacity, r.lengths())
               for rid, r in c.replicas.items()}
    return ControlState(driver.schedulers, driver.device_map, wf.version, wf.released,
                        wf.staleness, expected_live(wf), engines, c.training.devices)
