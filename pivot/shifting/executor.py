"""The shift executor: carries out a planner's ``ShiftPlan`` (sec. 4 "Workflow", sec. 6.2).

Order, for safety: (1) shift-down migration: the donor role's scheduler aborts every
sequence on the donor replicas (Alg. 3) and the driver applies the actions, so generated
tokens return to the queue before any KV cache is dropped; (2) shift down the donors, one
replica at a time (training as a whole); (3) shift up the new replicas; (4) shift-up
migration onto them (Alg. 4). Monarch stays out: the executor only calls ports, so the local
driver and the simulator (virtual time, simulated replicas) share it.

Validation happens before any work: a plan whose donors or devices disagree with the device
map raises StateError and changes nothing.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from pivot.errors import StateError
from pivot.shifting.device_map import DeviceMap
from pivot.shifting.role_shift import SlotKind
from pivot.shifting.shifter import ShiftError, Shifter
from pivot.types import INFERENCE_ROLES, ReplicaView, Role, ShiftDown, ShiftPlan
from pivot.waits import Steps, run_async, run_blocking

log = logging.getLogger(__name__)


class SchedulerPort(Protocol):
    """The shift-aware scheduler of one inference role (sec. 6.2)."""

    def shift_down(self, replica_ids: Sequence[str]) -> Sequence[object]:
        """Migration off ``replica_ids`` (Alg. 3): Abort/Dispatch actions to apply."""
        ...

    def shift_up(self, new_replicas: Sequence[ReplicaView]) -> Sequence[object]:
        """Migration onto ``new_replicas`` (Alg. 4): Abort/Dispatch actions to apply."""
        ...


@dataclass(slots=True)
class MigrationStats:
    """What applying a scheduler's actions cost (the paper's table 3 split).

    Seconds are totals over the applied actions; per-sequence means are total / count.
    """

    aborted: int = 0
    dispatched: int = 0
    abort_s: float = 0.0
    dispatch_s: float = 0.0
    reprefill_s: float = 0.0

    def add(self, other: "MigrationStats") -> None:
        self.aborted += other.aborted
        self.dispatched += other.dispatched
        self.abort_s += other.abort_s
        self.dispatch_s += other.dispatch_s
        self.reprefill_s += other.reprefill_s


class ReplicaPort(Protocol):
    """The driver's replicas: applies Abort (returning the tokens generated so far to the
    scheduler) and Dispatch actions.

    A port may also have ``async migrate_async(actions_of)``: it calls ``actions_of()``
    (the scheduler's migration) and applies the actions as one operation that no other
    operation on the replicas interleaves with, awaiting the replicas' calls;
    ``execute_async`` then uses it instead of ``apply``."""

    def apply(self, actions: Sequence[object]) -> MigrationStats:
        ...


@dataclass(slots=True)
class ShiftRecord:
    """One replica's (or training's) shift and its phase times (fig. 12/13)."""

    direction: str
    role: Role
    replica_id: str
    devices: tuple[int, ...]
    phases: dict[str, float]
    seconds: float


@dataclass(slots=True)
class ShiftReport:
    """What the executor did for one plan, and how long each part took.

    ``stage_s`` holds wall (or virtual) seconds of each stage: ``migrate_down``,
    ``shift_down``, ``shift_up``, ``migrate_up``. ``error`` and ``failed_stage`` are set
    when a port raised; the stages before it completed.
    """

    up_role: Role
    down: list[ShiftRecord] = field(default_factory=list)
    up: list[ShiftRecord] = field(default_factory=list)
    new_replicas: list[ReplicaView] = field(default_factory=list)
    migration_down: MigrationStats = field(default_factory=MigrationStats)
    migration_up: MigrationStats = field(default_factory=MigrationStats)
    stage_s: dict[str, float] = field(default_factory=dict)
    total_s: float = 0.0
    error: str | None = None
    failed_stage: str | None = None

    @property
    def shift_down_s(self) -> float:
        return self.stage_s.get("shift_down", 0.0)

    @property
    def shift_up_s(self) -> float:
        return self.stage_s.get("shift_up", 0.0)

    def phase_totals(self, direction: str) -> dict[str, float]:
        """Seconds per phase summed over the replicas shifted in ``direction``."""
        out: dict[str, float] = {}
        for r in self.down if direction == "down" else self.up:
            for k, v in r.phases.items():
                out[k] = out.get(k, 0.0) + v
        return out


def counter_ids() -> Callable[[Role], str]:
    """Replica ids ``<role>-<n>``, unique within one executor."""
    counters = {r: itertools.count() for r in Role}
    return lambda role: f"{role.value}-{next(counters[role])}"


@dataclass
class ShiftExecutor:
    """Carries out shift plans through ports.

    A plan with donors but no shift-up groups is a release (the rule-based strategy's
    shift down to the idle pool): it runs the migrate-down and shift-down stages only.

    Args:
        shifter: the runtime's shifter (device map + slot backend).
        schedulers: the scheduler of each inference role.
        replicas: the driver's replica port.
        new_replica_id: names each shift-up replica; must never repeat.
    """

    shifter: Shifter
    schedulers: Mapping[Role, SchedulerPort]
    replicas: ReplicaPort
    new_replica_id: Callable[[Role], str] = field(default_factory=counter_ids)
    before_migrate_up: Callable[[Role, list[ReplicaView]], Steps[None] | None] | None = None
    """Called with the replicas that came up, before they get work (the cluster driver
    refreshes rollout replicas whose policy was published while they shifted up); it may
    return steps (``pivot.waits``), which are run blocking or awaited."""

    def execute(self, plan: ShiftPlan) -> ShiftReport:
        """Runs ``plan``; raises StateError (nothing done) or ShiftError (with ``.report``)."""
        stages = self._stages(plan)
        request = _resume(stages)   # validation errors raise here, before any work
        while not isinstance(request, ShiftReport):
            try:
                result = self._slot_work(request)
            except Exception as exc:  # noqa: BLE001 - handled inside the stages
                request = _resume(stages, exc=exc)
            else:
                request = _resume(stages, result)
        return request

    async def execute_async(self, plan: ShiftPlan) -> ShiftReport:
        """``execute`` for a caller on an asyncio loop: the same stages, but the slot work
        of the shift-down and shift-up stages is awaited, so the loop keeps serving the
        other replicas meanwhile (polls, dispatch, publish). Scheduler and device-map
        changes still happen on the loop's thread, between two awaits."""
        stages = self._stages(plan)
        request = _resume(stages)   # validation errors raise here, before any work
        while not isinstance(request, ShiftReport):
            try:
                result = await self._slot_work_async(request)
            except Exception as exc:  # noqa: BLE001 - handled inside the stages
                request = _resume(stages, exc=exc)
            else:
                request = _resume(stages, result)
        return request

    def _slot_work(self, request: tuple) -> Any:
        kind = request[0]
        if kind == "migrate":
            return self.replicas.apply(request[1]())
        if kind == "hook":
            steps = self.before_migrate_up(request[1], request[2])
            return None if steps is None else run_blocking(steps)
        if kind == "down":
            return self.shifter.shift_down_many(request[1], request[2])
        return self.shifter.shift_up_many(request[1], request[2])

    async def _slot_work_async(self, request: tuple) -> Any:
        kind = request[0]
        if kind == "migrate":
            if hasattr(self.replicas, "migrate_async"):
                return await self.replicas.migrate_async(request[1])
            return self.replicas.apply(request[1]())
        if kind == "hook":
            steps = self.before_migrate_up(request[1], request[2])
            return None if steps is None else await run_async(steps)
        if kind == "down":
            return await self.shifter.shift_down_many_async(request[1], request[2])
        return await self.shifter.shift_up_many_async(request[1], request[2])

    def _stages(self, plan: ShiftPlan) -> Generator[tuple, Any, ShiftReport]:
        """The four stages of a plan. Yields the work it needs and is sent its result:
        slot work ``("down", replica_ids, to_role)`` or ``("up", role, [(replica_id,
        devices)])`` (per-replica results), a migration ``("migrate", actions_of)`` (the
        scheduler's call that returns the actions, run with their application as one
        operation; its MigrationStats) or ``("hook", role, views)``; returns the report.
        Written once for ``execute`` and ``execute_async``."""
        donors = self.validate(plan)
        clock = self.shifter.device_map.clock
        report = ShiftReport(plan.up_role)
        start = clock()
        stage = "migrate_down"
        try:
            t = clock()
            for role in INFERENCE_ROLES:
                ids = [d.replica_id for d in donors if d.role is role]
                if ids:
                    sched = self.schedulers[role]
                    report.migration_down.add((yield ("migrate", partial(sched.shift_down,
                                                                         ids))))
            report.stage_s[stage] = clock() - t

            # Donors shift down together, then the new replicas shift up together: their
            # slot work overlaps where the backend allows (``Shifter.shift_*_many``).
            stage = "shift_down"
            t = clock()
            # A donor whose slot died during the migration is gone from the device map
            # (the driver's fault handling marked it LOST and requeued its sequences):
            # there is nothing left to shift down, nor to shift up on its devices.
            real = [d for d in donors if d.role is not None
                    and self.shifter.device_map.replica_devices(d.replica_id)]
            lost = set(self.shifter.device_map.devices_in(SlotKind.LOST))
            groups = [tuple(g) for g in plan.up_devices if not lost & set(g)]
            gone = lost & ({x for d in donors for x in d.devices}
                           | {x for g in plan.up_devices for x in g})
            if gone:
                log.warning("devices %s were lost during the migration; the plan goes on "
                            "without them", sorted(gone))
            if real:
                # A plan with no shift-up group only releases its donors to the idle pool.
                results = yield ("down", [d.replica_id for d in real],
                                 plan.up_role if plan.up_devices else None)
                for d, res in zip(real, results):
                    if not isinstance(res, ShiftError):
                        report.down.append(ShiftRecord("down", d.role, d.replica_id,
                                                       d.devices, res.phases, res.seconds))
                _raise_first(results)
            report.stage_s[stage] = clock() - t

            stage = "shift_up"
            t = clock()
            if groups:
                ids = [self.new_replica_id(plan.up_role) for _ in groups]
                results = yield ("up", plan.up_role, list(zip(ids, groups)))
                for rid, devs, res in zip(ids, groups, results):
                    if isinstance(res, ShiftError):
                        continue
                    report.up.append(ShiftRecord("up", plan.up_role, rid, devs, res.phases,
                                                 res.seconds))
                    if plan.up_role is not Role.TRAINING:
                        report.new_replicas.append(
                            ReplicaView(rid, plan.up_role, devs, res.kv_capacity))
                _raise_first(results)
            report.stage_s[stage] = clock() - t

            stage = "migrate_up"
            t = clock()
            if report.new_replicas:
                if self.before_migrate_up is not None:
                    yield ("hook", plan.up_role, list(report.new_replicas))
                report.migration_up.add((yield self._migrate_up(plan, report)))
            report.stage_s[stage] = clock() - t
        except Exception as exc:
            if stage == "shift_up" and report.new_replicas:
                # Replicas that did come up must still serve, or their devices sit unused.
                try:
                    report.migration_up.add((yield self._migrate_up(plan, report)))
                except Exception:  # noqa: BLE001 - the original failure is what we report
                    log.exception("handing the replicas that came up to the scheduler failed")
            report.error = f"{type(exc).__name__}: {exc}"
            report.failed_stage = stage
            report.total_s = clock() - start
            log.error("shift plan to %s failed in %s: %s", plan.up_role.value, stage, exc)
            raise ShiftError(f"shift plan to {plan.up_role.value} failed in stage {stage}: "
                             f"{exc}", report) from exc
        report.total_s = clock() - start
        return report

    def _migrate_up(self, plan: ShiftPlan, report: ShiftReport) -> tuple:
        """The shift-up migration onto the new replicas still in the device map (one whose
        slot died since it came up was marked LOST: it gets no work)."""
        sched = self.schedulers[plan.up_role]
        dm = self.shifter.device_map
        views = [v for v in report.new_replicas if dm.replica_devices(v.replica_id)]
        return ("migrate", partial(sched.shift_up, views) if views else list)

    def validate(self, plan: ShiftPlan) -> list[ShiftDown]:
        """Checks ``plan`` against the device map; returns the donors with training's
        replica id filled in. Raises StateError naming the donor, field and fix."""
        dm = self.shifter.device_map
        if not plan.up_devices and not any(d.role is not None for d in plan.down):
            raise StateError("ShiftPlan has no shift-up devices and no donor to release; a "
                             "plan must shift something up or release a replica to idle")
        if plan.up_role is Role.TRAINING and len(plan.up_devices) != 1:
            raise StateError(f"ShiftPlan.up_devices has {len(plan.up_devices)} groups for "
                             f"training; training shifts up as one group (sec. 5.2)")
        if plan.up_role in INFERENCE_ROLES and plan.up_role not in self.schedulers:
            raise StateError(f"no scheduler for {plan.up_role.value}; pass one in "
                             f"ShiftExecutor.schedulers")
        donors: list[ShiftDown] = []
        freed: set[int] = set()
        for d in plan.down:
            if d.role is None:
                bad = [x for x in d.devices if dm.state(x).kind is not SlotKind.IDLE]
                if bad:
                    raise StateError(f"ShiftPlan.down: idle donor lists devices {bad} that "
                                     f"are {[dm.state(x).describe() for x in bad]}")
            else:
                rid = d.replica_id
                if d.role is Role.TRAINING and rid is None:
                    rid = self.shifter.training_replica()
                    if rid is None:
                        raise StateError("ShiftPlan.down names training, but no training "
                                         "replica is active in the device map")
                elif d.role in INFERENCE_ROLES and d.role not in self.schedulers:
                    raise StateError(f"ShiftPlan.down: no scheduler for {d.role.value}; pass "
                                     f"one in ShiftExecutor.schedulers")
                held = dm.replica_devices(rid) if rid else ()
                if not held or set(held) != set(d.devices) or any(
                        dm.state(x).kind is not SlotKind.ACTIVE
                        or dm.state(x).role is not d.role for x in held):
                    raise StateError(
                        f"ShiftPlan.down: donor {d.role.value} replica {rid} with devices "
                        f"{list(d.devices)} does not match the device map "
                        f"({_describe(dm, d.devices)}); "
                        f"re-plan from a fresh snapshot")
                d = ShiftDown(d.role, rid, d.devices)
            if freed & set(d.devices):
                raise StateError(f"ShiftPlan.down: devices {sorted(freed & set(d.devices))} "
                                 f"are donated twice")
            freed |= set(d.devices)
            donors.append(d)
        usable = freed | set(dm.devices_in(SlotKind.IDLE))
        seen: set[int] = set()
        for group in plan.up_devices:
            if not group:
                raise StateError("ShiftPlan.up_devices holds an empty device group")
            if seen & set(group):
                raise StateError(f"ShiftPlan.up_devices: devices {sorted(seen & set(group))} "
                                 f"are in two shift-up groups")
            seen |= set(group)
            missing = sorted(set(group) - usable)
            if missing:
                raise StateError(
                    f"ShiftPlan.up_devices: devices {missing} are neither idle nor freed by "
                    f"the plan's donors ({_describe(dm, missing)})")
        return donors


def _raise_first(results: Sequence[object]) -> None:
    """Raises the first per-replica ShiftError of a ``Shifter.shift_*_many`` call."""
    for r in results:
        if isinstance(r, ShiftError):
            raise r


def _resume(stages: Generator, value: object = None, exc: BaseException | None = None):
    """Sends the slot work's result (or throws its exception) into the stages; returns
    the next request, or the report once they finished."""
    try:
        return stages.throw(exc) if exc is not None else stages.send(value)
    except StopIteration as stop:
        return stop.value


def _describe(dm: DeviceMap, devices) -> list[str]:
    """The device map's state of each of ``devices`` that exists, for error messages."""
    return [dm.state(x).describe() for x in devices if 0 <= x < dm.num_devices]
