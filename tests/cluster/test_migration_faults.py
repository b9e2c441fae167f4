"""A slot that dies inside a shift's migration (sec. 6.2, alg. 3 and 4) loses no sequence
and does not end the run: the real executor, fleet, schedulers and ``SlotFaults`` over
in-process engines (``pivot.testing.fleet``), with a slot killed at its first abort or
submit of the migration."""

import asyncio
from types import SimpleNamespace

import pytest

from pivot.cluster.faults import SlotDied, SlotFaults
from pivot.cluster.fleet import Fleet
from pivot.models.tokenizer import TextCodec
from pivot.rl.data import PromptStream
from pivot.rl.staleness import StalenessBound
from pivot.rl.workflow import RLWorkflow
from pivot.roles.engine.requests import SampleSpec
from pivot.runtime.pending import SlotProcessDied
from pivot.scheduler.scheduler import ShiftAwareScheduler
from pivot.scheduler.throughput import ThroughputModel
from pivot.shifting.executor import ShiftExecutor
from pivot.shifting.role_shift import SlotKind
from pivot.shifting.shifter import ShiftResult, Shifter
from pivot.testing.fleet import FakeCtl
from pivot.types import GENRM, INFERENCE_ROLES, POLICY, ReplicaView, Role, ShiftDown, ShiftPlan

KV = 1000


class SlotBackend:
    """The shifter's slot calls on ``FakeCtl``: a dead slot's shift raises, as its
    process's would."""

    def __init__(self, ctl: FakeCtl):
        self.ctl = ctl

    def _alive(self, devices):
        dead = [d for d in devices if d in self.ctl.dead]
        if dead:
            raise SlotProcessDied(f"slot(s) {dead} died")

    def shift_down(self, role, replica_id, devices):
        self._alive(devices)
        return ShiftResult({"discard_parameters": 0.0})

    def shift_up(self, role, replica_id, devices):
        self._alive(devices)
        return ShiftResult({"read_parameters": 0.0}, kv_capacity=KV)


def setup(rollout_devices: tuple[int, ...], tokens: int = 3):
    """Rollout replicas on ``rollout_devices``, reward on device 1, 16 responses
    dispatched and ``tokens`` tokens generated for each; the executor, fleet and
    ``SlotFaults`` wired as ``ClusterControl`` wires them."""
    ctl = FakeCtl()
    scheds = {r: ShiftAwareScheduler(r, ThroughputModel(1e-6, 0.01, 4e-4, 0.0))
              for r in INFERENCE_ROLES}
    for role, d in [(Role.ROLLOUT, d) for d in rollout_devices] + [(Role.REWARD, 1)]:
        rid = f"{role.value[:2]}{d}"   # not the executor's '<role>-<n>' names
        ctl.device_map.begin_shift_up((d,), role, rid)
        ctl.device_map.end_shift_up((d,))
        scheds[role].add_replicas([ReplicaView(rid, role, (d,), KV)])
    spec = SampleSpec(max_tokens=64)
    codec = TextCodec(lambda s: [1, 2, 3], lambda ids: " ".join(map(str, ids)), None, None)
    fleet = Fleet(ctl, scheds, {POLICY: codec, GENRM: codec}, spec, spec, sample_seed=0)
    wf = RLWorkflow(PromptStream(prompts_per_step=4, num_val=4), 2, 2, StalenessBound(2),
                    lambda s: [1, 2, 3])
    trajs = wf.release()
    fleet.submit(Role.ROLLOUT, trajs)
    for d in rollout_devices:
        for _ in range(tokens):
            ctl.engines[d].step()
    fleet.poll()   # the schedulers learn the lengths; nothing finished
    ex = ShiftExecutor(Shifter(ctl.device_map, SlotBackend(ctl)), scheds, fleet)

    async def execute(plan):
        await ex.execute_async(plan)
    return SimpleNamespace(ctl=ctl, scheds=scheds, fleet=fleet, ex=ex, execute=execute,
                           seq_ids={2 * t.traj_id for t in trajs})


async def run_plan(r, plan):
    """The plan on the loop with the fleet's fault handling, as ``ClusterControl`` runs it;
    then the dead slot's replacement and its return to its role."""
    faults = SlotFaults(r.ctl, r.fleet, r.execute, wait_s=0.5)
    r.fleet.on_slot_error = faults.after_error
    report = await r.ex.execute_async(plan)
    for task, _, _ in list(faults._replacing.values()):
        await task
    await faults._return_replaced()
    return report, faults


def where(r) -> dict[int, str | None]:
    """Each response's place, checked against the engines: the replica whose engine
    holds it, or None when it waits in the queue and no engine holds it."""
    sched = r.scheds[Role.ROLLOUT]
    sched.check()
    assert r.fleet.port.rejected == {}   # no engine was sent a sequence it already ran
    out = {}
    for sid in r.seq_ids:
        seq = sched.seqs[sid]
        holders = [d for d, e in enumerate(r.ctl.engines) if sid in e.live]
        if seq.replica_id is None:
            assert sid in sched.queue and not holders, (sid, holders)
        else:
            # a replica of several slots is driven through its first (rank 0)
            assert holders == list(r.ctl.device_map.replica_devices(seq.replica_id))[:1], \
                (sid, seq.replica_id, holders)
        out[sid] = seq.replica_id
    return out


