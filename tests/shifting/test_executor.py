"""The shift executor with fake ports: call order, validation, and failures (sec. 4)."""

import pytest

from pivot.errors import StateError
from pivot.shifting.device_map import DeviceMap, replay
from pivot.shifting.executor import MigrationStats, ShiftExecutor
from pivot.shifting.role_shift import SlotKind
from pivot.shifting.shifter import ShiftError, ShiftResult, Shifter
from pivot.types import Role, ShiftDown, ShiftPlan


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class Recorder:
    """Fake ports that log each call and advance a virtual clock."""

    def __init__(self, clock, fail_on=None):
        self.calls, self.clock, self.fail_on = [], clock, fail_on

    def _hit(self, name, cost):
        self.calls.append(name)
        self.clock.t += cost
        if self.fail_on and name.startswith(self.fail_on):
            raise RuntimeError(f"{name} broke")

    # SlotBackend
    def shift_down(self, role, replica_id, devices):
        self._hit(f"backend.down:{replica_id}", 1.0)
        return ShiftResult({"discard_temporary": 0.25, "discard_parameters": 0.75})

    def shift_up(self, role, replica_id, devices):
        self._hit(f"backend.up:{replica_id}", 2.0)
        return ShiftResult({"read_parameters": 1.5, "reallocate_temporary": 0.5},
                           kv_capacity=4096)

    # ReplicaPort
    def apply(self, actions):
        self._hit(f"apply:{','.join(actions)}", 0.125)
        return MigrationStats(aborted=len(actions), abort_s=0.125)


class FakeScheduler:
    def __init__(self, rec, role):
        self.rec, self.role, self.new = rec, role, None

    def shift_down(self, replica_ids):
        self.rec._hit(f"{self.role.value}.shift_down:{','.join(replica_ids)}", 0.0)
        return [f"abort@{r}" for r in replica_ids]

    def shift_up(self, new_replicas):
        self.new = list(new_replicas)
        ids = ",".join(r.replica_id for r in new_replicas)
        self.rec._hit(f"{self.role.value}.shift_up:{ids}", 0.0)
        return [f"dispatch@{r.replica_id}" for r in new_replicas]


def setup(fail_on=None):
    clock = Clock()
    rec = Recorder(clock, fail_on)
    dm = DeviceMap((0, 0, 0, 0, 1, 1), clock=clock)
    for devs, role, rid in (((0,), Role.ROLLOUT, "ro-a"), ((1,), Role.ROLLOUT, "ro-b"),
                            ((2, 3), Role.TRAINING, "tr"), ((4,), Role.REWARD, "rm-a")):
        dm.begin_shift_up(devs, role, rid)
        dm.end_shift_up(devs)
    schedulers = {r: FakeScheduler(rec, r) for r in (Role.ROLLOUT, Role.REWARD)}
    ex = ShiftExecutor(Shifter(dm, rec), schedulers, rec)
    return ex, rec, dm, schedulers, clock


PLAN = ShiftPlan(Role.REWARD, (ShiftDown(Role.ROLLOUT, "ro-a", (0,)),
                               ShiftDown(Role.ROLLOUT, "ro-b", (1,)),
                               ShiftDown(None, None, (5,))),
                 ((0,), (1,), (5,)))


def test_a_plan_runs_migrate_down_then_shift_down_then_shift_up_then_migrate_up():
    ex, rec, dm, sch, _ = setup()
    report = ex.execute(PLAN)
    assert rec.calls == [
        "rollout.shift_down:ro-a,ro-b", "apply:abort@ro-a,abort@ro-b",
        "backend.down:ro-a", "backend.down:ro-b",
        "backend.up:reward-0", "backend.up:reward-1", "backend.up:reward-2",
        "reward.shift_up:reward-0,reward-1,reward-2",
        "apply:dispatch@reward-0,dispatch@reward-1,dispatch@reward-2",
    ]
    assert report.stage_s == {"migrate_down": 0.125, "shift_down": 2.0, "shift_up": 6.0,
                              "migrate_up": 0.125}
    assert report.total_s == 8.25
    assert report.phase_totals("up") == {"read_parameters": 4.5, "reallocate_temporary": 1.5}
    assert [v.kv_capacity for v in sch[Role.REWARD].new] == [4096] * 3
    assert dm.replicas(Role.REWARD) == {"rm-a": (4,), "reward-0": (0,), "reward-1": (1,),
                                        "reward-2": (5,)}
    assert report.migration_down.aborted == 2 and report.error is None
    assert len(ex.shifter.phase_events) == 2 * 2 + 3 * 2


