"""Fault injectors for the simulator: forced shifts and replica deaths.

``ForcedShiftPlanner`` is a real ``Planner``: every tick it returns a valid random shift
plan (one replica of one inference role shifts down, idle and freed devices shift up into
the other), so a run shifts far more often than the benefit rule would allow. Training
shifts as the base planner's ``training_up`` says, and back down to the idle pool when idle.
``forced_shift_planner`` builds one as a ``Deployment.planner`` (the cluster driver's forced
shifts, ``gin/deployments/forced_shifts.gin``).

``ReplicaKiller`` kills a random inference replica (its process "dies"): the scheduler's
``lose_replica`` is the forced shift down, the device map marks its devices LOST, and after
``down_s`` virtual seconds they ``recover`` to the idle pool.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import gin
import numpy as np

from pivot.config.validation import check_bool, check_range, default_of
from pivot.errors import StateError
from pivot.planner.base import Planner
from pivot.planner.blocks import aligned_blocks, free_blocks
from pivot.planner.shift_pairs import _host_groups
from pivot.planner.shift_pairs import devices_per_host as largest_host
from pivot.shifting.role_shift import SlotKind
from pivot.types import INFERENCE_ROLES, Role, ShiftDown, ShiftPlan, WorkloadSnapshot

log = logging.getLogger(__name__)


class ForcedShiftPlanner(Planner):
    """Args:
        rollout_model / reward_model: throughput models (for training's donor order).
        replica_devices: devices of one replica of each inference role; None: each role's
            ``RoleLoad.replica_devices`` in the snapshot (the driver's own sizes). Given,
            a snapshot whose sizes differ is refused.
        devices_per_host: host size (a replica stays on one host); None: the snapshot's
            largest host (the cluster driver's slots are all on one host).
        rng: randomness.
        min_replicas: a donor role keeps at least this many replicas.
        donate_p: probability that the donor role gives up a replica (when it can).
        feasible_only: when the drawn role could receive nothing (its donor is at
            ``min_replicas`` and no device is idle), shift the other way instead, so that
            on a few devices nearly every tick shifts (the cluster driver's 4 slots); False
            keeps the draw (and the random stream) as it is.
        aligned_blocks: replicas go on aligned blocks of a host (``Planner.aligned_blocks``:
            TP engines fixed to their block at start).

    The defaults (donate always, feasible draws only) make every tick shift on the local
    driver's few slots; the soak passes its own (``donate_p=0.7, feasible_only=False``).
    ``forced_shift_planner`` takes its defaults from here.
    """

    binding = "ForcedShiftPlanner"
    """How error messages name this planner's settings (the gin factory's name when it
    built the planner)."""

    def __init__(self, rollout_model, reward_model, replica_devices: dict[Role, int] | None,
                 devices_per_host: int | None, rng: np.random.Generator,
                 min_replicas: int = 1, donate_p: float = 1.0, feasible_only: bool = True,
                 aligned_blocks: bool = False):
        super().__init__(rollout_model, reward_model, aligned_blocks)
        self.size, self.per_host = replica_devices, devices_per_host
        self.rng, self.min_replicas = rng, min_replicas
        self.donate_p, self.feasible_only = donate_p, feasible_only

    def check_fits(self, devices: int, max_replicas: dict[Role, int], where: str) -> None:
        for size in (self.size or {}).values():
            check_range(f"{self.binding}.replica_devices", size, 1, devices, integer=True,
                        why=f"a replica's devices; {where}")
        most = max(max_replicas.values())
        check_range(f"{self.binding}.min_replicas", self.min_replicas, 0, most - 1,
                    integer=True, why=f"a donor keeps this many and gives one more; a role "
                                      f"holds at most {most} replicas ({where})")

    def _plan(self, snap: WorkloadSnapshot) -> ShiftPlan | None:
        if self.size is not None:
            for role, size in self.size.items():
                if snap.role_load(role).replica_devices != size:
                    raise StateError(
                        f"{self.binding}.replica_devices: {size} for {role.value}, but its "
                        f"replicas are {snap.role_load(role).replica_devices} devices; leave it "
                        f"unset to use the driver's")
        tr = snap.training
        if tr.batch_ready and not tr.devices:
            return self.training_up(snap)
        if tr.devices and not tr.busy and not tr.batch_ready:
            groups = self._groups(Role.ROLLOUT, tr.devices + snap.idle_devices, snap)
            if groups:
                return ShiftPlan(Role.ROLLOUT, (ShiftDown(Role.TRAINING, None, tr.devices),),
                                 groups[:1], reason="forced: training idle")
        up = INFERENCE_ROLES[int(self.rng.integers(2))]
        if self.feasible_only and not self._can_receive(up, snap):
            other = _other(up)
            up = other if self._can_receive(other, snap) else up
        if self._needs_blocks(up, snap):
            return self._block_shift(up, snap)
        donor_role = _other(up)
        donors = snap.role_load(donor_role).replicas
        down: tuple[ShiftDown, ...] = ()
        freed: tuple[int, ...] = ()
        if len(donors) > self.min_replicas and self.rng.random() < self.donate_p:
            r = donors[int(self.rng.integers(len(donors)))]
            down, freed = (ShiftDown(donor_role, r.replica_id, r.devices),), r.devices
        groups = self._groups(up, freed + snap.idle_devices, snap)
        if not groups:
            return None
        k = 1 + int(self.rng.integers(min(len(groups), 2)))
        return ShiftPlan(up, down, tuple(groups[:k]), reason="forced shift")

    def _can_receive(self, role: Role, snap: WorkloadSnapshot) -> bool:
        """Some devices could shift up into ``role``: its donor has a replica to spare,
        or a replica's worth of devices is idle (with larger replicas than the donor's
        on aligned blocks: a block the donor's spare replicas and idle devices fill)."""
        if self._needs_blocks(role, snap):
            return bool(self._block_donors(role, snap))
        spare = len(snap.role_load(_other(role)).replicas) > self.min_replicas
        return spare or bool(self._groups(role, snap.idle_devices, snap))

    def _needs_blocks(self, role: Role, snap: WorkloadSnapshot) -> bool:
        """``role``'s replicas are aligned blocks larger than its donor's: one donor
        replica frees too little, so a block's worth of donors shifts down at once."""
        return self.aligned_blocks and (snap.role_load(role).replica_devices >
                                        snap.role_load(_other(role)).replica_devices)

    def _block_donors(self, role: Role, snap: WorkloadSnapshot) -> list[tuple[tuple[int, ...],
                                                                              list]]:
        """Aligned blocks for a ``role`` replica that idle devices and whole replicas of
        the donor fill, each with those replicas, leaving the donor ``min_replicas``."""
        donor = snap.role_load(_other(role))
        owner = {d: r for r in donor.replicas for d in r.devices}
        idle, lost = set(snap.idle_devices), set(snap.lost_devices)
        out = []
        for b in aligned_blocks(snap.device_host, snap.role_load(role).replica_devices):
            if lost & set(b) or not all(d in idle or d in owner for d in b):
                continue
            reps = list({owner[d].replica_id: owner[d] for d in b if d in owner}.values())
            if all(set(r.devices) <= set(b) for r in reps) and \
                    len(donor.replicas) - len(reps) >= self.min_replicas:
                out.append((b, reps))
        return out

    def _block_shift(self, up: Role, snap: WorkloadSnapshot) -> ShiftPlan | None:
        """One random block of ``_block_donors``: its donor replicas down, ``up`` on it."""
        options = self._block_donors(up, snap)
        if not options:
            return None
        block, reps = options[int(self.rng.integers(len(options)))]
        down = tuple(ShiftDown(r.role, r.replica_id, r.devices) for r in reps)
        return ShiftPlan(up, down, (block,), reason="forced shift (a block of donors)")

    def _groups(self, role: Role, devices, snap: WorkloadSnapshot) -> tuple:
        devs = sorted(set(devices) - set(snap.lost_devices))
        size = snap.role_load(role).replica_devices
        if self.aligned_blocks:
            return tuple(free_blocks(snap.device_host, size, devs))
        per_host = self.per_host or largest_host(snap)
        return tuple(tuple(g) for g in _host_groups(devs, snap.device_host, size, per_host))


def _other(role: Role) -> Role:
    """The other inference role."""
    return Role.REWARD if role is Role.ROLLOUT else Role.ROLLOUT


_FORCED = ForcedShiftPlanner


@gin.configurable
def forced_shift_planner(rollout_model, reward_model, seed: int = 0,
                         devices_per_host: int | None = None,
                         min_replicas: int = default_of(_FORCED, "min_replicas"),
                         donate_p: float = default_of(_FORCED, "donate_p"),
                         feasible_only: bool = default_of(_FORCED, "feasible_only"),
                         aligned_blocks: bool = default_of(_FORCED, "aligned_blocks")
                         ) -> ForcedShiftPlanner:
    """A ``Deployment.planner`` factory (called as ``planner(rollout_model, reward_model)``)
    of random forced shifts for the cluster driver (docs/results.md, "Reliability"):
    ``Deployment.planner = @forced_shift_planner`` (``gin/deployments/forced_shifts.gin``).

    Args:
        rollout_model / reward_model: the throughput models the driver passes.
        seed: seed of the planner's own numpy generator (shift choices).
        devices_per_host: host size; None: the device map's (every local slot).
        min_replicas: a donor role keeps at least this many replicas.
        donate_p / feasible_only: see ``ForcedShiftPlanner`` (its defaults, which make every
            tick shift on the cluster driver's few slots: one replica flips role, at random).
        aligned_blocks: see ``Planner.aligned_blocks`` (bound in ``gin/tiny_cpu_tp2.gin``).

    Replica sizes are the driver's (``ClusterGroup.policy_replica_devices`` and
    ``genrm_replica_devices``), read from each snapshot.
    """
    name = "forced_shift_planner"
    check_range(f"{name}.seed", seed, 0, integer=True)
    check_range(f"{name}.devices_per_host", devices_per_host, 1, integer=True, optional=True)
    check_range(f"{name}.min_replicas", min_replicas, 0, integer=True)
    check_range(f"{name}.donate_p", donate_p, 0, 1, why="a probability")
    check_bool(f"{name}.feasible_only", feasible_only)
    check_bool(f"{name}.aligned_blocks", aligned_blocks)
    p = ForcedShiftPlanner(rollout_model, reward_model, None, devices_per_host,
                           np.random.default_rng(seed), min_replicas, donate_p, feasible_only,
                           aligned_blocks)
    p.binding = name
    return p


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


class ReadFaultsAfterStart:
    """Wraps a local run's observer (``ClusterDriver.observer``, e.g. ``ClusterChecker``): at
    the loop's first tick, once the initial placement (which must not fail) is done, it
    arms the next shift up to ``role`` of each slot of ``devices`` (None: every slot) to
    fail in its GPS Read (``SlotActor.inject_fault``). The run then meets as many failed
    shift plans as slots shift up to ``role`` (``ClusterControl._survive``)."""

    def __init__(self, inner, role: Role, devices: tuple[int, ...] | None = None):
        self.inner, self.role, self.devices, self.armed = inner, role, devices, False
        self.driver = None
        self.left = 0
        """Armed faults that no shift up met (``finish``)."""

    def attach(self, driver, workflow) -> None:
        self.inner.attach(driver, workflow)
        self.driver = driver
        tick = driver.control.tick

        async def arm_then_tick(status):
            if not self.armed:
                self.armed = True
                for dev in self.devices or range(driver.group.devices):
                    await driver.ctl.actor(dev, self.role).inject_fault.call_one(
                        self.role, 0)
            return await tick(status)
        driver.control.tick = arm_then_tick

    def finish(self) -> None:
        """Disarms the faults no shift up consumed (a reused stack's next run must not
        meet them), then finishes the wrapped observer."""
        self.left = self.driver.ctl.disarm_faults()
        self.inner.finish()

    def report(self):
        return self.inner.report()


class KillSlotMidRun:
    """Wraps a local run's observer (``ClusterDriver.observer``): after ``after_steps`` steps
    it SIGKILLs a ``role`` slot's process, as a crashed host process would die: for an
    inference role at the first tick at which one of its replicas has sequences running
    (the one with the most), for training as its next step starts (the step's calls then
    meet the dead slot). The run goes on (``pivot.cluster.faults``). Local procs only: the
    process is killed by its pid."""

    def __init__(self, inner, role: Role, after_steps: int = 1):
        self.inner, self.role, self.after_steps = inner, role, after_steps
        self.killed: dict[str, object] | None = None
        """device, pid, replica and its running sequences at the kill."""

    def attach(self, driver, workflow) -> None:
        self.inner.attach(driver, workflow)
        if self.role is Role.TRAINING:
            train = driver.trainer.train

            def kill_then_train(groups, version):
                if self.killed is None and version >= self.after_steps:
                    self._kill(driver, driver.ctl.shifter.training_replica(), 0)
                return train(groups, version)
            driver.trainer.train = kill_then_train
            return
        tick = driver.control.tick

        async def kill_then_tick(status):
            if self.killed is None and len(driver.loop.history) >= self.after_steps:
                sched = driver.fleet.schedulers[self.role]
                busy = [(len(v.running), rid) for rid, v in sched.replicas.items()
                        if v.running]
                if busy:
                    n, rid = max(busy)
                    self._kill(driver, rid, n)
            return await tick(status)
        driver.control.tick = kill_then_tick

    def _kill(self, driver, rid: str, running: int) -> None:
        import os
        import signal

        dev = driver.ctl.device_map.replica_devices(rid)[0]
        pid = driver.ctl.describe(dev)["pid"]
        os.kill(pid, signal.SIGKILL)
        self.killed = {"device": dev, "pid": pid, "replica": rid, "running": running}
        log.warning("killed slot %d (pid %d, %s, %d sequences running)", dev, pid, rid,
                    running)

    def finish(self) -> None:
        self.inner.finish()

    def report(self):
        return self.inner.report()