def tokens_of(r, sid: int) -> list[int]:
    for e in r.ctl.engines:
        if sid in e.live:
            return e.live[sid][1]
    return r.fleet.port.sequences[sid].generated_tokens or []


@pytest.mark.parametrize("dies_on", ["abort", "submit"])
def test_a_source_or_destination_dying_in_a_shift_up_migration_loses_no_sequence(dies_on):
    """Alg. 4 onto a new rollout replica on slot 3 moves sequences off slot 0. Slot 0
    dying at the migration's abort (the source), or slot 3 at its submit (the
    destination): every response still runs on a live engine or waits, and the run goes
    on; the moved sequences that were aborted keep their tokens."""
    r = setup((0,))
    plan = ShiftPlan(Role.ROLLOUT, (ShiftDown(None, None, (3,)),), ((3,),))
    victim = 0 if dies_on == "abort" else 3
    r.ctl.die(victim, when=dies_on)
    report, faults = asyncio.run(run_plan(r, plan))

    assert report.error is None
    assert [rec["devices"] for rec in faults.records] == [[victim]]
    placed = where(r)
    assert set(placed) == r.seq_ids and all(v is not None for v in placed.values())
    live = r.ctl.device_map.replicas(Role.ROLLOUT)
    assert {p for p in placed.values()} <= set(live)
    if dies_on == "submit":
        # the source aborted its moved sequences before the destination died: their
        # tokens survived into the queue and onto the source again
        assert all(tokens_of(r, s) == [5, 5, 5] for s in r.seq_ids)
    # the replaced slot returned to the idle pool (it held no replica before the plan)
    # or to rollout (it held rollout)
    assert r.ctl.device_map.state(victim).kind is not SlotKind.LOST


def test_a_donor_dying_in_a_shift_down_migration_loses_no_sequence_and_the_plan_goes_on():
    """Alg. 3 off rollout replica 'ro2' (slot 2) for a reward replica: the donor
    dies at its abort. Its sequences resume on the other rollout replica, the plan skips
    the dead donor and the group it would have brought up, and nothing raises."""
    r = setup((0, 2))
    donor = "ro2"
    on_donor = set(r.scheds[Role.ROLLOUT].replicas[donor].running)
    assert on_donor
    plan = ShiftPlan(Role.REWARD, (ShiftDown(Role.ROLLOUT, donor, (2,)),), ((2,),))
    r.ctl.die(2, when="abort")
    report, faults = asyncio.run(run_plan(r, plan))

    assert report.error is None and report.up == [] and report.down == []
    placed = where(r)
    assert set(placed) == r.seq_ids
    assert {placed[s] for s in on_donor} <= set(r.ctl.device_map.replicas(Role.ROLLOUT))
    assert faults.records[0]["devices"] == [2]
    # back from replacement into the role it held: rollout
    assert r.ctl.device_map.state(2).role is Role.ROLLOUT


def test_one_rank_of_a_two_slot_training_replica_dying_takes_the_other_and_it_returns_whole():
    """Training on slots (2, 3): slot 3 dies. Rank 0 (slot 2) may wait in the step's
    collective for it forever, so slot 2 is killed too; both slots are replaced and
    training comes back on them as one replica."""
    r = setup((0,))
    dm = r.ctl.device_map
    dm.begin_shift_up((2, 3), Role.TRAINING, "training-x")
    dm.end_shift_up((2, 3))
    r.ctl.shifter = r.ex.shifter

    async def tick():
        faults = SlotFaults(r.ctl, r.fleet, r.execute, wait_s=0.5)
        r.ctl.die(3)
        await faults.check()
        assert dm.state(2).kind is SlotKind.LOST   # killed at once, not left in a collective
        for task, _, _ in list(faults._replacing.values()):
            await task
        await faults._return_replaced()
        return faults

    faults = asyncio.run(tick())
    rec = faults.records[0]
    assert rec["devices"] == [3] and rec["killed"] == [2] and r.ctl.killed == [2]
    assert rec["replicas"] == {"training-x": "training"} and rec["returned_to"] == "training"
    assert list(dm.replicas(Role.TRAINING).values()) == [(2, 3)] and not r.ctl.dead
    where(r)   # the responses were not touched


def test_one_rank_of_a_two_slot_inference_replica_dying_stops_the_run_naming_it():
    """A TP block's engines rendezvous when they start: a block re-spawned mid-run hung
    there, so one rank of an inference replica of two slots stops the run, which resumes
    from its last checkpoint."""
    r = setup((0,))
    dm = r.ctl.device_map
    dm.begin_shift_up((2, 3), Role.ROLLOUT, "tp")
    dm.end_shift_up((2, 3))
    r.scheds[Role.ROLLOUT].add_replicas([ReplicaView("tp", Role.ROLLOUT, (2, 3), KV)])

    async def tick():
        faults = SlotFaults(r.ctl, r.fleet, r.execute, wait_s=0.5)
        r.ctl.die(3)
        await faults.check()

    with pytest.raises(SlotDied, match="2-device rollout replica tp.*RunConfig.resume"):
        asyncio.run(tick())
    assert r.ctl.killed == []
