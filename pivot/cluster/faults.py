"""Slot processes that die during a local run (sec. 4: on a cluster a device's failure is
an ordinary event, not the end of a job).

Monarch's supervision reports a dead slot process to the controller
(``MeshController.poll_faults``, which marks the device LOST and discards the slot's
half-written GPS versions). ``SlotFaults`` turns that into what the run needs:

- an inference replica on the dead slot is lost like a forced shift down with no engine
  to ask (alg. 3 without the aborts, ``ShiftAwareScheduler.lose_replica``): its sequences
  go back to the queue with the tokens last recorded for them and are dispatched to the
  survivors, so no sequence is lost, only the tokens generated since its last abort or
  poll (generated again);
- the slot is replaced in the background (a new process and its engines,
  ``MeshController.replace``, on a worker thread while the run goes on); at the next tick
  it returns to the role it held, through the executor like any shift up;
- a training replica of one slot loses the step in flight, during the step or while it
  publishes (``TrainingLost``: the RL loop keeps the batch, GPS discards the half-written
  version and keeps the previous one, and the driver goes back to its AdamW state from
  before the step); the batch trains again once training is back, on another slot the
  planner gives it or on the replaced slot;
- a slot that dies inside a shift's migration loses no sequence either: the fleet tells
  the schedulers where each sequence really is (``Fleet.reconcile``) before the dead
  replica is lost, and the executor goes on without the lost devices;
- one rank of a training replica over several slots takes the replica's other ranks
  with it: they may wait in its collective forever, so their processes are killed
  (``MeshController.kill``) and the replica is lost, replaced and returned whole. One
  rank of a TP / EP inference replica, or a surviving rank on another host (no kill by
  pid), stops the run with a ``SlotDied`` error naming it (a TP block's ranks
  rendezvous when their engines start, and a block re-spawned mid-run hung there); the
  run resumes from its last checkpoint (``RunConfig.resume``), as after any crash.

A fleet operation that meets the dead slot before the tick does (a poll's call to it
fails) asks ``after_error`` whether a slot died; it waits up to ``wait_s`` for
supervision to say so, handles the death and the operation runs again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pivot.runtime.pending import SlotProcessDied
from pivot.waits import Steps, run_async
from pivot.types import Role, ShiftDown, ShiftPlan

log = logging.getLogger(__name__)


class SlotDied(SlotProcessDied):
    """A slot process died holding what the run cannot rebuild: the run stops, to be
    resumed from its last checkpoint."""


def stopped_by(err: SlotProcessDied, run_dir: Any) -> SlotDied:
    """The run's error for a call that met a dead slot outside the fleet (the trainer's,
    a shift's): the run stops and resumes from its checkpoint."""
    if isinstance(err, SlotDied):
        return err
    return SlotDied(f"{err}; the run stops: resume it from its last checkpoint "
                    f"(RunConfig.resume = True, run folder {run_dir})")


def lost_replicas(replicas: dict[Role, dict[str, tuple[int, ...]]],
                  dead: Sequence[int]) -> dict[str, tuple[Role, tuple[int, ...]]]:
    """The replicas (id -> role and devices) that held a device of ``dead``."""
    hit = set(dead)
    return {rid: (role, devs) for role, reps in replicas.items()
            for rid, devs in reps.items() if hit & set(devs)}


