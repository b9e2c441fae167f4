"""Greedy sender selection of the GPS communication plan (paper appendix B.2, step 2).

Each demand goes to the candidate sender whose accumulated estimated latency is smallest
once it takes the demand. Demands are swept largest first, and a run of demands with the
same size, candidate set and receiving host is assigned in closed form by water filling
(exactly what the one-at-a-time greedy does, up to ties), so a plan with hundreds of
thousands of demands costs a few hundred small steps.

Speed (a replicated Write of a 72B-like model makes every host a receiver of the same
slices: ~550 runs of 16-128 candidates; 24 -> 10 ms CPU here):

* runs are ordered by one stable sort of a packed int64 key (not a three-key lexsort);
* a run's counts depend only on its candidates' loads and costs, so they are memoised:
  disjoint but symmetric candidate sets (the DP replicas of every TP rank in a Write)
  repeat the same inputs and are solved once;
* the fix-up after flooring the water level takes the d smallest next values at once when
  no candidate needs two more (else steps off a heap), never scanning every candidate per
  step; the senders of all runs are expanded by one ``numpy.repeat`` at the end.

Every float is computed by the same expression as before and ties go to the lowest
candidate index as before, so plans are bit-identical to the scan-based version
(``tests/gps/test_plan.py`` checks this against a verbatim copy of it).
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    from pivot.gps.plan import LinkProfile

_SMALL = 32
"""Candidate sets up to this size are water-filled on Python lists, larger ones in numpy."""


def _fix_counts(acc: Sequence[float], cost: Sequence[float], counts: list[int], m: int
                ) -> list[int]:
    """Brings ``sum(counts)`` to ``m`` by single greedy steps, in place.

    Too many: take one back from the candidate whose last demand ends latest; too few:
    give one to the candidate whose next demand would end earliest. Ties go to the lowest
    index (what ``min``/``max``/``argmin``/``argmax`` over the candidates return), and each
    value is ``acc[i] + counts[i] * cost[i]`` as a scan would compute it.
    """
    s = sum(counts)
    if s > m:
        heap = [(-(acc[i] + counts[i] * cost[i]), i) for i in range(len(counts)) if counts[i]]
        heapq.heapify(heap)
        for _ in range(s - m):
            _, i = heapq.heappop(heap)
            counts[i] -= 1
            if counts[i]:
                heapq.heappush(heap, (-(acc[i] + counts[i] * cost[i]), i))
    elif s < m:
        heap = [(acc[i] + (counts[i] + 1) * cost[i], i) for i in range(len(counts))]
        d = m - s
        if d <= len(heap):
            # Usually every candidate takes at most one more: the d smallest next values,
            # provided none of them would be followed by its own next value first.
            nxt = sorted(heap)[:d]
            if all((acc[i] + (counts[i] + 2) * cost[i], i) > nxt[-1] for _, i in nxt):
                for _, i in nxt:
                    counts[i] += 1
                return counts
        heapq.heapify(heap)
        for _ in range(m - s):
            _, i = heapq.heappop(heap)
            counts[i] += 1
            heapq.heappush(heap, (acc[i] + (counts[i] + 1) * cost[i], i))
    return counts


def water_fill(acc: np.ndarray, cost: np.ndarray, m: int) -> np.ndarray:
    """How many of ``m`` identical demands the sequential greedy gives each candidate.

    The greedy repeatedly picks ``argmin(acc + (n + 1) * cost)``; its choices are the ``m``
    smallest values ``acc_g + t * cost_g`` (t >= 1). The continuous level is found by
    water filling; flooring it and a few single greedy steps make it exact (up to ties).
    """
    n = acc.size
    if n == 1:
        return np.array([m], dtype=np.int64)
    order = np.argsort(acc, kind="stable")
    a, inv = acc[order], 1.0 / cost[order]
    level = (m + np.cumsum(a * inv)) / np.cumsum(inv)
    active = np.flatnonzero(a < level)
    t = level[active[-1]] if active.size else level[0]
    counts = np.floor(np.maximum(t - acc, 0.0) / cost).astype(np.int64)
    fixed = _fix_counts(acc.tolist(), cost.tolist(), counts.tolist(), m)
    return np.asarray(fixed, dtype=np.int64)


def _water_fill_small(acc: list[float], cost: list[float], m: int) -> list[int]:
    """:func:`water_fill` on Python lists: faster for the few candidates of a Read."""
    order = sorted(range(len(acc)), key=acc.__getitem__)
    si = sa = 0.0
    level = 0.0
    for g in order:
        if si and acc[g] >= level:
            break
        si += 1.0 / cost[g]
        sa += acc[g] / cost[g]
        level = (m + sa) / si
    counts = [int((level - a) / c) if level > a else 0 for a, c in zip(acc, cost)]
    return _fix_counts(acc, cost, counts, m)


def _run_order(nbytes: np.ndarray, cset: np.ndarray, rclass: np.ndarray) -> np.ndarray:
    """``numpy.lexsort((rclass, cset, -nbytes))``: demands largest first, then by candidate
    set and receiver class, ties in input order. When the three fit in 63 bits they are
    packed into one key and sorted once (a stable sort of one int64 array: the same
    permutation, 2-3x faster than the three-key lexsort)."""
    if not nbytes.size:
        return np.zeros(0, dtype=np.int64)
    lo_r, lo_c, top = int(rclass.min()), int(cset.min()), int(nbytes.max())
    r = rclass.astype(np.int64) - lo_r
    c = cset.astype(np.int64) - lo_c
    rbits, cbits = int(r.max()).bit_length(), int(c.max()).bit_length()
    nbits = (top - int(nbytes.min())).bit_length()
    if rbits + cbits + nbits > 62:
        return np.lexsort((rclass, cset, -nbytes))
    key = ((top - nbytes.astype(np.int64)) << (rbits + cbits)) | (c << rbits) | r
    return np.argsort(key, kind="stable")


def assign(nbytes: np.ndarray, cset: np.ndarray, recv_host: np.ndarray, rclass: np.ndarray,
            candidates: Sequence[np.ndarray], sender_host: np.ndarray, num_senders: int,
            links: LinkProfile, greedy: bool
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Chooses a sender per demand: (sender, link, cost) per demand and load per sender.

    Demands with equal ``(size, cset, rclass)`` have equal candidate costs and form one
    run; ``rclass`` must determine which candidates are local to the receiving host.
    """
    n = nbytes.size
    sender = np.empty(n, dtype=np.int64)
    if not greedy or all(c.size == 1 for c in candidates):
        first = np.array([c[0] for c in candidates], dtype=np.int64)
        sender[:] = first[cset]
    elif n:
        order = _run_order(nbytes, cset, rclass)
        nb_s, cs_s, rc_s = nbytes[order], cset[order], rclass[order]
        change = np.flatnonzero((nb_s[1:] != nb_s[:-1]) | (cs_s[1:] != cs_s[:-1])
                                | (rc_s[1:] != rc_s[:-1])) + 1
        bounds = np.concatenate([[0], change, [n]])
        sizes = np.diff(bounds).tolist()
        firsts = order[bounds[:-1]]
        run_b = nbytes[firsts].tolist()
        run_c = cset[firsts].tolist()
        run_h = recv_host[firsts].tolist()
        cand_hosts = [sender_host[c].tolist() for c in candidates]
        cand_list = [c.tolist() for c in candidates]
        acc = [0.0] * num_senders
        lb, rb, c0 = 1.0 / links.local_bw, 1.0 / links.remote_bw, links.per_transfer_s
        who: list[int] = []   # the candidates of every run, run after run
        many: list[int] = []  # how many demands of the run each of them takes
        memo: dict[tuple, list[int]] = {}
        for b, c, h, size in zip(run_b, run_c, run_h, sizes):
            cl = cand_list[c]
            cost = [b * (lb if ch == h else rb) + c0 for ch in cand_hosts[c]]
            a = [acc[g] for g in cl]
            # A run's counts depend only on its candidates' loads and costs: runs on
            # disjoint but symmetric candidate sets (every TP rank's DP replicas in a
            # Write, every slot's holders in a Read) repeat the same inputs.
            key = (size, *a, *cost)
            counts = memo.get(key)
            if counts is None:
                if len(cost) <= _SMALL:
                    counts = _water_fill_small(a, cost, size)
                else:
                    counts = water_fill(np.array(a), np.asarray(cost), size).tolist()
                memo[key] = counts
            for g, k, x in zip(cl, counts, cost):
                acc[g] += k * x
            who += cl
            many += counts
        sender[order] = np.repeat(np.asarray(who, dtype=np.int64),
                                  np.asarray(many, dtype=np.int64))
    remote = sender_host[sender] != recv_host
    link = remote.view(np.int8)  # Link.LOCAL = 0, Link.REMOTE = 1
    cost = nbytes * np.where(remote, 1.0 / links.remote_bw, 1.0 / links.local_bw)
    cost += links.per_transfer_s
    load = np.bincount(sender, weights=cost, minlength=num_senders)
    return sender, link, cost, load
