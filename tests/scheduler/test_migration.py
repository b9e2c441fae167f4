"""Property tests of dispatch, abort and shift-time migration (alg. 2-4)."""

import itertools

from hypothesis import given, settings, strategies as st

from pivot.scheduler import Abort, ShiftAwareScheduler, ThroughputModel
from pivot.scheduler.load import WhatIfLoad
from pivot.scheduler.migration import shift_down_migration, shift_up_migration
from pivot.types import ReplicaView, Role, RoleLoad, SequenceState

MODEL = ThroughputModel(A=2e-6, B=0.02, C=4e-4, D=0.005)

ops = st.lists(st.tuples(
    st.sampled_from(["submit", "dispatch", "abort", "shortest", "finish", "grow", "down",
                     "up"]),
    st.integers(0, 10_000)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(caps=st.lists(st.integers(200, 5000), min_size=1, max_size=4), ops=ops)
def test_no_sequence_is_lost_or_duplicated_and_capacity_holds(caps, ops):
    s = ShiftAwareScheduler(Role.ROLLOUT, MODEL)
    s.add_replicas([ReplicaView(f"r{i}", Role.ROLLOUT, (i,), c) for i, c in enumerate(caps)])
    alive: set[int] = set()
    next_id, next_dev = 0, len(caps)
    for op, x in ops:
        reps = sorted(s.replicas)
        if op == "submit":
            s.submit(SequenceState(next_id, "policy", 1 + x % 400, 100))
            alive.add(next_id)
            next_id += 1
        elif op == "dispatch":
            s.dispatch()
        elif op in ("abort", "shortest") and reps:
            s.abort(reps[x % len(reps)], "all" if op == "abort" else "shortest")
        elif op == "finish":
            running = sorted(sid for v in s.replicas.values() for sid in v.running)
            if running:
                sid = running[x % len(running)]
                s.finish(sid)
                alive.discard(sid)
        elif op == "grow" and reps:
            v = s.replicas[reps[x % len(reps)]]
            if v.running and v.free_kv > 0:
                sid = min(v.running)
                s.update_lengths(v.replica_id, {sid: v.running[sid] + 1})
        elif op == "down" and len(reps) > 1:
            s.shift_down([reps[x % len(reps)]])
        elif op == "up" and len(reps) < 6:
            s.shift_up([ReplicaView(f"r{next_dev}", Role.ROLLOUT, (next_dev,),
                                    200 + x % 5000)])
            next_dev += 1
        s.check()  # one place per sequence, KV capacity, cached loads in sync
        assert set(s.seqs) == alive
        assert all(v.num_tokens <= v.kv_capacity for v in s.replicas.values())


@st.composite
def loaded(draw):
    n_rep = draw(st.integers(1, 5))
    s = ShiftAwareScheduler(Role.REWARD, MODEL)
    s.add_replicas([ReplicaView(f"r{i}", Role.REWARD, (i,), draw(st.integers(2000, 20000)))
                    for i in range(n_rep)])
    for i in range(draw(st.integers(0, 40))):
        s.submit(SequenceState(i, "genrm", draw(st.integers(10, 1500)), 100,
                               generated_len=draw(st.integers(0, 300))))
    s.dispatch()
    return s


def as_load(s: ShiftAwareScheduler) -> RoleLoad:
    return RoleLoad(s.role, [v.copy() for v in s.replicas.values()],
                    [(q.seq_id, q.length) for q in s.queue], 1, 20000, 16)


@settings(max_examples=150, deadline=None)
@given(s=loaded(), cap=st.integers(2000, 20000), k=st.integers(1, 3))
def test_shift_up_migration_never_lowers_aggregate_throughput(s, cap, k):
    before = s.aggregate_throughput()
    new = [ReplicaView(f"n{j}", Role.REWARD, (100 + j,), cap) for j in range(k)]
    actions = s.shift_up(new)
    assert s.aggregate_throughput() >= before - 1e-9
    s.check()
    moved = [a.seq_id for a in actions if isinstance(a, Abort)]
    assert len(moved) == len(set(moved))


@settings(max_examples=100, deadline=None)
@given(s=loaded(), cap=st.integers(2000, 20000), k=st.integers(1, 3),
       drop=st.integers(0, 4))
def test_planner_what_if_replays_exactly_the_schedulers_migration(s, cap, k, drop):
    """The planner's simulation (sec. 7.3) and the real scheduler emit the same actions."""
    what_if = WhatIfLoad(as_load(s), MODEL)
    new = [ReplicaView(f"n{j}", Role.REWARD, (100 + j,), cap) for j in range(k)]
    real_up = shift_up_migration(s, [v.copy() for v in new])
    sim_up = shift_up_migration(what_if, [v.copy() for v in new])
    assert [(type(a), a.seq_id, a.replica_id) for a in real_up] == \
           [(type(a), a.seq_id, a.replica_id) for a in sim_up]
    assert abs(s.aggregate_throughput() - what_if.aggregate_throughput()) < 1e-9
    victim = sorted(s.replicas)[drop % len(s.replicas)]
    real_down = shift_down_migration(s, [victim])
    sim_down = shift_down_migration(what_if, [victim])
    assert [(type(a), a.seq_id, a.replica_id) for a in real_down] == \
           [(type(a), a.seq_id, a.replica_id) for a in sim_down]


def test_shift_down_keeps_sequences_that_fit_nowhere_in_the_queue():
    s = ShiftAwareScheduler(Role.ROLLOUT, MODEL)
    s.add_replicas([ReplicaView("a", Role.ROLLOUT, (0,), 1000),
                    ReplicaView("b", Role.ROLLOUT, (1,), 1000)])
    for i in range(2):
        s.submit(SequenceState(i, "policy", 900, 10))
    s.dispatch()
    actions = s.shift_down(["a"])
    assert [type(a) for a in actions] == [Abort]
    assert len(s.queue) == 1
    s.check()


def test_dispatch_order_within_a_migration_respects_queue_priority():
    s = ShiftAwareScheduler(Role.ROLLOUT, MODEL)
    s.add_replicas([ReplicaView("a", Role.ROLLOUT, (0,), 10_000),
                    ReplicaView("b", Role.ROLLOUT, (1,), 10_000)])
    for i in (4, 2, 7):
        s.submit(SequenceState(i, "policy", 100, 10))
    s.dispatch()
    s.abort("a", "all")
    s.abort("b", "all")
    ids = [a.seq_id for a in s.dispatch()]
    assert ids == sorted(ids) == [2, 4, 7]
    assert list(itertools.chain(ids)) == [2, 4, 7]
