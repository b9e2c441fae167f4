"""The compiled what-if loops against the Python they are compiled from: numba must not
reassociate or fuse a single float operation (``pivot.scheduler.kernels``)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pivot.scheduler import kernels

pytestmark = pytest.mark.skipif(not kernels.COMPILED, reason="numba is not installed")

MODELS = [(2e-6, 0.02, 4e-4, 0.005), (1.5e-8, 0.0, 4.2e-4, 6.6e-3),
          (8.3e-9, 0.0, 2.2e-4, 5.2e-3)]


def _load(rng: np.random.Generator, model, R: int):
    A, B, C, D = model
    nseq = rng.integers(0, 40, R).astype(float)
    ntok = nseq * rng.integers(100, 5000, R)
    cap = ntok + rng.integers(0, 200_000, R)
    free = cap - ntok
    n1 = nseq + 1.0
    tput = np.where(nseq > 0, nseq / (A * ntok + np.maximum(B, C * nseq) + D), 0.0)
    den = A * ntok + np.maximum(B, C * n1) + D
    return [nseq, ntok, cap, free, tput, n1, den]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 31), model=st.sampled_from(MODELS), R=st.integers(1, 40),
       reserve=st.sampled_from([0, 2048]))
def test_dispatch_kernel_equals_its_python(seed, model, R, reserve):
    rng = np.random.default_rng(seed)
    arrays = _load(rng, model, R)
    lengths = rng.integers(10, 9000, 50)
    got, want = [a.copy() for a in arrays], [a.copy() for a in arrays]
    out_got, out_want = np.zeros(50, dtype=np.int64), np.zeros(50, dtype=np.int64)
    allowed = rng.random(R) < 0.7
    n_got = kernels.dispatch_plain(lengths, reserve, *model, *got, out_got, allowed)
    n_want = kernels.dispatch_plain.py_func(lengths, reserve, *model, *want, out_want,
                                            allowed)
    assert n_got == n_want
    assert (out_got[:n_got] == out_want[:n_want]).all()
    for a, b in zip(got, want):
        assert np.array_equal(a, b)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 31), model=st.sampled_from(MODELS), R=st.integers(1, 30),
       new=st.integers(1, 4))
def test_migration_kernel_equals_its_python(seed, model, R, new):
    rng = np.random.default_rng(seed)
    arrays = _load(rng, model, R)
    sid = iter(range(10 ** 6))
    runs = []
    for n, t in zip(arrays[0].astype(int), arrays[1].astype(int)):
        lens = rng.multinomial(t - n, np.ones(n) / n) + 1 if n else []
        runs.append({next(sid): int(x) for x in lens})
    A, B, C, D = model
    empty = (0.0, 0.0, 3e5, 3e5, 0.0, 1.0, max(B, C) + D)  # a new replica's load
    arrays = [np.concatenate([a, np.full(new, v)]) for a, v in zip(arrays, empty)]
    runs += [{} for _ in range(new)]

    def run(fn):
        a = [x.copy() for x in arrays]
        pool = kernels.HeapPool(runs)
        n = len(runs)
        budget = int(a[0].sum())
        ht = np.empty(n + 2 * budget + 1)
        hv = np.zeros(n + 2 * budget + 1, dtype=np.int64)
        hi = np.empty(n + 2 * budget + 1, dtype=np.int64)
        ht[:n], hi[:n] = -a[4], np.arange(n)
        kernels.heapify(ht, hv, hi, n)
        version = np.zeros(n, dtype=np.int64)
        stt = np.array([n, budget, 0, 0, 0], dtype=np.int64)
        log = np.empty((budget, 3), dtype=np.int64)
        while True:
            fn(*model, 0, *a, pool.keys, pool.off, pool.size, pool.capy, ht, hv, hi,
               version, stt, log)
            if stt[3] != 1:
                break
            pool.grow(int(stt[4]))
        return a, log[:stt[2]].tolist()

    (a_got, log_got), (a_want, log_want) = (run(kernels.migrate_plain),
                                            run(kernels.migrate_plain.py_func))
    assert log_got == log_want
    for x, y in zip(a_got, a_want):
        assert np.array_equal(x, y)
