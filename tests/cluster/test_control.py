"""The local control plane's rules for a failed shift plan (``pivot.cluster.control``), with
no engine: which failures the run goes on past, and the cause it reports."""

from types import SimpleNamespace

import pytest

from pivot.cluster.control import root_cause, survivable
from pivot.runtime.pending import SlotProcessDied
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
    """The controller's surface ClusterControl and ClusterTrainer read: a training replica on
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

    from pivot.cluster.control import ClusterControl, ClusterTrainer
    from pivot.types import ShiftDown, ShiftPlan

    control = ClusterControl(_Ctl, _Fleet, object(), {}, 1, 1.0, False)
    trainer = ClusterTrainer(_Ctl, _Fleet, control, None, 0)
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


class _TrainingSlot:
    """One training slot whose AdamW state is a step count ``n``; its process can die
    mid-Write, to be replaced by a fresh one (no state, no tag)."""

    def __init__(self):
        self.n, self.tag, self.sent, self.die_in_write = 0, None, [], False

    def trainer(self, device):
        return _Answers(self)

    def reset_optimizer(self, tag):
        self.n, self.tag = 0, tag
        self.sent.append(("reset", 0))

    def set_optimizer_state(self, state, tag):
        self.n, self.tag = state["n"], tag
        self.sent.append(("set", state["n"]))

    def held_optimizer_tag(self):
        return self.tag

    def train_step(self, batch, version):
        self.n += 1
        self.tag = (self.tag[0], version + 1)
        return {}

    def optimizer_state(self):
        return {"n": self.n}

    def write_back_replica(self, devices):
        async def wait():
            if self.die_in_write:
                self.die_in_write, self.n, self.tag = False, 0, None   # replaced
                raise SlotProcessDied("slot 0: its process died mid-Write")
            return 0.0
        return SimpleNamespace(wait=wait)


class _Answers:
    """``MeshController.trainer``'s handle over a ``_TrainingSlot``: each call runs at once
    and is returned answered."""

    def __init__(self, slot):
        self.slot = slot

    @staticmethod
    def _answered(out):
        return SimpleNamespace(get=lambda: out)

    def reset_optimizer(self, tag=None):
        return self._answered(self.slot.reset_optimizer(tag))

    def set_optimizer_state(self, state, tag=None):
        return self._answered(self.slot.set_optimizer_state(state, tag))

    def held_optimizer_tag(self):
        return self._answered(self.slot.held_optimizer_tag())

    def train_step(self, batch, version=None):
        return self._answered(self.slot.train_step(batch, version))

    def optimizer_state(self):
        return self._answered(self.slot.optimizer_state())


def test_a_slot_lost_while_publishing_takes_the_trainer_back_to_its_state_before_the_step():
    # the step's weights and AdamW state died with the slot; GPS keeps the previous
    # version, and the driver must send the state from before the step to the slot that
    # trains the batch again (not the lost step's, which it fetched after the step)
    import asyncio

    from pivot.cluster.control import ClusterTrainer
    from pivot.rl.ports import TrainingLost

    slot = _TrainingSlot()
    control = SimpleNamespace(training_devices=lambda: (0,), publishes=0)

    order = []

    async def refresh():
        order.append("refresh")
        return 0.0

    fleet = SimpleNamespace(refresh_rollout_async=refresh)
    trainer = ClusterTrainer(slot, fleet, control, None, 0)
    trainer.train_batch(None, 0)
    asyncio.run(trainer.publish(1, lambda: order.append("written")))
    assert order == ["written", "refresh"]   # the loop advances before the Read
    trainer.train_batch(None, 1)
    assert trainer.optimizer == {"n": 2}
    slot.die_in_write = True
    with pytest.raises(TrainingLost, match="publishing version 2"):
        asyncio.run(trainer.publish(2, lambda: order.append("written")))
    assert order == ["written", "refresh"]   # neither after a Write that did not commit
    assert trainer.optimizer == {"n": 1} and control.publishes == 1
    trainer.train_batch(None, 1)                      # on the replaced slot
    asyncio.run(trainer.publish(2))
    assert slot.sent == [("reset", 0), ("set", 1)] and trainer.optimizer == {"n": 2}


class _Call:
    """A started slot call: answers ``value``, raises ``error``, or never answers."""

    def __init__(self, value=None, error=None):
        self.value, self.error = value, error

    def get(self, within=None):
        if self.error is not None:
            raise self.error
        if self.value is None:   # hangs: only a bounded wait returns
            if within is None:
                raise AssertionError("waited without a bound on a call that never answers")
            raise TimeoutError("no answer")
        return self.value


def _trainer_over(calls):
    from pivot.cluster.control import ClusterTrainer

    ctl = SimpleNamespace(trainer=lambda d: SimpleNamespace(
        train_step=lambda batch, version=None: calls[d],
        optimizer_state=lambda: calls[d]))
    return ClusterTrainer(ctl, None, SimpleNamespace(), None, 0)


def test_a_rank_that_died_is_what_a_replica_call_raises_not_the_other_ranks_error():
    # rank 1's process died; rank 0's collective lost its peer and failed first
    calls = [_Call(error=RuntimeError("gloo: connection closed by peer")),
             _Call(error=SlotProcessDied("slot 3: its process died"))]
    with pytest.raises(SlotProcessDied):
        _trainer_over(calls)._all((0, 1), lambda t: t.train_step(None, 0))


def test_a_rank_error_is_raised_after_a_bounded_wait_for_a_rank_stuck_in_a_collective(
        monkeypatch):
    import pivot.cluster.control as control

    monkeypatch.setattr(control, "RANK_GRACE_S", 0.01)
    calls = [_Call(error=ValueError("bad batch")), _Call()]
    with pytest.raises(ValueError, match="bad batch"):
        _trainer_over(calls)._all((0, 1), lambda t: t.train_step(None, 0))
    assert _trainer_over([_Call(value=1), _Call(value=2)])._all(
        (0, 1), lambda t: t.optimizer_state()) == [1, 2]
