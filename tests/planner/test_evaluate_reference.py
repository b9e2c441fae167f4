"""The planner's optimised candidate evaluation against a straightforward reference.

``IncrementalShiftUp`` / ``IncrementalShiftDown`` run alg. 3 and 4 on a ``WhatIfLoad``
that skips building actions, keeps alg. 4's shortest-sequence heaps between candidates and
shortcuts the loop's tentative load update. None of that may change a number: replaying
the same steps with the real ``ShiftAwareScheduler`` (fresh heaps every call, every action
built) must give bit-identical throughputs, under the paper's rule (any replica with free
KV) and under the scheduler's own (a batch cap and a KV reserve, ``scheduler_rule``).
"""

import copy

from hypothesis import given, settings, strategies as st

from pivot.planner.evaluate import (IncrementalShiftDown, IncrementalShiftUp,
                                    simulate_shift_down, simulate_shift_up)
from pivot.scheduler import ShiftAwareScheduler, ThroughputModel
from pivot.scheduler.load import WhatIfLoad
from pivot.scheduler.migration import shift_down_migration, shift_up_migration
from pivot.types import ReplicaView, Role, RoleLoad, SequenceState

MODELS = [ThroughputModel(A=2e-6, B=0.02, C=4e-4, D=0.005),
          ThroughputModel(A=1e-8, B=0.0, C=0.086e-3, D=8.6e-3)]


@st.composite
def loaded(draw):
    """A real scheduler after random submissions and one dispatch, some of it waiting."""
    model = draw(st.sampled_from(MODELS))
    s = ShiftAwareScheduler(Role.REWARD, model, kv_reserve=draw(st.sampled_from([0, 0, 64])),
                            max_seqs=draw(st.sampled_from([None, None, 2, 5, 12])))
    n_rep = draw(st.integers(1, 6))
    s.add_replicas([ReplicaView(f"r{i}", Role.REWARD, (i,), draw(st.integers(1500, 20000)))
                    for i in range(n_rep)])
    for i in range(draw(st.integers(0, 60))):
        s.submit(SequenceState(i, "genrm", draw(st.integers(10, 1500)), 100,
                               generated_len=draw(st.integers(0, 300))))
    s.dispatch()
    return s


def as_load(s: ShiftAwareScheduler, cap: int) -> RoleLoad:
    return RoleLoad(s.role, [v.copy() for v in s.replicas.values()],
                    [(q.seq_id, q.length) for q in s.queue], 1, cap, 64,
                    kv_reserve=s.kv_reserve, max_seqs=s.max_seqs)


def rule(s: ShiftAwareScheduler) -> dict:
    return {"kv_reserve": s.kv_reserve, "max_seqs": s.max_seqs}


def new_view(j: int, cap: int) -> ReplicaView:
    return ReplicaView(f"__up{j}", Role.REWARD, (100 + j,), cap)


@settings(max_examples=80, deadline=None)
@given(s=loaded(), cap=st.integers(1500, 20000), steps=st.lists(st.integers(1, 3),
                                                                 min_size=1, max_size=5))
def test_incremental_shift_up_equals_the_schedulers_migration_step_by_step(s, cap, steps):
    load = as_load(s, cap)
    cold = copy.deepcopy(s)
    inc = IncrementalShiftUp(load, s.model, **rule(s))
    k = 0
    for j in steps:
        shift_up_migration(s, [new_view(k + i, cap) for i in range(j)])  # the reference
        k += j
        got = inc.throughput_with([new_view(i, cap).devices for i in range(k)])
        assert got == s.aggregate_throughput()
    # A cold simulation is alg. 4 once, from the snapshot.
    shift_up_migration(cold, [new_view(i, cap) for i in range(k)])
    assert simulate_shift_up(load, s.model, [(100 + i,) for i in range(k)], **rule(s)) == \
        cold.aggregate_throughput()


@settings(max_examples=80, deadline=None)
@given(s=loaded(), order=st.permutations(range(6)), cut=st.lists(st.integers(1, 3),
                                                                  min_size=1, max_size=4))
def test_incremental_shift_down_equals_the_schedulers_migration_step_by_step(s, order, cut):
    ids = [f"r{i}" for i in order if f"r{i}" in s.replicas]
    load = as_load(s, 20000)
    ref = copy.deepcopy(s)
    inc = IncrementalShiftDown(load, s.model, **rule(s))
    done = 0
    for c in cut:
        if done + c >= len(ids):
            break
        shift_down_migration(ref, ids[done:done + c])
        done += c
        assert inc.throughput_without(ids[:done]) == ref.aggregate_throughput()
        assert simulate_shift_down(load, s.model, ids[:done], **rule(s)) == \
            _cold_down(s, ids[:done])
    # A donor set that does not contain the previous one restarts from the snapshot.
    if len(ids) > 1 and done:
        assert inc.throughput_without(ids[done:done + 1]) == \
            _cold_down(s, ids[done:done + 1])


def _cold_down(s: ShiftAwareScheduler, ids: list[str]) -> float:
    ref = copy.deepcopy(s)
    shift_down_migration(ref, list(ids))
    return ref.aggregate_throughput()


@settings(max_examples=80, deadline=None)
@given(s=loaded(), cap=st.integers(1500, 20000),
       ops=st.lists(st.tuples(st.booleans(), st.integers(0, 10)), min_size=1, max_size=8))
def test_what_if_load_tracks_the_scheduler_through_mixed_shifts(s, cap, ops):
    """Shift downs and ups in any order (the persistent heaps must follow every dispatch,
    abort and removal): the quiet what-if copy models exactly the scheduler's throughput
    and the recording one emits exactly its actions."""
    quiet = WhatIfLoad(as_load(s, cap), s.model, record_actions=False, **rule(s))
    loud = WhatIfLoad(as_load(s, cap), s.model, **rule(s))
    n_up = 0
    for up, x in ops:
        if up or len(s.replicas) < 2:
            views = [new_view(n_up, cap)]
            n_up += 1
            real = shift_up_migration(s, [v.copy() for v in views])
            assert shift_up_migration(quiet, [v.copy() for v in views]) == []
            sim = shift_up_migration(loud, [v.copy() for v in views])
        else:
            victim = sorted(s.replicas)[x % len(s.replicas)]
            real = shift_down_migration(s, [victim])
            assert shift_down_migration(quiet, [victim]) == []
            sim = shift_down_migration(loud, [victim])
        assert [(type(a), a.seq_id, a.replica_id) for a in real] == \
               [(type(a), a.seq_id, a.replica_id) for a in sim]
        assert quiet.aggregate_throughput() == s.aggregate_throughput()
        assert loud.aggregate_throughput() == s.aggregate_throughput()
