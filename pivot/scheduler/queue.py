"""The shared waiting queue of a role (sec. 6.1, footnote 3).

A priority queue with a customizable key; by default sequences leave in ascending order of
sequence id, as in veRL.
"""

from __future__ import annotations

import bisect
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
