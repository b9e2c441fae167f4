"""The waiting queue of the planner's what-if load (sec. 7.3), merged lazily.

``WhatIfLoad`` pops waiting sequences by sequence id (its former heap of
((id, k), id, length) entries: the snapshot's k-th waiting sequence and, with k = -1, each
sequence a what-if abort put back; ids are unique, so the id alone orders them). Building
that heap copied the snapshot's whole queue for every what-if load, several per planner
tick, though a candidate's dispatch usually reads only its head. ``WhatIfQueue`` gives the
same order from two sorted sources, each read through a cursor as far as it is consumed:
the snapshot's entries (``WaitingEntries.span`` builds only the pairs it is asked for) and
the ids of the sequences aborted since, sorted in when next read; a take merges the two
heads by id.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence


class WhatIfQueue:
    """(sequence id, length) pairs popped in ascending id.

    Args:
        waiting: the snapshot's waiting (id, length) pairs (``RoleLoad.waiting``). Read in
            place when they are in id order (``WaitingEntries.by_id``, the default
            priority; a plain list is checked); otherwise sorted once.

    Aborted sequences are kept as a sorted list of ids (``_ab``, consumed from
    ``_abpos``) with their lengths in ``_ablen``; new ones wait in ``_new`` until the
    next read sorts them in (C-level sorts of ints: a replica's running set is nearly in
    id order already).
    """

    __slots__ = ("_src", "_n", "_pos", "_ab", "_abpos", "_ablen", "_new", "_last")

    def __init__(self, waiting: Sequence[tuple[int, int]]) -> None:
        by_id = getattr(waiting, "by_id", None)
        if by_id is None:
            by_id = all(a[0] < b[0] for a, b in zip(waiting, waiting[1:]))
        self._src = waiting if by_id else sorted(waiting)
        self._n = len(waiting)
        self._pos = 0
        self._ab: list[int] = []
        self._abpos = 0
        self._ablen: dict[int, int] = {}
        self._new: list[int] = []
        self._last: tuple[int, int, list] = (0, 0, [])
        """Both cursors before the last ``take`` and the snapshot pairs it read."""

    def __len__(self) -> int:
        return self._n - self._pos + len(self._ab) - self._abpos + len(self._new)

    def _span(self, a: int, b: int) -> list[tuple[int, int]]:
        src = self._src
        span = getattr(src, "span", None)
        return span(a, b) if span is not None else list(src[a:b])

    def _sort_in(self) -> None:
        if self._new:
            self._ab = sorted(self._ab[self._abpos:] + self._new)
            self._abpos = 0
            self._new = []

    def push(self, seq_id: int, length: int) -> None:
        """Queues an aborted sequence."""
        self._ablen[seq_id] = length
        self._new.append(seq_id)

    def push_many(self, running: Mapping[int, int]) -> None:
        """Queues aborted sequences (a replica's whole running set, id -> length)."""
        self._ablen.update(running)
        self._new.extend(running)

    def peek(self) -> tuple[int, int]:
        head = self.take(1)
        self.untake(head, 0)
        return head[0]

    def pop(self) -> tuple[int, int]:
        return self.take(1)[0]

    def take(self, n: int) -> list[tuple[int, int]]:
        """Pops the next ``n`` pairs (fewer if the queue runs out), in order."""
        self._sort_in()
        pos, abpos = self._pos, self._abpos
        block = self._span(pos, pos + n)
        ids = self._ab[abpos:abpos + n]
        if ids:
            ablen = self._ablen
            aborted = [(s, ablen[s]) for s in ids]
            # two sorted runs with distinct ids: timsort merges them, ordered by id
            out = sorted(block + aborted)[:n] if block else aborted
        else:
            out = block
        self._last = (pos, abpos, block)
        nb = bisect_right(block, out[-1]) if out and block else 0
        self._pos = pos + nb
        self._abpos = abpos + len(out) - nb
        return out

    def untake(self, taken: list[tuple[int, int]], keep: int) -> None:
        """Puts back ``taken[keep:]`` of the last ``take``: the queue then pops as if
        they had never left (each source's are the last its cursor passed)."""
        pos, abpos, block = self._last
        nb = bisect_right(block, taken[keep - 1]) if keep and block else 0
        self._pos = pos + nb
        self._abpos = abpos + keep - nb