def test_training_shifts_down_as_a_whole_and_needs_no_scheduler_call():
    ex, rec, dm, _, _ = setup()
    plan = ShiftPlan(Role.ROLLOUT, (ShiftDown(Role.TRAINING, None, (2, 3)),), ((2,), (3,)))
    report = ex.execute(plan)
    assert rec.calls[:1] == ["backend.down:tr"]
    assert report.down[0].replica_id == "tr" and report.migration_down.aborted == 0
    assert dm.replicas(Role.TRAINING) == {}


def test_a_release_plan_shifts_its_donor_down_to_idle_and_shifts_nothing_up():
    ex, rec, dm, _, _ = setup()
    plan = ShiftPlan(Role.ROLLOUT, (ShiftDown(Role.ROLLOUT, "ro-a", (0,)),), ())
    report = ex.execute(plan)
    assert "ro-a" not in dm.replicas() and 0 in dm.devices_in(SlotKind.IDLE)
    assert report.up == [] and report.new_replicas == []
    assert not any(c.startswith("backend.up") for c in rec.calls)


@pytest.mark.parametrize("plan,match", [
    (ShiftPlan(Role.REWARD, (ShiftDown(Role.ROLLOUT, "ro-a", (0, 1)),), ((0,),)),
     "donor rollout replica ro-a with devices \\[0, 1\\] does not match"),
    (ShiftPlan(Role.REWARD, (ShiftDown(Role.ROLLOUT, "ro-a", (0,)),), ((0, 1),)),
     "devices \\[1\\] are neither idle nor freed"),
    (ShiftPlan(Role.REWARD, (), ()), "no shift-up devices and no donor"),
    (ShiftPlan(Role.TRAINING, (ShiftDown(None, None, (5,)),), ((5,), (5,))),
     "training shifts up as one group"),
    (ShiftPlan(Role.REWARD, (ShiftDown(None, None, (4,)),), ((4,),)),
     "idle donor lists devices \\[4\\]"),
    (ShiftPlan(Role.REWARD, (ShiftDown(None, None, (5,)),), ((5,), (5,))),
     "in two shift-up groups"),
])
def test_a_plan_that_disagrees_with_the_device_map_is_refused_before_any_call(plan, match):
    ex, rec, dm, _, _ = setup()
    before = list(dm.states)
    with pytest.raises(StateError, match=match):
        ex.execute(plan)
    assert rec.calls == [] and dm.states == before


@pytest.mark.parametrize("fail_on,stage,lost", [
    ("rollout.shift_down:ro-a,ro-b", "migrate_down", ()),
    ("backend.down:ro-b", "shift_down", (1,)),
    ("backend.up:reward-1", "shift_up", (1,)),
    ("reward.shift_up:reward-0,reward-1,reward-2", "migrate_up", ()),
])
def test_a_failing_port_call_leaves_the_device_map_consistent(fail_on, stage, lost):
    ex, rec, dm, _, _ = setup(fail_on)
    with pytest.raises(ShiftError, match=f"failed in stage {stage}") as info:
        ex.execute(PLAN)
    report = info.value.report
    assert report.failed_stage == stage and "broke" in report.error
    assert dm.devices_in(SlotKind.LOST) == lost
    assert not dm.devices_in(SlotKind.SHIFTING_UP) and not dm.devices_in(SlotKind.SHIFTING_DOWN)
    seen = [d for devs in dm.replicas().values() for d in devs]
    assert len(seen) == len(set(seen))
    assert set(seen) | set(dm.devices_in(SlotKind.IDLE)) | set(lost) == set(range(6))
    assert replay(dm.device_host, dm.events) == dm.states
    if stage == "migrate_down":
        assert dm.replicas(Role.ROLLOUT) == {"ro-a": (0,), "ro-b": (1,)}


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_random_plans_and_failures_never_leave_a_device_twice_or_half_shifted(data):
    ex, rec, dm, _, _ = setup()
    for _ in range(data.draw(st.integers(1, 4))):
        rec.fail_on = None
        reps = sorted(dm.replicas().items())
        donors = data.draw(st.lists(st.sampled_from(reps), unique=True, max_size=3)) if reps else []
        down = tuple(ShiftDown(dm.state(devs[0]).role,
                               None if dm.state(devs[0]).role is Role.TRAINING else rid, devs)
                     for rid, devs in donors)
        idle = dm.devices_in(SlotKind.IDLE)
        if idle and data.draw(st.booleans()):
            down += (ShiftDown(None, None, idle),)
        pool = sorted({d for s in down for d in s.devices})
        role = data.draw(st.sampled_from(list(Role)))
        groups = tuple((d,) for d in pool) if role is not Role.TRAINING else (
            (tuple(pool),) if pool else ())
        if groups and data.draw(st.booleans()):
            groups = groups[:-1] + ((groups[-1][0], 99),)  # an invalid device
        calls_before = len(rec.calls)
        rec.fail_on = data.draw(st.sampled_from(
            [None, "backend.up:" + f"{role.value}-0", "apply:"] +
            [f"backend.down:{rid}" for rid, _ in donors]))
        before = list(dm.states)
        try:
            ex.execute(ShiftPlan(role, down, groups))
        except StateError:
            assert dm.states == before and len(rec.calls) == calls_before
        except ShiftError as e:
            assert e.report.failed_stage is not None
        owner = {}
        for rid, devs in dm.replicas().items():
            for d in devs:
                assert d not in owner
                owner[d] = rid
        assert len(dm.replicas(Role.TRAINING)) <= 1
        assert not dm.devices_in(SlotKind.SHIFTING_UP)
        assert not dm.devices_in(SlotKind.SHIFTING_DOWN)
        assert replay(dm.device_host, dm.events) == dm.states


