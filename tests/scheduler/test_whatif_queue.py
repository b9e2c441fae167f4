"""``WhatIfQueue`` pops exactly as the heap of ((id, k), id, length) entries it replaced
(the snapshot's k-th waiting sequence, k = -1 for an aborted one), through pops, chunked
takes with an unplaced tail put back, and aborts in between; and ``WaitingEntries.span``
is the slice of its entries."""

import heapq

from hypothesis import given, settings, strategies as st

from pivot.scheduler.queue import WaitingEntries, WaitingQueue
from pivot.scheduler.whatif_queue import WhatIfQueue
from pivot.types import SequenceState

ops = st.lists(st.tuples(st.sampled_from(["pop", "take", "abort", "aborts"]),
                         st.integers(0, 9), st.integers(0, 9)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(0, 200), unique=True, max_size=30), shuffle=st.booleans(),
       ops=ops, queued=st.booleans())
def test_same_order_as_the_heap(ids, shuffle, ops, queued):
    waiting = [(sid, 100 + sid % 7) for sid in (ids if shuffle else sorted(ids))]
    if queued:  # the snapshot's lazy entries, in id order
        q = WaitingQueue()
        for sid, length in sorted(waiting):
            q.push(SequenceState(sid, "m", length, 10))
        waiting = WaitingEntries(q)
    ref = [((sid, k), sid, length) for k, (sid, length) in enumerate(waiting)]
    heapq.heapify(ref)
    new = WhatIfQueue(waiting)
    fresh = iter(range(1000, 2000))
    for op, a, b in ops:
        assert len(new) == len(ref)
        if op == "pop" and ref:
            assert new.pop() == heapq.heappop(ref)[1:]
        elif op == "take":
            got = new.take(a + 1)
            want = [heapq.heappop(ref) for _ in range(min(a + 1, len(ref)))]
            assert got == [e[1:] for e in want]
            keep = min(b, len(got))
            new.untake(got, keep)
            for e in want[keep:]:
                heapq.heappush(ref, e)
        elif op in ("abort", "aborts"):
            pairs = [(next(fresh) - 1000 * (a % 2), 50 + j) for j in range(b + 1)]
            pairs = [p for p in pairs if all(p[0] != e[1] for e in ref)
                     and p[0] not in ids][:1 if op == "abort" else None]
            if op == "abort" and pairs:
                new.push(*pairs[0])
            else:
                new.push_many(dict(pairs))
            for sid, length in pairs:
                heapq.heappush(ref, ((sid, -1), sid, length))
    assert [new.pop() for _ in range(len(new))] == [heapq.heappop(ref)[1:]
                                                    for _ in range(len(ref))]


def test_span_is_the_slice():
    q = WaitingQueue()
    for sid in (5, 1, 9, 3):
        q.push(SequenceState(sid, "m", 10 + sid, 10))
    w = WaitingEntries(q)
    assert w.by_id and w.span(1, 3) == q.entries()[1:3] == [(3, 13), (5, 15)]
    assert w.span(3, 10) == [(9, 19)] and w.span(4, 5) == []
    assert list(w) == q.entries() and w.span(0, 2) == [(1, 11), (3, 13)]
