"""Alg. 1 against brute force over every subset of shift pairs."""

import itertools

from hypothesis import given, settings, strategies as st

from pivot.planner.candidates import construct_candidates
from pivot.types import ShiftDown
from pivot.planner.shift_pairs import ShiftPair


def pair(r, phi):
    return ShiftPair((ShiftDown(None, None, (0,)),), tuple((i,) for i in range(r)), phi)


def brute_force(pairs, K):
    best: dict[int, float] = {}
    for mask in itertools.product([0, 1], repeat=len(pairs)):
        used = [p for p, m in zip(pairs, mask) if m]
        phi = sum(p.penalty for p in used)
        top = sum(p.r for p in used)
        # Any 1 <= e_i <= r_i from each used pair: counts from len(used) to top.
        for k in range(len(used), min(top, K) + 1):
            if k >= 1:
                best[k] = min(best.get(k, float("inf")), phi)
    return best


@settings(max_examples=300, deadline=None)
@given(spec=st.lists(st.tuples(st.integers(1, 4), st.integers(0, 50)), min_size=1,
                     max_size=7),
       K=st.integers(1, 12))
def test_dp_minimum_penalty_equals_brute_force_for_every_count(spec, K):
    pairs = sorted((pair(r, float(phi)) for r, phi in spec), key=lambda p: p.penalty)
    got = construct_candidates(pairs, K)
    want = brute_force(pairs, K)
    assert set(got) == set(want)
    for k, (phi, choice) in got.items():
        assert phi == want[k]
        assert sum(e for _, e in choice) == k
        assert sum(pairs[i].penalty for i, _ in choice) == phi
        assert len({i for i, _ in choice}) == len(choice)


def test_equal_penalties_keep_the_later_candidate():
    pairs = [pair(1, 5.0), pair(1, 5.0)]
    got = construct_candidates(pairs, 1)
    assert got[1] == (5.0, ((1, 1),))


def test_no_pairs_give_no_candidates():
    assert construct_candidates([], 4) == {}