def test_replicas_that_came_up_before_a_failed_shift_up_still_reach_the_scheduler():
    ex, rec, dm, _, _ = setup("backend.up:reward-1")
    with pytest.raises(ShiftError, match="failed in stage shift_up"):
        ex.execute(PLAN)
    # every group of the stage is tried: the ones before and after the failure serve
    assert "reward.shift_up:reward-0,reward-2" in rec.calls
    assert dm.replicas(Role.REWARD).get("reward-0") == (0,)
    assert dm.replicas(Role.REWARD).get("reward-2") == (5,)


class Overlapping(Recorder):
    """A backend that can start slot calls without waiting (``start_shift_*``)."""

    def _start(self, direction, replica_id, result):
        self.calls.append(f"start.{direction}:{replica_id}")
        rec = self

        class Pending:
            def get(self):
                rec.calls.append(f"get.{direction}:{replica_id}")
                if rec.fail_on == f"get.{direction}:{replica_id}":
                    raise RuntimeError(f"{replica_id} broke")
                return result
        return Pending()

    def start_shift_down(self, role, replica_id, devices):
        return self._start("down", replica_id, ShiftResult({"discard_parameters": 0.5}))

    def start_shift_up(self, role, replica_id, devices):
        return self._start("up", replica_id, ShiftResult({"read_parameters": 1.0}, 4096))


def overlapping_setup(fail_on=None):
    ex, _, dm, sch, clock = setup()
    rec = Overlapping(clock, fail_on)
    for s in sch.values():
        s.rec = rec
    ex.shifter.backend, ex.replicas = rec, rec
    return ex, rec, dm, sch


def test_a_backend_that_can_start_calls_shifts_every_replica_of_a_stage_at_once():
    ex, rec, dm, sch = overlapping_setup()
    report = ex.execute(PLAN)
    slot = [c for c in rec.calls if c.startswith(("start", "get"))]
    assert slot == ["start.down:ro-a", "start.down:ro-b", "get.down:ro-a", "get.down:ro-b",
                    "start.up:reward-0", "start.up:reward-1", "start.up:reward-2",
                    "get.up:reward-0", "get.up:reward-1", "get.up:reward-2"]
    assert [r.replica_id for r in report.up] == ["reward-0", "reward-1", "reward-2"]
    assert dm.replicas(Role.REWARD) == {"rm-a": (4,), "reward-0": (0,), "reward-1": (1,),
                                        "reward-2": (5,)}
    assert replay(dm.device_host, dm.events) == dm.states


def test_one_replica_failing_among_overlapped_shift_ups_loses_only_its_devices():
    ex, rec, dm, sch = overlapping_setup("get.up:reward-1")
    with pytest.raises(ShiftError, match="failed in stage shift_up"):
        ex.execute(PLAN)
    assert dm.devices_in(SlotKind.LOST) == (1,)
    # the two that came up serve: the scheduler got them
    assert [v.replica_id for v in sch[Role.REWARD].new] == ["reward-0", "reward-2"]
    assert dm.replicas(Role.REWARD) == {"rm-a": (4,), "reward-0": (0,), "reward-2": (5,)}
    assert not dm.devices_in(SlotKind.SHIFTING_UP)
    assert replay(dm.device_host, dm.events) == dm.states
