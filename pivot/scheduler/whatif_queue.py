"""The waiting queue of the planner's what-if load (sec. 7.3), merged lazily.

``WhatIfLoad`` pops waiting sequences by sequence id (its former heap of
((id, k), id, length) entries: the snapshot's k-th waiting sequence and, with k = -1, each
sequence a what-if abort put back; ids are unique, so the id alone orders them). Building
that heap copied the snapshot's whole queue for every what-if load, several per planner
tick, though a candidate's dispatch usually reads only its head. ``WhatIfQueue`` gives the
same order from two sources: the snapshot's entries, read through a cursor as they are
consumed (``WaitingEntries.span`` builds only the pairs it is asked for), and a heap of the
aborted (id, length) pairs; a pop takes the smaller id of the two heads.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence


class WhatIfQueue:
    """(sequence id, length) pairs popped in ascending id.

    Args:
        waiting: the snapshot's waiting (id, length) pairs (``RoleLoad.waiting``). Read in
            place when they are in id order (``WaitingEntries.by_id``, the default
            priority; a plain list is checked); otherwise sorted once.
    """

    __slots__ = ("_src", "_n", "_pos", "_heap", "_origin")

    def __init__(self, waiting: Sequence[tuple[int, int]]) -> None:
        by_id = getattr(waiting, "by_id", None)
        if by_id is None:
            by_id = all(a[0] < b[0] for a, b in zip(waiting, waiting[1:]))
        self._src = waiting if by_id else sorted(waiting)
        self._n = len(waiting)
        self._pos = 0
        self._heap: list[tuple[int, int]] = []
        self._origin: list[bool] | None = None
        """Which pairs of the last ``take`` came from the snapshot (None: all did)."""

    def __len__(self) -> int:
        return self._n - self._pos + len(self._heap)

    def _span(self, a: int, b: int) -> list[tuple[int, int]]:
        src = self._src
        span = getattr(src, "span", None)
        return span(a, b) if span is not None else list(src[a:b])

    def push(self, seq_id: int, length: int) -> None:
        """Queues an aborted sequence."""
        heapq.heappush(self._heap, (seq_id, length))

    def push_many(self, pairs: Iterable[tuple[int, int]]) -> None:
        """Queues aborted sequences (a replica's whole running set)."""
        heap = self._heap
        n = len(heap)
        heap.extend(pairs)
        if len(heap) != n:
            heapq.heapify(heap)

    def peek(self) -> tuple[int, int]:
        heap = self._heap
        if self._pos < self._n:
            head = self._span(self._pos, self._pos + 1)[0]
            if not heap or head[0] < heap[0][0]:
                return head
        return heap[0]

    def pop(self) -> tuple[int, int]:
        heap = self._heap
        if self._pos < self._n:
            head = self._span(self._pos, self._pos + 1)[0]
            if not heap or head[0] < heap[0][0]:
                self._pos += 1
                return head
        return heapq.heappop(heap)

    def take(self, n: int) -> list[tuple[int, int]]:
        """Pops the next ``n`` pairs (fewer if the queue runs out), in order."""
        heap = self._heap
        block = self._span(self._pos, self._pos + n)
        if not heap:
            self._pos += len(block)
            self._origin = None
            return block
        out: list[tuple[int, int]] = []
        origin: list[bool] = []
        j, nb = 0, len(block)
        pop = heapq.heappop
        while len(out) < n and (heap or j < nb):
            if heap and (j >= nb or heap[0][0] < block[j][0]):
                out.append(pop(heap))
                origin.append(False)
            else:
                out.append(block[j])
                origin.append(True)
                j += 1
        self._pos += j
        self._origin = origin
        return out

    def untake(self, taken: list[tuple[int, int]], keep: int) -> None:
        """Puts back ``taken[keep:]`` of the last ``take``: the queue then pops as if
        they had never left (the snapshot's ones are the last the cursor passed)."""
        if self._origin is None:
            self._pos -= len(taken) - keep
            return
        for pair, from_src in zip(taken[keep:], self._origin[keep:]):
            if from_src:
                self._pos -= 1
            else:
                heapq.heappush(self._heap, pair)
