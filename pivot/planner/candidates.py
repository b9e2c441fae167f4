"""Step 3 of the planner: candidate set construction by dynamic programming (alg. 1,
app. D.2).

D[j] is the least total penalty that shifts up exactly j replicas using the pairs seen so
far, C[j] the plan that attains it. Taking any e >= 1 replicas of pair P_i costs phi_i once.
On equal penalties the later candidate in the traversal order is kept (app. D.2).
"""

from __future__ import annotations

from typing import Sequence

from pivot.planner.shift_pairs import ShiftPair

Choice = tuple[tuple[int, int], ...]
"""A candidate: (pair index, e) for every pair it uses, e = replicas taken from that pair."""


def construct_candidates(pairs: Sequence[ShiftPair], K: int) -> dict[int, tuple[float, Choice]]:
    """Alg. 1. Returns {k: (D[k], C[k])} for every reachable 1 <= k <= K.

    O(K * sum r_i) transitions, i.e. O(K I) (app. D.3).
    """
    inf = float("inf")
    D = [0.0] + [inf] * K
    C: list[Choice] = [()] * (K + 1)
    for i, pair in enumerate(pairs):
        D_hat, C_hat = list(D), list(C)
        for j in range(K + 1):
            if D[j] == inf:
                continue
            d = D[j] + pair.penalty
            for e in range(1, min(pair.r, K - j) + 1):
                if d <= D_hat[j + e]:
                    D_hat[j + e] = d
                    C_hat[j + e] = C[j] + ((i, e),)
        D, C = D_hat, C_hat
    return {k: (D[k], C[k]) for k in range(1, K + 1) if D[k] < inf}
