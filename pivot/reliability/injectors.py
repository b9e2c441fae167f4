"""Fault injectors for the simulator: forced shifts and replica deaths (reliability issue).

``ForcedShiftPlanner`` is a real ``Planner``: every tick it returns a valid random shift
plan (one replica of one inference role shifts down, idle and freed devices shift up into
the other), so a run shifts far more often than the benefit rule would allow. Training
shifts as the base planner's ``training_up`` says, and back down to the idle pool when idle.

``ReplicaKiller`` kills a random inference replica (its process "dies"): the scheduler's
``lose_replica`` is the forced shift down, the device map marks its devices LOST, and after
``down_s`` virtual seconds they ``recover`` to the idle pool.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from pivot.planner.base import Planner
from pivot.planner.plan import ShiftDown, ShiftPlan
from pivot.planner.shift_pairs import _host_groups
from pivot.shifting.role_shift import SlotKind
from pivot.types import INFERENCE_ROLES, Role, WorkloadSnapshot

log = logging.getLogger(__name__)


class ForcedShiftPlanner(Planner):
    """Args:
        rollout_model / reward_model: throughput models (for training's donor order).
        replica_devices: devices of one replica of each inference role.
        devices_per_host: host size (a replica stays on one host).
        rng: randomness.
        min_replicas: a donor role keeps at least this many replicas.
    """

    def __init__(self, rollout_model, reward_model, replica_devices: dict[Role, int],
                 devices_per_host: int, rng: np.random.Generator, min_replicas: int = 1):
        super().__init__(rollout_model, reward_model)
        self.size, self.per_host = replica_devices, devices_per_host
        self.rng, self.min_replicas = rng, min_replicas

    def _plan(self, snap: WorkloadSnapshot) -> ShiftPlan | None:
        tr = snap.training
        if tr.batch_ready and not tr.devices:
            return self.training_up(snap)
        if tr.devices and not tr.busy and not tr.batch_ready:
            groups = self._groups(Role.ROLLOUT, tr.devices + snap.idle_devices, snap)
            if groups:
                return ShiftPlan(Role.ROLLOUT, (ShiftDown(Role.TRAINING, None, tr.devices),),
                                 groups[:1], reason="forced: training idle")
        up = INFERENCE_ROLES[int(self.rng.integers(2))]
        donor_role = Role.REWARD if up is Role.ROLLOUT else Role.ROLLOUT
        donors = snap.role_load(donor_role).replicas
        down: tuple[ShiftDown, ...] = ()
        freed: tuple[int, ...] = ()
        if len(donors) > self.min_replicas and self.rng.random() < 0.7:
            r = donors[int(self.rng.integers(len(donors)))]
            down, freed = (ShiftDown(donor_role, r.replica_id, r.devices),), r.devices
        groups = self._groups(up, freed + snap.idle_devices, snap)
        if not groups:
            return None
        k = 1 + int(self.rng.integers(min(len(groups), 2)))
        return ShiftPlan(up, down, tuple(groups[:k]), reason="forced shift")

    def _groups(self, role: Role, devices, snap: WorkloadSnapshot) -> tuple:
        devs = sorted(set(devices) - set(snap.lost_devices))
        return tuple(tuple(g) for g in _host_groups(devs, snap.device_host, self.size[role],
                                                    self.per_host))


@dataclass
class ReplicaKiller:
    """Kills inference replicas of a ``SimDriver`` and brings their devices back.

    Args:
        rate: expected kills per planner tick.
        down_s: virtual seconds a dead replica's devices stay LOST.
        min_replicas: never kill a role's last replicas.
    """

    rng: np.random.Generator
    rate: float = 0.05
    down_s: float = 5.0
    min_replicas: int = 1
    killed: int = 0
    recovered: int = 0
    requeued: int = 0
    pending: list[tuple[float, tuple[int, ...]]] = field(default_factory=list)
    recover_s: list[float] = field(default_factory=list)
    """Virtual seconds from each kill until its requeued sequences all run again."""
    waiting: list[tuple[float, Role, set[int]]] = field(default_factory=list)
    handle_wall_s: list[float] = field(default_factory=list)
    """Wall seconds the control plane spent handling each kill (requeue, re-dispatch)."""

    def maybe_kill(self, driver) -> str | None:
        if self.rng.random() >= self.rate:
            return None
        role = INFERENCE_ROLES[int(self.rng.integers(2))]
        sched = driver.schedulers[role]
        if len(sched.replicas) <= self.min_replicas:
            return None
        ids = sorted(sched.replicas)
        rid = ids[int(self.rng.integers(len(ids)))]
        return self.kill(driver, rid)

    def kill(self, driver, rid: str) -> str:
        """The replica's process died: no engine to ask; its tokens are what the driver
        recorded last (the scheduler's lengths)."""
        import time
        t0 = time.perf_counter()
        c, dm = driver.cluster, driver.device_map
        rep = c.replicas.pop(rid)
        c._next.pop(rid, None)
        c.tokens_by_role[rep.role] += rep.generated
        lost, dispatches = driver.schedulers[rep.role].lose_replica(rid)
        dm.mark_lost(rep.devices, f"injected: replica {rid} process killed")
        c.apply(dispatches)
        c._dirty.add(rep.role)
        self.killed += 1
        self.handle_wall_s.append(time.perf_counter() - t0)
        self.requeued += len(lost)
        self.pending.append((c.now + self.down_s, rep.devices))
        self.waiting.append((c.now, rep.role, set(lost)))
        log.info("killed %s (%d sequences requeued)", rid, len(lost))
        return rid

    def maybe_recover(self, driver) -> None:
        now = driver.clock.now
        keep = []
        for t, devs in self.pending:
            if t <= now:
                driver.device_map.recover(devs)
                self.recovered += 1
            else:
                keep.append((t, devs))
        self.pending = keep

    def track(self, driver) -> None:
        """Closes the kills whose requeued sequences all run again (or finished)."""
        keep = []
        for t, role, ids in self.waiting:
            seqs = driver.schedulers[role].seqs
            ids = {s for s in ids if s in seqs and seqs[s].replica_id is None}
            if ids:
                keep.append((t, role, ids))
            else:
                self.recover_s.append(driver.clock.now - t)
        self.waiting = keep

    def lost_now(self, driver) -> int:
        return len(driver.device_map.devices_in(SlotKind.LOST))


@dataclass
class FlakyBackend:
    """Wraps a ``SlotBackend``: a shift up fails (raises) with probability ``rate`` before any
    slot work, as when a slot's process dies mid-shift. The ``Shifter`` then marks the
    devices LOST and the executor raises ``ShiftError``; the caller goes on."""

    inner: object
    rng: np.random.Generator
    rate: float = 0.02
    failed: int = 0

    def shift_down(self, role, replica_id, devices):
        return self.inner.shift_down(role, replica_id, devices)

    def shift_up(self, role, replica_id, devices):
        if role is not Role.TRAINING and self.rng.random() < self.rate:
            self.failed += 1
            raise RuntimeError(f"injected: slot process of {replica_id} died during shift up")
        return self.inner.shift_up(role, replica_id, devices)
