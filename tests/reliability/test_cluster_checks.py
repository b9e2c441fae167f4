"""The cluster driver's invariant checker on the real fleet, schedulers, device map and
workflow, over in-process fake engines (no vLLM, no Monarch): a clean run through abort and
resume has no violation and counts the resume; each kind of corruption is caught."""

import asyncio
from types import SimpleNamespace

import pytest

from pivot.cluster.fleet import Fleet
from pivot.models.tokenizer import TextCodec
from pivot.testing.fleet import FakeCtl
from pivot.reliability.invariants import InvariantError
from pivot.reliability.cluster_checks import ClusterChecker
from pivot.rl.data import PromptStream
from pivot.rl.staleness import StalenessBound
from pivot.rl.workflow import RLWorkflow
from pivot.roles.engine.requests import SampleSpec
from pivot.scheduler.scheduler import ShiftAwareScheduler
from pivot.scheduler.throughput import ThroughputModel
from pivot.types import GENRM, INFERENCE_ROLES, POLICY, ReplicaView, Role

KV = 1000


def _up(ctl, scheds, role, rid, device):
    ctl.device_map.begin_shift_up((device,), role, rid)
    ctl.device_map.end_shift_up((device,))
    scheds[role].add_replicas([ReplicaView(rid, role, (device,), KV)])


def _fleet(ctl, tick, checker: ClusterChecker):
    """Rollout replica r0 (device 0) and reward replica r1 (device 1) of ``ctl``, their
    fleet, a workflow of 2 steps and ``checker`` attached to a control whose tick is
    ``tick``."""
    scheds = {r: ShiftAwareScheduler(r, ThroughputModel(1e-6, 0.01, 4e-4, 0.0))
              for r in INFERENCE_ROLES}
    _up(ctl, scheds, Role.ROLLOUT, "r0", 0)
    _up(ctl, scheds, Role.REWARD, "r1", 1)
    spec = SampleSpec(max_tokens=8)
    codec = TextCodec(lambda s: [1, 2, 3], lambda ids: " ".join(map(str, ids)), None, None)
    fleet = Fleet(ctl, scheds, {POLICY: codec, GENRM: codec}, spec, spec, sample_seed=0)
    wf = RLWorkflow(PromptStream(prompts_per_step=1, num_val=4), 2, 2, StalenessBound(2),
                    lambda s: [1, 2, 3])
    control = SimpleNamespace(tick=tick, training_devices=lambda: (), busy=False)
    driver = SimpleNamespace(fleet=fleet, control=control, ctl=ctl, kv_capacity=KV,
                             dep=SimpleNamespace(staleness=2), resume=False)
    checker.attach(driver, wf)
    return scheds, fleet, wf, control


@pytest.fixture
def run():
    """A fleet with rollout replica r0 (device 0) and reward replica r1 (device 1), the
    released trajectories of steps 0 and 1 submitted, a checker attached."""
    ctl = FakeCtl()
    checker = ClusterChecker(slot_every=1)
    scheds, fleet, wf, control = _fleet(ctl, lambda status: None, checker)
    trajs = wf.release()
    fleet.submit(Role.ROLLOUT, trajs)
    return SimpleNamespace(ctl=ctl, scheds=scheds, fleet=fleet, wf=wf, control=control,
                           checker=checker, trajs=trajs)


def _deliver(r):
    """What the loop does with finished responses and judgements."""
    for x in r.fleet.responses:
        t = r.wf.responded(x.traj_id, x.tokens, x.logprobs, x.text, x.finish_reason)
        r.fleet.submit(Role.REWARD, [t])
    r.fleet.responses = []
    for j in r.fleet.judgements:
        r.wf.judged(j.traj_id, j.text)
    r.fleet.judgements = []


def test_a_clean_run_through_abort_and_resume_has_no_violation(run):
    eng = run.ctl.engines[0]
    eng.step(7)
    eng.step(8)
    run.fleet.apply(run.scheds[Role.ROLLOUT].abort("r0"))   # as a shift down would
    run.control.tick(None)
    run.fleet.dispatch()                                     # resumed on r0
    assert all(toks == [7, 8] for _, toks in eng.live.values())
    eng.step(9)
    for sid in list(eng.live):
        eng.finish(sid)
    run.fleet.poll()
    _deliver(run)
    for sid in list(run.ctl.engines[1].live):
        run.ctl.engines[1].finish(sid)
    run.fleet.poll()
    run.control.tick(None)
    _deliver(run)
    for _ in range(2):
        run.wf.take_batch()
        run.wf.trained()
    run.checker.finish()
    c = run.checker.report()
    assert c["violations"] == 0, c["messages"]
    assert c["checks"] == {"tick": 2, "poll": 2, "end": 1} and c["slot_checks"] == 3
    assert c["aborts"] == 4 and c["aborted_with_tokens"] == 4 and c["resumed"] == 4
    assert c["finished"] == 8 and c["prefix_checks"] == 12


