"""The cluster driver's control plane and trainer ports (sec. 4 "Workflow", sec. 7).

``ClusterControl`` is the loop's ControlPort: at each tick the monitor builds the
``WorkloadSnapshot`` from the shared schedulers and the device map, the planner plans,
and the shared ``ShiftExecutor`` carries the plan out on the mesh. It also records the
allocation trace (fig. 10) and every shift's phases (fig. 12). ``ClusterTrainer`` is the
TrainerPort: GRPO steps in the training slot, GPS Write, rollout replicas Read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from pivot.cluster.config import FaultBudget
from pivot.cluster.faults import SlotFaults
from pivot.planner.monitor import RoleShape, snapshot
from pivot.errors import StateError
from pivot.rl.batch import TrainBatch, build_train_batch
from pivot.rl.ports import LoopStatus, TrainingLost
from pivot.rl.trajectory import PromptGroup
from pivot.runtime.pending import Pending, SlotProcessDied
from pivot.shifting.executor import ShiftExecutor
from pivot.shifting.shifter import ShiftError
from pivot.shifting.role_shift import SlotKind
from pivot.types import INFERENCE_ROLES, POLICY, Role, ShiftPlan, TrainingLoad

if TYPE_CHECKING:
    from pivot.runtime.mesh import TrainerHandle

log = logging.getLogger(__name__)
T = TypeVar("T")

SLOT_STAGES = ("shift_down", "shift_up")
"""The executor's stages whose failure leaves only devices LOST (``ShiftExecutor``)."""
RANK_GRACE_S = 20.0
"""After one rank of a replica failed, how long the others' calls may take to answer or
be reported dead (supervision reports a SIGKILLed process in about 8 s here)."""


