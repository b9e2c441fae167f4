"""Step 3 of the planner: candidate set construction by dynamic programming (alg. 1,
app. D.2).

D[j] is the least total penalty that shifts up exactly j replicas using the pairs seen so
far, C[j] the plan that attains it. Taking any e >= 1 replicas of pair P_i costs phi_i once.
On equal penalties the later candidate in the traversal order is kept (app. D.2).

Alg. 1 visits, for each pair, every (j, e) in j-major order and keeps the new value at
j + e when it is <= the one there. The updates of one pair at different targets t = j + e
do not interact, and for a fixed t the j-major order visits j = t - e in ascending order,
which is e in descending order; so the pair's transitions run as one array operation per
e (largest first) over all j at once, in exactly alg. 1's order for every target: the same
comparisons, the same float sums, the same winners. Plans are kept as back-pointers (a
node per taken (pair, e), pointing at the plan it extends) rather than copied tuples, so a
transition costs O(1) and a plan is read out only when asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pivot.planner.shift_pairs import ShiftPair

Choice = tuple[tuple[int, int], ...]
"""A candidate: (pair index, e) for every pair it uses, e = replicas taken from that pair."""


@dataclass(frozen=True, slots=True)
class CandidateSet:
    """Alg. 1's result: ``penalty[k]`` = D[k] (inf: unreachable) and the back-pointer
    nodes of each plan (``node[k]``: -1 for the empty plan; node n takes ``node_e[n]``
    replicas of pair ``node_pair[n]`` and extends the plan of node ``node_parent[n]``)."""

    penalty: list[float]
    node: list[int]
    node_pair: list[int]
    node_e: list[int]
    node_parent: list[int]

    def counts(self) -> list[int]:
        """Every reachable shift-up count 1 <= k <= K, ascending."""
        inf = float("inf")
        return [k for k in range(1, len(self.penalty)) if self.penalty[k] < inf]

    def choice(self, k: int) -> Choice:
        """C[k]: the (pair, e) of candidate k in the order alg. 1 added them."""
        out = []
        n = self.node[k]
        pair, e, parent = self.node_pair, self.node_e, self.node_parent
        while n >= 0:
            out.append((pair[n], e[n]))
            n = parent[n]
        return tuple(reversed(out))


def candidate_set(pairs: Sequence[ShiftPair], K: int) -> CandidateSet:
    """Alg. 1 over ``pairs`` (sorted by phi) for shift-up counts up to ``K``.

    O(K * sum r_i) transitions, i.e. O(K I) (app. D.3), done as sum r_i array operations.
    """
    inf = float("inf")
    D = np.full(K + 1, inf)
    D[0] = 0.0
    node = np.full(K + 1, -1, dtype=np.int64)
    n_pair: list[np.ndarray] = []
    n_e: list[np.ndarray] = []
    n_parent: list[np.ndarray] = []
    made = 0
    for i, pair in enumerate(pairs):
        valid = D < inf
        if not valid.any():
            continue
        d = D + pair.penalty
        D_hat, node_hat = D.copy(), node.copy()
        for e in range(min(pair.r, K), 0, -1):
            # j = 0..K-e onto t = j + e; D_hat[t] holds the value alg. 1 compares against
            take = valid[:K + 1 - e] & (d[:K + 1 - e] <= D_hat[e:])
            j = np.flatnonzero(take)
            if not j.size:
                continue
            D_hat[j + e] = d[j]
            node_hat[j + e] = np.arange(made, made + j.size)
            n_pair.append(np.full(j.size, i, dtype=np.int64))
            n_e.append(np.full(j.size, e, dtype=np.int64))
            n_parent.append(node[j])
            made += j.size
        D, node = D_hat, node_hat

    def cat(xs: list[np.ndarray]) -> list[int]:
        return np.concatenate(xs).tolist() if xs else []
    return CandidateSet(D.tolist(), node.tolist(), cat(n_pair), cat(n_e), cat(n_parent))


def construct_candidates(pairs: Sequence[ShiftPair], K: int) -> dict[int, tuple[float, Choice]]:
    """Alg. 1. Returns {k: (D[k], C[k])} for every reachable 1 <= k <= K."""
    cs = candidate_set(pairs, K)
    return {k: (cs.penalty[k], cs.choice(k)) for k in cs.counts()}
