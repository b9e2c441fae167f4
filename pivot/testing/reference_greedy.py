"""The scan-based greedy sender selection as it was before the heap/batched rewrite of
:mod:`pivot.gps.greedy` (verbatim; tests only, see ``pivot.testing``): the straightforward
reference that the fast version must match bit for bit (tests/gps/test_plan.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    from pivot.gps.plan import LinkProfile


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
    s = int(counts.sum())
    while s > m:
        last = np.where(counts > 0, acc + counts * cost, -np.inf)
        counts[int(np.argmax(last))] -= 1
        s -= 1
    while s < m:
        counts[int(np.argmin(acc + (counts + 1) * cost))] += 1
        s += 1
    return counts


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
    counts = [max(int((level - a) / c), 0) if level > a else 0 for a, c in zip(acc, cost)]
    s = sum(counts)
    while s > m:
        g = max((i for i in range(len(acc)) if counts[i]),
                key=lambda i: acc[i] + counts[i] * cost[i])
        counts[g] -= 1
        s -= 1
    while s < m:
        g = min(range(len(acc)), key=lambda i: acc[i] + (counts[i] + 1) * cost[i])
        counts[g] += 1
        s += 1
    return counts


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
        acc = np.zeros(num_senders)
        order = np.lexsort((rclass, cset, -nbytes))
        nb_s, cs_s, rc_s = nbytes[order], cset[order], rclass[order]
        change = np.flatnonzero((nb_s[1:] != nb_s[:-1]) | (cs_s[1:] != cs_s[:-1])
                                | (rc_s[1:] != rc_s[:-1])) + 1
        bounds = np.concatenate([[0], change, [n]]).tolist()
        firsts = order[bounds[:-1]]
        run_b = nbytes[firsts].tolist()
        run_c = cset[firsts].tolist()
        run_h = recv_host[firsts].tolist()
        cand_hosts = [sender_host[c].tolist() for c in candidates]
        cand_list = [c.tolist() for c in candidates]
        acc_l = acc.tolist()
        lb, rb, c0 = 1.0 / links.local_bw, 1.0 / links.remote_bw, links.per_transfer_s
        for i in range(len(run_b)):
            lo, hi = bounds[i], bounds[i + 1]
            cands = candidates[run_c[i]]
            b, h = run_b[i], run_h[i]
            cost = [b * (lb if ch == h else rb) + c0 for ch in cand_hosts[run_c[i]]]
            if len(cost) <= 32:
                cl = cand_list[run_c[i]]
                counts = _water_fill_small([acc_l[g] for g in cl], cost, hi - lo)
                for g, k, c in zip(cl, counts, cost):
                    acc_l[g] += k * c
            else:
                cnp = np.asarray(cost)
                a = np.asarray(acc_l)
                counts = water_fill(a[cands], cnp, hi - lo)
                a[cands] += counts * cnp
                acc_l = a.tolist()
            sender[order[lo:hi]] = np.repeat(cands, counts)
    remote = sender_host[sender] != recv_host
    link = remote.view(np.int8)  # Link.LOCAL = 0, Link.REMOTE = 1
    cost = nbytes * np.where(remote, 1.0 / links.remote_bw, 1.0 / links.local_bw)
    cost += links.per_transfer_s
    load = np.bincount(sender, weights=cost, minlength=num_senders)
    return sender, link, cost, load