class ClusterControl:
    """Args:
        ctl: mesh controller; fleet: the inference fleet; planner: any Planner.
        shapes: role -> RoleShape; train_needed: training's devices.
        tau_train: training's shift time (s); release_idle_training: static strategy.
        clock: time source.
        faults: the plans whose slot work may fail and the slot processes that may die
            before the run stops (``FaultBudget``). A replica's failed shift up or down
            leaves its devices LOST (``Shifter``) with the schedulers consistent (its
            sequences were migrated before, or never arrived), so the run goes on without
            those devices; the next failure past the budget ends the run with it.
        on_replaced: what to do with a replaced slot's new processes (``SlotFaults``).
    """

    def __init__(self, ctl, fleet, planner, shapes: dict[Role, RoleShape], train_needed: int,
                 tau_train: float, release_idle_training: bool, clock=time.monotonic,
                 faults: FaultBudget = FaultBudget(),
                 on_replaced: Callable[[tuple[int, ...]], None] | None = None):
        self.ctl, self.fleet, self.planner = ctl, fleet, planner
        self.shapes, self.train_needed, self.tau_train = shapes, train_needed, tau_train
        self.release_idle_training = release_idle_training
        self.clock = clock
        self.max_shift_failures = faults.max_shift_failures
        self.failed_shifts: list[dict[str, Any]] = []
        self.training_leaving = False
        """A shift down of the training replica is in flight: the loop must not start a
        step on it (``ClusterTrainer.ready``)."""
        self.executor = ShiftExecutor(ctl.shifter, fleet.schedulers, fleet,
                                      before_migrate_up=self._refresh_if_published)
        self.publishes = 0       # policy versions published (ClusterTrainer.publish)
        self._publishes_at_start = 0
        self.busy = False
        self.status = LoopStatus(0, False, 0, 0, False)
        self.t0 = clock()
        self.trace: list[dict[str, Any]] = []
        self.shifts: list[dict[str, Any]] = []
        self.planner_s: list[float] = []
        if hasattr(planner, "bind"):
            planner.bind(lambda: self.status.oldest_rollout_done)
        self.faults = SlotFaults(ctl, fleet, self.execute_async, clock, self.t0,
                                 on_replaced=on_replaced, max_deaths=faults.max_slot_deaths)
        fleet.on_slot_error = self.faults.after_error

    def training_devices(self) -> tuple[int, ...]:
        rid = self.ctl.shifter.training_replica()
        return self.ctl.device_map.replica_devices(rid) if rid else ()

    def training_load(self) -> TrainingLoad:
        return TrainingLoad(self.train_needed, self.training_devices(), self.busy,
                            self.status.batch_ready, self.tau_train)

    def snapshot(self):
        dm = self.ctl.device_map
        return snapshot(self.clock(), dict(self.fleet.schedulers), self.shapes,
                        self.training_load(), dm.device_host, dm.devices_in(SlotKind.IDLE),
                        dm.devices_in(SlotKind.LOST))

    def execute(self, plan: ShiftPlan) -> None:
        """Carries ``plan`` out, blocking (provisioning, tests)."""
        now = self.clock() - self.t0
        self._publishes_at_start = self.publishes
        self._record(now, plan, self.executor.execute(plan))

    async def execute_async(self, plan: ShiftPlan) -> None:
        """Carries ``plan`` out while the loop keeps polling and dispatching on the other
        replicas, and training keeps training (sec. 4: the executor runs beside them)."""
        now = self.clock() - self.t0
        self._publishes_at_start = self.publishes
        lost_before = set(self.ctl.device_map.devices_in(SlotKind.LOST))
        # The planner took training as a donor while it was idle with no batch ready;
        # the plan's migration runs for seconds first, and a batch that becomes ready
        # meanwhile must not start a step on devices about to shift down (seen once: the
        # trainer's post-step call found its slot shifted down).
        leaving = any(d.role is Role.TRAINING for d in plan.down)
        self.training_leaving = self.training_leaving or leaving
        try:
            rep = await self.executor.execute_async(plan)
        except ShiftError as e:
            rep = await self._survive(now, plan, e, lost_before)
        finally:
            if leaving:
                self.training_leaving = False
        self._record(now, plan, rep)

    async def _survive(self, now: float, plan: ShiftPlan, err: ShiftError,
                       lost_before: set[int]):
        """A plan whose slot work failed: its devices are LOST (``Shifter``); those whose
        slots rolled the failure back return to the idle pool (``MeshController.restore``)
        and the rest stay lost for the run, which goes on, up to ``max_shift_failures``.
        Any other failure (a migration, a hook) re-raises: the schedulers may be
        mid-change."""
        rep = err.report
        if not survivable(rep, len(self.failed_shifts), self.max_shift_failures):
            raise err
        lost = sorted(set(self.ctl.device_map.devices_in(SlotKind.LOST)) - lost_before)
        restored = list(await asyncio.to_thread(self.ctl.emptied, lost))
        if restored:   # on the loop's thread, like every other device map change
            self.ctl.device_map.recover(tuple(restored))
        self.failed_shifts.append({"time_s": now, "up_role": plan.up_role.value,
                                   "stage": rep.failed_stage, "cause": root_cause(rep.error),
                                   "error": rep.error, "lost": lost, "restored": restored})
        log.warning("shift to %s failed in %s (%s); devices %s lost, %s restored to idle; "
                    "the run goes on (%d of %d failures allowed)", plan.up_role.value,
                    rep.failed_stage, root_cause(rep.error), lost, restored,
                    len(self.failed_shifts), self.max_shift_failures)
        log.info("the failed shift's error: %s", rep.error)
        return rep

    def _refresh_if_published(self, role: Role, views: list):
        """A rollout replica that Read its policy before a publish landed mid-shift holds
        the previous version: it Reads again before it gets work (the staleness bound
        counts from the published version). Returns the steps of that Read, or None."""
        if role is not Role.ROLLOUT or self.publishes == self._publishes_at_start:
            return None
        return self.fleet.reload_policy_steps([d for v in views for d in v.devices])

    def _record(self, now: float, plan: ShiftPlan, rep) -> None:
        self.shifts.append({
            "time_s": now, "up_role": plan.up_role.value, "reason": plan.reason,
            "total_s": rep.total_s, "stage_s": dict(rep.stage_s),
            "down": [{"role": r.role.value, "devices": list(r.devices), "phases": r.phases,
                      "seconds": r.seconds} for r in rep.down],
            "up": [{"role": r.role.value, "devices": list(r.devices), "phases": r.phases,
                    "seconds": r.seconds} for r in rep.up],
            "migration_down": _mig(rep.migration_down), "migration_up": _mig(rep.migration_up),
            "failed": root_cause(rep.error) if rep.error else None})
        log.info("shift to %s (%s): %.2f s", plan.up_role.value, plan.reason, rep.total_s)

    # ---- ControlPort ---------------------------------------------------------------
    async def tick(self, status: LoopStatus) -> None:
        self.status = status
        await self.faults.check()   # dead slots first: the snapshot must not see them
        if (self.release_idle_training and not self.busy and not status.batch_ready
                and self.training_devices()):
            self.training_leaving = True
            try:
                (res,) = await self.ctl.shifter.shift_down_many_async(
                    [self.ctl.shifter.training_replica()])
            finally:
                self.training_leaving = False
            if isinstance(res, Exception):
                raise res
        t = time.perf_counter()
        plan = self.planner.plan(self.snapshot())
        self.planner_s.append(time.perf_counter() - t)
        if plan is not None:
            await self.execute_async(plan)
        self.trace.append({"time_s": self.clock() - self.t0, **self.allocation(),
                           "training_busy": self.busy, "batch_ready": status.batch_ready,
                           "queued": {r.value: self.fleet.schedulers[r].queue_size()
                                      for r in INFERENCE_ROLES},
                           "running": {r.value: (self.fleet.schedulers[r].num_seqs -
                                                 self.fleet.schedulers[r].queue_size())
                                       for r in INFERENCE_ROLES},
                           # sequences on each inference device (a replica's on each of its
                           # devices): analysis/local_utilization.py's busy slot-time
                           "device_seqs": self._device_seqs()})

    def _device_seqs(self) -> dict[str, int]:
        dm = self.ctl.device_map
        return {str(d): v.num_seqs for r in INFERENCE_ROLES
                for rid, v in self.fleet.schedulers[r].replicas.items()
                for d in dm.replica_devices(rid)}

    def set_busy(self, busy: bool) -> None:
        self.busy = busy

    def allocation(self) -> dict[str, Any]:
        dm = self.ctl.device_map
        out = {r.value: sorted(d for devs in dm.replicas(r).values() for d in devs)
               for r in Role}
        out["idle"] = list(dm.devices_in(SlotKind.IDLE))
        out["lost"] = list(dm.devices_in(SlotKind.LOST))
        return out


