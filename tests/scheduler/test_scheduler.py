import pytest

from pivot.errors import StateError
from pivot.scheduler import (Abort, Dispatch, ShiftAwareScheduler, ThroughputModel,
                             WaitingQueue, shortest_first)
from pivot.types import ReplicaView, Role, SequenceState

MODEL = ThroughputModel(A=2e-6, B=0.02, C=4e-4, D=0.005)


def seq(i, prompt=100, gen=0):
    return SequenceState(i, "policy", prompt, 1000, generated_len=gen)


def sched_with(caps, model=MODEL):
    s = ShiftAwareScheduler(Role.ROLLOUT, model)
    s.add_replicas([ReplicaView(f"r{i}", Role.ROLLOUT, (i,), c) for i, c in enumerate(caps)])
    return s


def test_queue_pops_in_ascending_sequence_id_by_default():
    q = WaitingQueue()
    for i in (5, 1, 3):
        q.push(seq(i))
    assert [q.pop().seq_id for _ in range(3)] == [1, 3, 5]


def test_queue_priority_is_customisable():
    q = WaitingQueue(shortest_first)
    q.push(seq(1, prompt=300))
    q.push(seq(2, prompt=100))
    assert q.pop().seq_id == 2


def test_dispatch_goes_to_the_eligible_replica_with_the_largest_gain():
    s = sched_with([10_000, 10_000])
    for i in range(3):
        s.submit(seq(i, prompt=500))
    s.dispatch()
    s.submit(seq(9, prompt=200))
    loads = {rid: v.num_seqs for rid, v in s.replicas.items()}
    expected = max(s.replicas, key=lambda r: MODEL.gain(s.replicas[r].num_seqs,
                                                        s.replicas[r].num_tokens, 200))
    (action,) = s.dispatch()
    assert action == Dispatch(9, expected, resume=False)
    assert sum(loads.values()) == 3


def test_a_sequence_that_fits_nowhere_stays_queued():
    s = sched_with([1000])
    s.submit(seq(0, prompt=800))
    s.submit(seq(1, prompt=300))
    assert s.dispatch() == [Dispatch(0, "r0")]
    assert len(s.queue) == 1 and s.seqs[1].replica_id is None
    s.finish(0)
    assert s.dispatch() == [Dispatch(1, "r0")]


def test_abort_keeps_generated_tokens_and_resumes_after_a_reprefill():
    s = sched_with([10_000, 10_000])
    s.submit(seq(0))
    s.dispatch()
    rid = s.seqs[0].replica_id
    s.update_lengths(rid, {0: 160})
    assert s.abort(rid, "all") == [Abort(0, rid)]
    assert s.seqs[0].generated_len == 60 and s.seqs[0].num_aborts == 1
    (d,) = s.dispatch()
    assert d.resume and s.replicas[d.replica_id].running[0] == 160


def test_abort_selects_the_shortest_or_a_given_sequence():
    s = sched_with([10_000])
    for i, p in enumerate((300, 100, 200)):
        s.submit(seq(i, prompt=p))
    s.dispatch()
    assert s.abort("r0", "shortest") == [Abort(1, "r0")]
    assert s.abort("r0", 2) == [Abort(2, "r0")]
    with pytest.raises(StateError, match="does not run on r0"):
        s.abort("r0", 7)
    with pytest.raises(StateError, match="'all', 'shortest'"):
        s.abort("r0", "longest")
    s.check()


def test_shift_down_evacuates_every_sequence_to_the_remaining_replicas():
    s = sched_with([10_000, 10_000, 10_000])
    for i in range(9):
        s.submit(seq(i))
    s.dispatch()
    on_r0 = set(s.replicas["r0"].running)
    actions = s.shift_down(["r0"])
    aborted = {a.seq_id for a in actions if isinstance(a, Abort)}
    redispatched = {a.seq_id for a in actions if isinstance(a, Dispatch)}
    assert aborted == on_r0 == redispatched
    assert "r0" not in s.replicas
    s.check()


def test_shift_up_fills_new_replicas_and_never_lowers_modeled_throughput():
    s = sched_with([50_000, 50_000])
    for i in range(40):
        s.submit(seq(i, prompt=100 + 37 * i))
    s.dispatch()
    before = s.aggregate_throughput()
    actions = s.shift_up([ReplicaView("new", Role.ROLLOUT, (9,), 50_000)])
    assert s.aggregate_throughput() > before
    assert s.replicas["new"].num_seqs > 0
    assert all(a.replica_id == "new" for a in actions if isinstance(a, Dispatch))
    s.check()


def test_shift_up_without_migration_only_takes_waiting_sequences():
    s = ShiftAwareScheduler(Role.ROLLOUT, MODEL, migrate_on_shift_up=False)
    s.add_replicas([ReplicaView("r0", Role.ROLLOUT, (0,), 50_000)])
    for i in range(10):
        s.submit(seq(i))
    s.dispatch()
    assert s.shift_up([ReplicaView("r1", Role.ROLLOUT, (1,), 50_000)]) == []


def test_inconsistent_state_is_refused_not_repaired():
    s = sched_with([1000])
    s.submit(seq(0))
    s.dispatch()
    twin = ReplicaView("r1", Role.ROLLOUT, (1,), 1000, running={0: 100}, num_tokens=100)
    with pytest.raises(StateError, match="sequence 0 is on r0 and on r1"):
        s.add_replicas([twin])
    over = ReplicaView("r2", Role.ROLLOUT, (2,), 10, running={}, num_tokens=0)
    s.submit(seq(5, prompt=50))
    over.running[5] = 50
    over.num_tokens = 50
    with pytest.raises(StateError, match="exceed its KV capacity"):
        s.add_replicas([over])
    wrong = ReplicaView("r3", Role.REWARD, (3,), 1000)
    with pytest.raises(StateError, match="has role reward"):
        s.add_replicas([wrong])
    with pytest.raises(StateError, match="unknown role 'critic'"):
        Role.parse("critic")
    with pytest.raises(StateError, match="already submitted"):
        s.submit(seq(0))
    with pytest.raises(StateError, match="serves rollout or reward"):
        ShiftAwareScheduler(Role.TRAINING, MODEL)


def test_a_lost_replica_requeues_its_sequences_with_their_tokens():
    s = sched_with([10_000, 10_000])
    for i in range(6):
        s.submit(seq(i))
    s.dispatch()
    victim = s.seqs[0].replica_id
    s.update_lengths(victim, {0: 150})
    lost, actions = s.lose_replica(victim)
    assert 0 in lost and victim not in s.replicas
    assert {a.seq_id for a in actions} == set(lost)
    assert s.seqs[0].generated_len == 50 and actions[0].resume
    s.check()


def test_a_replica_at_its_batch_cap_takes_no_more_and_the_rest_wait_in_the_shared_queue():
    s = ShiftAwareScheduler(Role.ROLLOUT, MODEL, max_seqs=3)
    s.add_replicas([ReplicaView(f"r{i}", Role.ROLLOUT, (i,), 100_000) for i in range(2)])
    for i in range(8):
        s.submit(seq(i))
    s.dispatch()
    assert sorted(len(v.running) for v in s.replicas.values()) == [3, 3]
    assert s.queue_size() == 2
    s.finish(next(iter(s.replicas["r0"].running)))
    acts = s.dispatch()
    assert [(a.seq_id, a.replica_id) for a in acts] == [(6, "r0")]
    with pytest.raises(StateError, match="max_seqs"):
        ShiftAwareScheduler(Role.ROLLOUT, MODEL, max_seqs=0)
