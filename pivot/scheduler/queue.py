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
        self._prioritized: set[int] = set()
        """Queued sequences with their own ``SequenceState.priority``."""

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
        if seq.priority is not None:
            self._prioritized.add(seq.seq_id)
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
        if self._prioritized:
            self._prioritized.discard(sid)
        return self._seqs.pop(sid)

    def remove(self, seq_id: int) -> SequenceState:
        """Removes a sequence wherever it is in the queue."""
        try:
            seq = self._seqs.pop(seq_id)
        except KeyError:
            raise StateError(f"sequence {seq_id} is not in the waiting queue") from None
        self.version += 1
        self._prioritized.discard(seq_id)
        entry = self._key.pop(seq_id)
        i = bisect.bisect_left(self._order, entry, lo=self._lo)
        del self._order[i]
        return seq

    @property
    def by_id(self) -> bool:
        """Whether the queue's order is ascending sequence id (the default priority with
        no sequence's own ``priority`` set)."""
        return self._priority is by_sequence_id and not self._prioritized

    def lengths(self) -> list[int]:
        """Lengths of the waiting sequences, in priority order."""
        return [s.length for s in self]

    def entries(self, start: int = 0, stop: int | None = None) -> list[tuple[int, int]]:
        """(sequence id, length) of the waiting sequences in priority order, in one pass
        (the monitor's ``RoleLoad.waiting``); ``start`` / ``stop``: those positions only."""
        seqs = self._seqs
        lo = self._lo
        order = self._order[lo + start:] if stop is None else self._order[lo + start:lo + stop]
        return [(sid, (q := seqs[sid]).prompt_len + q.generated_len) for _, sid in order]


class WaitingEntries(Sequence):
    """``WaitingQueue.entries`` read on first use instead of at once (sec. 7.1: the
    monitor reports the waiting sequences; most planners only count them).

    Its length is the queue's at creation (O(1)); the (sequence id, length) pairs are
    built the first time they are read, which must be before the queue changes (a push,
    pop or remove): a later first read raises StateError instead of returning another
    instant's queue. The simulator's tick builds a snapshot, plans and only then acts, so
    a planner that reads the pairs sees exactly what ``entries`` gave at the snapshot, and
    one that only counts them (``RoleLoad.num_seqs``) costs O(1) instead of O(queue)."""

    __slots__ = ("_queue", "_version", "_len", "_items", "by_id")

    def __init__(self, queue: WaitingQueue) -> None:
        self._queue, self._version, self._len = queue, queue.version, len(queue)
        self._items: list[tuple[int, int]] | None = None
        self.by_id = queue.by_id
        """The pairs are in ascending sequence id (``WaitingQueue.by_id``)."""

    def _check_version(self) -> None:
        if self._queue.version != self._version:
            raise StateError("the waiting queue changed after the snapshot was taken; "
                             "its entries were never read before that")

    def _get(self) -> list[tuple[int, int]]:
        if self._items is None:
            self._check_version()
            self._items = self._queue.entries()
        return self._items

    def span(self, start: int, stop: int) -> list[tuple[int, int]]:
        """``self[start:stop]`` as a list, building only those pairs if the whole list
        was not read yet (the planner's what-if queue reads the head it consumes,
        ``pivot.scheduler.whatif_queue``); the same rule: before the queue changes."""
        if self._items is not None:
            return self._items[start:stop]
        self._check_version()
        start, stop = max(start, 0), min(stop, self._len)
        return self._queue.entries(start, stop) if start < stop else []

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