class SlotFaults:
    """Args:
        ctl: the mesh controller (``poll_faults``, ``replace``, ``device_map``).
        fleet: the inference fleet (its schedulers, port and lock).
        execute: carries out a shift plan on the loop (``ClusterControl.execute_async``).
        clock / t0: the run's clock and its start (the records' ``time_s``).
        on_replaced: called with the devices once their new processes are up (the
            driver puts the new pids under the slots' CPU shares).
        wait_s: how long a failed fleet call waits for supervision to report a death.
        max_deaths: slot deaths the run survives; the next one ends it.
    """

    def __init__(self, ctl: Any, fleet: Any,
                 execute: Callable[[ShiftPlan], Awaitable[None]],
                 clock: Callable[[], float] = time.monotonic, t0: float = 0.0,
                 on_replaced: Callable[[tuple[int, ...]], None] | None = None,
                 wait_s: float = 10.0, max_deaths: int = 2):
        self.ctl, self.fleet, self.execute = ctl, fleet, execute
        self.clock, self.t0 = clock, t0
        self.on_replaced = on_replaced
        self.wait_s, self.max_deaths = wait_s, max_deaths
        self.records: list[dict[str, Any]] = []
        self._replacing: dict[tuple[int, ...], tuple[asyncio.Task, dict, Role | None]] = {}
        """Slots being replaced: devices -> (the replacement, their death's record, the
        role they held or None)."""

    # ---- detection ---------------------------------------------------------------
    async def check(self) -> None:
        """Handles the deaths supervision reported since the last call (the tick's first
        step), then returns replaced slots to their roles."""
        if self.ctl.faults_reported:   # the common tick takes no lock
            async with self.fleet.lock:
                await run_async(self._poll_steps())
        await self._return_replaced()

    async def after_error(self, err: BaseException) -> bool:
        """A fleet operation (holding the fleet's lock) failed with ``err``: waits up to
        ``wait_s`` for a slot death to be reported and handles it. Returns whether one
        was, i.e. whether the operation may run again without the dead slot. Only a
        ``SlotProcessDied`` waits (its report is in already, or follows at once): any
        other error is looked at once and then raised by the caller."""
        dead_call = isinstance(err, SlotProcessDied)
        deadline = time.monotonic() + (self.wait_s if dead_call else 0.0)
        while True:
            if await run_async(self._poll_steps()):
                log.warning("a fleet call failed on a dead slot (%s); it runs again "
                            "without it", str(err).splitlines()[0][:200] if str(err) else
                            type(err).__name__)
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.2)

    def _poll_steps(self) -> Steps[tuple[int, ...]]:
        """``poll_faults`` and the lost replicas' sequences back to their queues, under
        the fleet's lock. Returns the dead devices."""
        dm = self.ctl.device_map
        before = {r: dm.replicas(r) for r in Role}
        dead = self.ctl.poll_faults()
        if not dead:
            return ()
        lost = lost_replicas(before, dead)
        now = self.clock() - self.t0
        rec = {"time_s": now, "devices": list(dead), "replicas": {}, "requeued": 0,
               "killed": [], "replaced_s": None, "returned_to": None}
        self.records.append(rec)
        killed: list[int] = []
        for rid, (role, devs) in lost.items():
            rec["replicas"][rid] = role.value
            survivors = [d for d in devs if d not in dead]
            if survivors and role is not Role.TRAINING:
                # a TP / EP engine's ranks rendezvous when their engines start: a block
                # re-spawned mid-run hung there (tests/cluster/test_slot_faults.py, opt-in)
                raise SlotDied(f"slot(s) {list(dead)} died holding one rank of the "
                               f"{len(devs)}-device {role.value} replica {rid}: its engines "
                               f"cannot be replaced mid-run, so the run stops; resume it "
                               f"from its last checkpoint (RunConfig.resume = True)")
            if survivors and not self.ctl.can_kill(survivors):
                raise SlotDied(f"slot(s) {list(dead)} died holding one rank of the "
                               f"{len(devs)}-device {role.value} replica {rid}, whose other "
                               f"ranks run on another host and may wait in a collective: "
                               f"the run stops; resume it from its last checkpoint "
                               f"(RunConfig.resume = True)")
            killed += survivors
        if killed:
            # the other ranks of a replica that lost one may wait in its collective
            # forever: they go too, and the replica is replaced whole
            self.ctl.kill(killed)
            rec["killed"] = killed
        if len(self.records) > self.max_deaths:
            raise SlotDied(f"slot(s) {list(dead)} died: {len(self.records)} slot deaths in "
                           f"this run, more than FaultBudget.max_slot_deaths="
                           f"{self.max_deaths}; resume from the last checkpoint")
        home: dict[tuple[int, ...], Role | None] = {}
        for rid, (role, devs) in lost.items():
            if role is not Role.TRAINING:   # training's step fails on its own (TrainingLost)
                rec["requeued"] += yield from self._lose_steps(role, rid)
            home[devs] = role
        for d in dead:
            if not any(d in devs for devs in home):
                home[(d,)] = None     # it held nothing (idle, or mid-shift)
        log.error("slot(s) %s died (replicas %s); %d sequences went back to their queues; "
                  "replacing the slots in the background", list(dead), rec["replicas"],
                  rec["requeued"])
        for devs, role in home.items():
            if devs not in self._replacing:
                self._replacing[devs] = (asyncio.ensure_future(self._replace(devs, rec)),
                                         rec, role)
        return dead

    def _lose_steps(self, role: Role, rid: str) -> Steps[int]:
        fleet = self.fleet
        sched = fleet.schedulers[role]
        # a shift-down migration drops its donors from the scheduler before its aborts
        # run: a donor that died under them has nothing left there to requeue
        requeued, acts = sched.lose_replica(rid) if rid in sched.replicas else ([], [])
        # every sequence the port last placed there: the requeued ones, and those an
        # abort round that failed on the dead slot already queued again
        for seq in fleet.port.sequences.values():
            if seq.replica_id == rid:
                seq.replica_id = None
        fleet.port.lengths.pop(rid, None)
        if acts:
            yield from fleet.apply_steps(acts)
        return len(requeued)

    # ---- replacement -------------------------------------------------------------
    async def _replace(self, devices: tuple[int, ...], rec: dict[str, Any]) -> None:
        t = time.perf_counter()
        await asyncio.to_thread(self.ctl.replace, devices)
        rec["replaced_s"] = time.perf_counter() - t
        log.warning("slot(s) %s replaced in %.1f s", list(devices), rec["replaced_s"])

    async def _return_replaced(self) -> None:
        """Replaced slots back to the idle pool (on the loop's thread, like every device
        map change) and up into the role they held; a failed replacement ends the run."""
        for devs, (task, rec, role) in list(self._replacing.items()):
            if not task.done():
                continue
            del self._replacing[devs]
            task.result()   # a replacement that failed raises here
            self.ctl.device_map.recover(devs)
            if self.on_replaced is not None:   # slot calls: off the loop's thread
                await asyncio.to_thread(self.on_replaced, devs)
            if role is Role.TRAINING and self.ctl.shifter.training_replica() is not None:
                role = None   # the planner brought training up elsewhere meanwhile
            rec["returned_to"] = role.value if role else "idle"
            if role is not None:
                await self.execute(ShiftPlan(role, (ShiftDown(None, None, devs),), (devs,),
                                             reason="a replaced slot returns"))

    def finish(self) -> None:
        """After the loop ended (its event loop closed, a replacement's thread done):
        every slot replaced during the run back in the idle pool, the next run on the
        stack needs all of them; one whose replacement did not finish is replaced now."""
        for devs, (_, rec, _) in list(self._replacing.items()):
            del self._replacing[devs]
            if any(d in self.ctl.dead for d in devs):
                self.ctl.replace(devs)
            self.ctl.device_map.recover(devs)
            if self.on_replaced is not None:
                self.on_replaced(devs)
            rec["returned_to"] = "idle (after the run)"
