"""The shared waiting queue of a role (sec. 6.1, footnote 3).

A priority queue with a customizable key; by default sequences leave in ascending order of
sequence id, as in veRL.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any, Callable, Iterator

from pivot.errors import StateError
from pivot.types import SequenceState

PriorityFn = Callable[[SequenceState], Any]


def by_sequence_id(seq: SequenceState) -> tuple[float, int]:
    """The default priority: ``SequenceState.priority`` if set, else the sequence id."""
    return seq.sort_key


def shortest_first(seq: SequenceState) -> tuple[int, int]:
    """An alternative priority: fewest tokens first (ties by id)."""
    return (seq.length, seq.seq_id)


class WaitingQueue:
    """Sequences waiting for a replica, popped in priority order.

    Kept as a list sorted by (priority at push time, sequence id), consumed from the
    front: a pop is O(1), a push O(log n) comparisons plus a memmove (new work has the
    largest ids and lands at the end), and the monitor reads the order every planner
    tick without sorting.
    """

    def __init__(self, priority: PriorityFn = by_sequence_id) -> None:
        self._priority = priority
        self._order: list[tuple[Any, int]] = []
        self._lo = 0
        """``_order[_lo:]`` is the queue; entries before it were popped."""
        self._seqs: dict[int, SequenceState] = {}
        self._key: dict[int, tuple[Any, int]] = {}
        self.version = 0
        """Incremented by every push, pop and remove (``WaitingEntries`` checks it)."""

    def __len__(self) -> int:
        return len(self._seqs)

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._seqs

    def __iter__(self) -> Iterator[SequenceState]:
        """Iterates in priority order (O(n), no sort)."""
        seqs = self._seqs
        return iter([seqs[sid] for _, sid in self._order[self._lo:]])

    def push(self, seq: SequenceState) -> None:
        if seq.seq_id in self._seqs:
            raise StateError(f"sequence {seq.seq_id} is already in the waiting queue")
        if seq.replica_id is not None:
            raise StateError(f"sequence {seq.seq_id} still runs on {seq.replica_id}; "
                             f"abort it before queueing it")
        entry = (self._priority(seq), seq.seq_id)
        self.version += 1
        self._seqs[seq.seq_id] = seq
        self._key[seq.seq_id] = entry
        order = self._order
        if len(order) == self._lo or order[-1] < entry:
            order.append(entry)
        else:
            bisect.insort(order, entry, lo=self._lo)

    def peek(self) -> SequenceState | None:
        return self._seqs[self._order[self._lo][1]] if self._seqs else None

    def pop(self) -> SequenceState:
        if not self._seqs:
            raise StateError("pop from an empty waiting queue")
        _, sid = self._order[self._lo]
        self.version += 1
        self._lo += 1
        if self._lo > 1024 and 2 * self._lo > len(self._order):
            del self._order[:self._lo]
            self._lo = 0
        del self._key[sid]
        return self._seqs.pop(sid)

    def remove(self, seq_id: int) -> SequenceState:
        """Removes a sequence wherever it is in the queue."""
        try:
            seq = self._seqs.pop(seq_id)
        except KeyError:
            raise StateError(f"sequence {seq_id} is not in the waiting queue") from None
        self.version += 1
        entry = self._key.pop(seq_id)
        i = bisect.bisect_left(self._order, entry, lo=self._lo)
        del self._order[i]
        return seq

    def lengths(self) -> list[int]:
        """Lengths of the waiting sequences, in priority order."""
        return [s.length for s in self]

    def entries(self) -> list[tuple[int, int]]:
        """(sequence id, length) of the waiting sequences in priority order, in one pass
        (the monitor's ``RoleLoad.waiting``)."""
        seqs = self._seqs
        return [(sid, (q := seqs[sid]).prompt_len + q.generated_len)
                for _, sid in self._order[self._lo:]]


class WaitingEntries(Sequence):
    """``WaitingQueue.entries`` read on first use instead of at once (sec. 7.1: the
    monitor reports the waiting sequences; most planners only count them).

    Its length is the queue's at creation (O(1)); the (sequence id, length) pairs are
    built the first time they are read, which must be before the queue changes (a push,
    pop or remove): a later first read raises StateError instead of returning another
    instant's queue. The simulator's tick builds a snapshot, plans and only then acts, so
    a planner that reads the pairs sees exactly what ``entries`` gave at the snapshot, and
    one that only counts them (``RoleLoad.num_seqs``) costs O(1) instead of O(queue)."""

    __slots__ = ("_queue", "_version", "_len", "_items")

    def __init__(self, queue: WaitingQueue) -> None:
        self._queue, self._version, self._len = queue, queue.version, len(queue)
        self._items: list[tuple[int, int]] | None = None

    def _get(self) -> list[tuple[int, int]]:
        if self._items is None:
            if self._queue.version != self._version:
                raise StateError("the waiting queue changed after the snapshot was taken; "
                                 "its entries were never read before that")
            self._items = self._queue.entries()
        return self._items

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __getitem__(self, i):
        return self._get()[i]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self._get())

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"WaitingEntries({self._get()!r})"