def test_a_sequence_whose_engine_step_failed_resumes_from_its_tokens(run):
    """A failed step loses nothing: the sequence goes back to the queue with its tokens
    and finishes on the next dispatch; after ``max_retries`` failures it is kept as it
    stands."""
    eng = run.ctl.engines[0]
    eng.step(7)
    first, last = min(eng.live), max(eng.live)
    eng.fail(first)
    run.fleet.poll()                       # queued again and dispatched to r0 at once
    assert run.fleet.responses == [] and eng.live[first][1] == [7]
    assert run.fleet.retried == 1 and run.fleet.retries == {first: 1}
    eng.step(9)
    eng.finish(first)
    run.fleet.max_retries = 0              # the next failure is final
    eng.fail(last)
    run.fleet.poll()
    got = {2 * r.traj_id: r for r in run.fleet.responses}
    assert got[first].tokens == [7, 9] and got[first].finish_reason == "length"
    assert got[last].tokens == [7, 9] and got[last].finish_reason == "error"
    assert run.fleet.retries == {} and last not in run.scheds[Role.ROLLOUT].seqs
    c = run.checker.report()
    assert c["violations"] == 0, c["messages"]
    assert c["failed_steps"] == 1 and c["resumed"] == 1


def test_a_resumed_sequence_whose_tokens_lost_their_prefix_is_caught(run):
    eng = run.ctl.engines[0]
    eng.step(7)
    run.fleet.apply(run.scheds[Role.ROLLOUT].abort("r0"))
    run.fleet.dispatch()
    sid = min(eng.live)
    eng.finish(sid, tokens=[6, 6])
    run.fleet.poll()
    msgs = run.checker.report()["messages"]
    assert any(f"I5 sequence {sid}" in m for m in msgs), msgs


@pytest.mark.parametrize("corrupt, want", [
    ("drop_from_scheduler", "I1 rollout: sequences [0] lost"),
    ("engine_runs_unknown", "I1 engine r0 runs sequences [999]"),
    ("engine_over_kv", "I4 engine r0"),
    ("slot_in_other_role", "I3 slot 2 holds reward"),
    ("device_left_shifting", "I3 device 3 left shifting_up"),
    ("rejected_dispatch", "I1 engines rejected sequences [2]"),
])
def test_each_corruption_is_caught(run, corrupt, want):
    sched = run.scheds[Role.ROLLOUT]
    if corrupt == "drop_from_scheduler":
        sched.abort("r0")   # back in the queue, then gone
        sched.queue.remove(0)
        del sched.seqs[0]
    elif corrupt == "engine_runs_unknown":
        run.ctl.engines[0].live[999] = (3, [])
    elif corrupt == "engine_over_kv":
        run.ctl.engines[0].live[0] = (KV, [1])
    elif corrupt == "slot_in_other_role":
        run.ctl.slot_override[2] = (Role.REWARD, "r9")
    elif corrupt == "device_left_shifting":
        run.ctl.device_map.begin_shift_up((3,), Role.REWARD, "r5")
    elif corrupt == "rejected_dispatch":
        run.fleet.port.rejected[2] = "no room"
    run.fleet.poll()
    run.control.tick(None)
    msgs = run.checker.report()["messages"]
    assert any(want in m for m in msgs), msgs


def test_strict_raises_at_the_first_violation(run):
    run.checker.strict = True
    run.ctl.engines[0].live[999] = (3, [])
    with pytest.raises(InvariantError, match="999"):
        run.fleet.poll()


def test_a_publish_refreshes_a_rollout_replica_the_scheduler_does_not_know_yet():
    """A shift up is active in the device map before the executor hands the replica to
    the scheduler: a publish in that window refreshes it and aborts nothing there."""
    ctl = FakeCtl()
    scheds = {r: ShiftAwareScheduler(r, ThroughputModel(1e-6, 0.01, 4e-4, 0.0))
              for r in INFERENCE_ROLES}
    _up(ctl, scheds, Role.ROLLOUT, "r0", 0)
    ctl.device_map.begin_shift_up((1,), Role.ROLLOUT, "r1")
    ctl.device_map.end_shift_up((1,))          # not yet in the rollout scheduler
    codec = TextCodec(lambda s: [1, 2, 3], lambda ids: " ".join(map(str, ids)), None, None)
    spec = SampleSpec(max_tokens=8)
    fleet = Fleet(ctl, scheds, {POLICY: codec, GENRM: codec}, spec, spec, sample_seed=0)
    fleet.refresh_rollout()
    assert ctl.engines[0].refreshed == ctl.engines[1].refreshed == 1


class GatedCtl(FakeCtl):
    """Submits answer only once ``gate`` opens (a TP replica's rank 0 waiting for its
    follower): the fleet's dispatch is in flight, its placements made, meanwhile."""

    def __init__(self):
        super().__init__()
        self.gate: asyncio.Event | None = None

    def start(self, device, name, call):
        out = super().start(device, name, call).get()
        gate = self.gate if name == "submit" else None

        async def wait():
            if gate is not None:
                await gate.wait()
            return out
        return SimpleNamespace(wait=wait, get=lambda: out)


def test_a_tick_that_ends_mid_dispatch_is_checked_once_the_dispatch_returned():
    ctl = GatedCtl()

    async def tick(status):
        await asyncio.sleep(0)

    checker = ClusterChecker()
    _, fleet, wf, control = _fleet(ctl, tick, checker)

    async def scenario():
        ctl.gate = asyncio.Event()
        sub = asyncio.create_task(fleet.submit_async(Role.ROLLOUT, wf.release()))
        while not ctl.engines[0].live:        # the scheduler placed them, the engine has them
            await asyncio.sleep(0)
        assert all(s.replica_id is None for s in fleet.port.sequences.values())
        asyncio.get_running_loop().call_later(0.05, ctl.gate.set)
        await control.tick(None)
        await sub

    asyncio.run(scenario())
    c = checker.report()
    assert c["checks"]["tick"] == 1
    assert c["violations"] == 0, c["messages"]
