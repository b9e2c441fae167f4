"""The shared waiting queue of a role (sec. 6.1, footnote 3).

A priority queue with a customizable key; by default sequences leave in ascending order of
sequence id, as in veRL.
"""

from __future__ import annotations

import heapq
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
    """Sequences waiting for a replica, popped in priority order."""

    def __init__(self, priority: PriorityFn = by_sequence_id) -> None:
        self._priority = priority
        self._heap: list[tuple[Any, int]] = []
        self._seqs: dict[int, SequenceState] = {}

    def __len__(self) -> int:
        return len(self._seqs)

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._seqs

    def __iter__(self) -> Iterator[SequenceState]:
        """Iterates in priority order (a sorted copy; O(n log n))."""
        return iter(sorted(self._seqs.values(), key=self._priority))

    def push(self, seq: SequenceState) -> None:
        if seq.seq_id in self._seqs:
            raise StateError(f"sequence {seq.seq_id} is already in the waiting queue")
        if seq.replica_id is not None:
            raise StateError(f"sequence {seq.seq_id} still runs on {seq.replica_id}; "
                             f"abort it before queueing it")
        self._seqs[seq.seq_id] = seq
        heapq.heappush(self._heap, (self._priority(seq), seq.seq_id))

    def _drop_stale(self) -> None:
        while self._heap and self._heap[0][1] not in self._seqs:
            heapq.heappop(self._heap)

    def peek(self) -> SequenceState | None:
        self._drop_stale()
        return self._seqs[self._heap[0][1]] if self._heap else None

    def pop(self) -> SequenceState:
        self._drop_stale()
        if not self._heap:
            raise StateError("pop from an empty waiting queue")
        _, sid = heapq.heappop(self._heap)
        return self._seqs.pop(sid)

    def remove(self, seq_id: int) -> SequenceState:
        """Removes a sequence wherever it is in the queue (lazy deletion)."""
        try:
            return self._seqs.pop(seq_id)
        except KeyError:
            raise StateError(f"sequence {seq_id} is not in the waiting queue") from None

    def lengths(self) -> list[int]:
        """Lengths of the waiting sequences, in priority order."""
        return [s.length for s in self]