def survivable(report: Any, failed_before: int, max_failures: int) -> bool:
    """Whether the run goes on past a failed plan (``ShiftReport``): its failure was in
    the slot work, which leaves only LOST devices behind, and fewer than
    ``max_failures`` plans failed before it."""
    return (report is not None and report.failed_stage in SLOT_STAGES
            and failed_before < max_failures)


def root_cause(error: str) -> str:
    """The last line of an error that crossed actors (its remote traceback before it)."""
    lines = [ln.strip() for ln in error.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else error


def _mig(m) -> dict[str, float]:
    return {"aborted": m.aborted, "dispatched": m.dispatched, "abort_s": m.abort_s,
            "dispatch_s": m.dispatch_s, "reprefill_s": m.reprefill_s}


class ClusterTrainer:
    """The TrainerPort over the training replica's slots (sec. 5.1: Write after each step).

    Every call goes to all of the replica's slots at once (they are ranks of one FSDP2
    group, and each call is collective); rank 0's answer is the replica's. The driver
    keeps the full AdamW state after each step (for checkpoints and for moves): when
    training comes back on slots that do not hold the latest state (``optimizer_tag``),
    it is sent to them before the step and each rank cuts its shard.
    """

    def __init__(self, ctl, fleet, control: ClusterControl, source, pad_id: int,
                 keep_optimizer: bool = True, scale_by_std: bool = True):
        import uuid

        self.ctl, self.fleet, self.control, self.source = ctl, fleet, control, source
        self.pad_id, self.keep_optimizer = pad_id, keep_optimizer
        self.scale_by_std = scale_by_std   # GRPO's advantages, or Dr. GRPO's (Objective)
        self.optimizer: dict | None = None
        self.run_id = uuid.uuid4().hex[:8]   # tags this run's AdamW state in the slots
        self._restore_opt: dict | None = None
        self._fresh = True   # a reused slot keeps the last run's AdamW state: clear it
        self._before_step = (self.optimizer, self._fresh, self._restore_opt)
        self.optimizer_moves = 0

    def ready(self) -> bool:
        """A training replica is up, no shift in flight is taking it down, and none of its
        slots was reported dead (the tick takes such a replica out: ``SlotFaults``)."""
        devs = self.control.training_devices()
        return (bool(devs) and not self.control.training_leaving
                and not any(self.ctl.reported_dead(d) for d in devs))

    def _all(self, devs: Sequence[int], call: Callable[[TrainerHandle], Pending[T]]
             ) -> list[T]:
        """``call`` of every rank's ``TrainerHandle`` (``MeshController.trainer``), all
        started before any is waited for; their results in rank order.
        Every call is waited for: when a rank's process died, the others' calls fail
        (their collective lost a peer) or hang until the tick kills them
        (``SlotFaults``), and the death, not their error, is what it raises. After a
        rank's own error, the others get ``RANK_GRACE_S`` to answer or be reported dead
        (they may wait in a collective for the failed rank forever)."""
        pending = [call(self.ctl.trainer(d)) for d in devs]
        out: list[T] = []
        dead: SlotProcessDied | None = None
        err: Exception | None = None
        for p in pending:
            try:
                out.append(p.get() if err is None else p.get(within=RANK_GRACE_S))
            except SlotProcessDied as e:
                dead = dead or e
            except TimeoutError:
                if err is None:
                    raise
            except Exception as e:  # noqa: BLE001 - raised below, after every rank
                err = err or e
        if dead is not None:
            raise dead
        if err is not None:
            raise err
        return out

    def train(self, groups: Sequence[PromptGroup], version: int) -> dict[str, float]:
        batch = build_train_batch(groups, self.pad_id, scale_by_std=self.scale_by_std)
        return self.train_batch(batch, version)

    def train_batch(self, batch: TrainBatch, version: int) -> dict[str, float]:
        """One GRPO step of the replica on ``batch`` (every rank gets it whole and trains
        on its rows); the full AdamW state is sent first if a rank lacks it. A slot that
        dies meanwhile raises ``TrainingLost``: the driver's AdamW state and GPS still
        hold the previous step's, from which the batch trains again elsewhere."""
        try:
            return self._train_batch(batch, version)
        except SlotProcessDied as e:
            raise TrainingLost(str(e)) from e

    def _train_batch(self, batch: TrainBatch, version: int) -> dict[str, float]:
        devs = self.control.training_devices()
        if not devs:   # the tick took its dead slot out since the loop asked ``ready``
            raise TrainingLost(f"training holds no devices at version {version}")
        tag = (self.run_id, version)
        m_extra: dict[str, float] = {}
        # what the driver holds before the step, until its Write is published: a slot
        # that dies mid-publish takes the step's weights with it (``publish``)
        self._before_step = (self.optimizer, self._fresh, self._restore_opt)
        if self._restore_opt is not None:
            state = self._restore_opt
            self._all(devs, lambda t: t.set_optimizer_state(state, tag))
            self._restore_opt = None
        elif self._fresh:
            self._all(devs, lambda t: t.reset_optimizer(tag))
        else:
            t = time.perf_counter()
            held = self._all(devs, lambda t: t.held_optimizer_tag())
            if any(h != tag for h in held):
                # training came back on slots without the latest state (or resharded)
                if self.optimizer is None:
                    raise StateError(f"training on slots {list(devs)} at version {version}: "
                                     f"they hold AdamW states {held} and the driver kept "
                                     f"none (ClusterTrainer.keep_optimizer=False)")
                state = self.optimizer
                self._all(devs, lambda t: t.set_optimizer_state(state, tag))
                self.optimizer_moves += 1
                m_extra["trainer/optimizer_send_s"] = time.perf_counter() - t
        t = time.perf_counter()
        m = self._all(devs, lambda t: t.train_step(batch, version))[0]
        m["trainer/step_s"] = time.perf_counter() - t
        self._fresh = False   # after the step: a first step lost with its slot resets again
        m.update(m_extra)
        if self.keep_optimizer:
            t = time.perf_counter()
            self.optimizer = self._all(devs, lambda t: t.optimizer_state())[0]
            m["trainer/optimizer_fetch_s"] = time.perf_counter() - t
        return m

    async def publish(self, version: int,
                      on_written: Callable[[], object] = lambda: None) -> dict[str, float]:
        """GPS Write from the training replica (its slots gather the weights together and
        rank 0 writes), then every rollout replica Reads it; both awaited (the RL loop's
        event loop keeps running)."""
        devs = self.control.training_devices()
        t = time.perf_counter()
        try:
            await self.ctl.write_back_replica(tuple(devs)).wait()
        except SlotProcessDied as e:
            # GPS discards the half-written version (``MeshController.poll_faults`` ends
            # the dead writer's lease) and keeps the previous one; the driver goes back
            # to the AdamW state before the step, so the batch trains again from there
            self.optimizer, self._fresh, self._restore_opt = self._before_step
            raise TrainingLost(f"publishing version {version}: {e}") from e
        self.control.publishes += 1
        on_written()
        write_s = time.perf_counter() - t
        refresh_s = await self.fleet.refresh_rollout_async()
        return {"gps/write_s": write_s, "gps/rollout_refresh_s": refresh_s}

    async def state(self) -> dict[str, Any]:
        """Policy (read from GPS in a worker thread: the Read blocks) and optimizer."""
        policy = (await asyncio.to_thread(self.source.read, POLICY, (0,)))[0]
        return {"policy": policy, "optimizer": self.optimizer}

    def load_state(self, state: dict[str, Any]) -> None:
        self.source.write(POLICY, (0,), None, {0: state["policy"]})
        self._restore_opt = self.optimizer = state.get("optimizer")
        self._fresh = self._restore_opt is None
