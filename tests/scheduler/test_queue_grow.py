"""The sorted-list waiting queue against a heap with lazy deletion (its former form), and
``settle`` (the simulator's length update with a known total) against ``update_lengths``."""

import copy
import heapq

from hypothesis import given, settings, strategies as st

from pivot.scheduler import ShiftAwareScheduler, ThroughputModel, WaitingQueue
from pivot.types import ReplicaView, Role, SequenceState


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["push", "pop", "remove"]),
                              st.integers(0, 3000)), max_size=300))
def test_queue_pops_and_iterates_in_the_heaps_order(ops):
    q, heap, live = WaitingQueue(), [], {}
    for op, x in ops:
        if op == "push" and x not in live:
            seq = SequenceState(x, "x", 10, 100)
            q.push(seq)
            live[x] = seq
            heapq.heappush(heap, (seq.sort_key, x))
        elif op == "pop" and live:
            while heap[0][1] not in live:
                heapq.heappop(heap)
            want = live.pop(heapq.heappop(heap)[1])
            assert q.pop() is want
        elif op == "remove" and live:
            sid = sorted(live)[x % len(live)]
            assert q.remove(sid) is live.pop(sid)
        assert len(q) == len(live)
        assert [s.seq_id for s in q] == sorted(live)
        assert q.entries() == [(s.seq_id, s.length) for s in q]
        assert (q.peek() is None) == (not live)


@settings(max_examples=80, deadline=None)
@given(lengths=st.lists(st.integers(1, 5000), min_size=1, max_size=40),
       growth=st.integers(0, 900), subset=st.booleans())
def test_settle_records_lengths_as_update_lengths_does(lengths, growth, subset):
    s = ShiftAwareScheduler(Role.ROLLOUT, ThroughputModel(A=1.5e-8, B=0.0, C=4.2e-4,
                                                           D=6.6e-3))
    s.add_replicas([ReplicaView("r0", Role.ROLLOUT, (0,), 10 ** 7)])
    for i, length in enumerate(lengths):
        s.submit(SequenceState(i, "x", length, 10 ** 6))
    s.dispatch()
    ref = copy.deepcopy(s)
    new = {sid: ln + growth for sid, ln in s.replicas["r0"].running.items()}
    if subset and len(new) > 1:
        new.pop(next(iter(new)))
    ref.update_lengths("r0", new)
    s.settle("r0", new, sum(ref.replicas["r0"].running.values()))
    assert s.replicas["r0"].running == ref.replicas["r0"].running
    assert s.replicas["r0"].num_tokens == ref.replicas["r0"].num_tokens
    for name in ("_nseq", "_ntok", "_free", "_tput", "_num", "_den"):
        assert getattr(s, name).tolist() == getattr(ref, name).tolist()
    # a sequence leaving its replica carries the recorded progress either way
    sid = next(iter(new))
    s.abort("r0", sid)
    ref.abort("r0", sid)
    assert s.seqs[sid].generated_len == ref.seqs[sid].generated_len


def test_waiting_entries_read_late_equal_entries_and_refuse_a_changed_queue():
    """``WaitingEntries`` (the simulator's lazy ``RoleLoad.waiting``): its length is the
    queue's at creation, its pairs are ``entries()`` when first read, and a first read
    after the queue changed raises instead of showing another instant's queue."""
    import pytest

    from pivot.errors import StateError
    from pivot.scheduler.queue import WaitingEntries
    q = WaitingQueue()
    for sid in (5, 2, 9):
        q.push(SequenceState(sid, "x", 10 + sid, 100))
    view = WaitingEntries(q)
    assert len(view) == 3 and view
    assert view == q.entries() == list(view) and view[0] == (2, 12)
    q.pop()
    assert list(view) == [(2, 12), (5, 15), (9, 19)]  # read before the change: kept
    late = WaitingEntries(q)
    q.push(SequenceState(1, "x", 11, 100))
    assert len(late) == 2
    with pytest.raises(StateError):
        list(late)
    assert not WaitingEntries(WaitingQueue())
