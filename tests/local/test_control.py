"""The local control plane's rules for a failed shift plan (``pivot.local.control``), with
no engine: which failures the run goes on past, and the cause it reports."""

import pytest

from pivot.local.control import root_cause, survivable
from pivot.shifting.executor import ShiftReport
from pivot.types import Role


def _failed(stage: str | None) -> ShiftReport:
    rep = ShiftReport(Role.REWARD)
    rep.failed_stage = stage
    return rep


@pytest.mark.parametrize("stage,ok", [("shift_up", True), ("shift_down", True),
                                      ("migrate_down", False), ("migrate_up", False)])
def test_only_slot_work_failures_are_survived(stage, ok):
    # a migration that failed may have left the schedulers mid-change: the run stops
    assert survivable(_failed(stage), 0, 2) is ok


def test_the_run_stops_at_the_failure_past_its_allowance():
    rep = _failed("shift_up")
    assert [survivable(rep, n, 2) for n in range(4)] == [True, True, False, False]
    assert not survivable(rep, 0, 0)          # 0: the first failure ends the run
    assert not survivable(None, 0, 2)         # a failure with no report of what was done


def test_the_cause_is_the_remote_tracebacks_last_line():
    err = ("ShiftError: shift up of reward replica reward-1 failed: Actor call failed.\n"
           " Traceback (most recent call last):\n  File \"slot.py\", line 1, in shift_up\n"
           "pivot.runtime.slot.InjectedFault: slot 1: injected fault\n\n")
    assert root_cause(err) == "pivot.runtime.slot.InjectedFault: slot 1: injected fault"
    assert root_cause("one line") == "one line"


class _Ctl:
    """The controller's surface LocalControl and LocalTrainer read: a training replica on
    slot 0, nothing lost or dead."""

    faults_reported = False

    @staticmethod
    def reported_dead(device):
        return False

    class shifter:   # noqa: N801 - the attribute's name
        device_map = None

        @staticmethod
        def training_replica():
            return "training-0"

    class device_map:   # noqa: N801
        @staticmethod
        def replica_devices(rid):
            return (0,)

        @staticmethod
        def devices_in(kind):
            return ()


class _Fleet:
    schedulers: dict = {}


def test_no_step_starts_on_training_while_a_plan_takes_it_down():
    # the planner took idle training as a donor; while the plan's migration runs, a batch
    # became ready: the trainer must not report ready until the plan is done
    import asyncio

    from pivot.local.control import LocalControl, LocalTrainer
    from pivot.planner.plan import ShiftDown, ShiftPlan

    control = LocalControl(_Ctl, _Fleet, object(), {}, 1, 1.0, False)
    trainer = LocalTrainer(_Ctl, _Fleet, control, None, 0)
    seen = []

    class Executor:
        async def execute_async(self, plan):
            seen.append(trainer.ready())
            return ShiftReport(plan.up_role)

    control.executor = Executor()
    take = ShiftPlan(Role.ROLLOUT, (ShiftDown(Role.TRAINING, None, (0,)),), ((0,),))
    keep = ShiftPlan(Role.ROLLOUT, (ShiftDown(Role.REWARD, "reward-0", (1,)),), ((1,),))
    assert trainer.ready()
    asyncio.run(control.execute_async(take))
    asyncio.run(control.execute_async(keep))
    assert seen == [False, True] and trainer.ready()
