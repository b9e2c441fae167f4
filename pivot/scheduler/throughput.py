"""The throughput model of sec. 6.1 and appendix A, and its offline fit.

A replica doing continuous batching spends one inter-token latency per decode step

    tau_i = A * N_tok + max(B, C * N_seq) + D                                  (app. A)

and so generates T_i = N_seq / tau_i tokens per second. ``A`` is the attention (KV read)
cost per cached token, ``max(B, C * N_seq)`` the FFN layers (weight loading or compute,
whichever dominates), ``D`` the rest.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from pivot.errors import ConfigError, StateError


@dataclass(frozen=True, slots=True)
class ThroughputModel:
    """T_i = N_seq / (A * N_tok + max(B, C * N_seq) + D), constants in seconds (sec. 6.1)."""

    A: float
    B: float
    C: float
    D: float

    def __post_init__(self) -> None:
        for name in ("A", "B", "C", "D"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0:
                raise StateError(f"throughput model constant {name}={v} must be finite and "
                                 f">= 0; refit the profile or fix the gin binding")
        if self.B + self.D <= 0 and self.C <= 0:
            raise StateError("throughput model: B + D and C are all 0, so an empty batch "
                             "would take no time; refit the profile")

    def step_latency(self, num_seqs: int, num_tokens: int) -> float:
        """Inter-token latency tau of one decode step, in seconds."""
        return self.A * num_tokens + max(self.B, self.C * num_seqs) + self.D

    def throughput(self, num_seqs: int, num_tokens: int) -> float:
        """T_i in tokens per second; 0 for an idle replica."""
        if num_seqs <= 0:
            return 0.0
        return num_seqs / self.step_latency(num_seqs, num_tokens)

    def gain(self, num_seqs: int, num_tokens: int, length: int) -> float:
        """Delta T_i of dispatching one more sequence of ``length`` tokens (sec. 6.1)."""
        return self.throughput(num_seqs + 1, num_tokens + length) - self.throughput(
            num_seqs, num_tokens)

    def gains(self, num_seqs: np.ndarray, num_tokens: np.ndarray, length: int,
              before: np.ndarray | None = None) -> np.ndarray:
        """Vectorised ``gain`` over replicas (the scheduler's hot path).

        ``before`` may carry the replicas' current throughputs, which callers that keep
        them up to date pass to save the work.
        """
        if before is None:
            before = self.throughputs(num_seqs, num_tokens)
        n1 = num_seqs + 1.0
        lat = self.C * n1
        np.maximum(lat, self.B, out=lat)
        lat += self.A * num_tokens
        lat += self.A * length + self.D
        np.divide(n1, lat, out=n1)
        n1 -= before
        return n1

    def throughputs(self, num_seqs: np.ndarray, num_tokens: np.ndarray) -> np.ndarray:
        """Vectorised ``throughput``."""
        lat = self.A * num_tokens + np.maximum(self.B, self.C * num_seqs) + self.D
        return np.where(num_seqs > 0, num_seqs / lat, 0.0)

    def after_terms(self, num_seqs: np.ndarray, num_tokens: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
        """(N + 1, A * N_tok + max(B, C * (N + 1)) + D): with them the throughput after
        dispatching a length-l sequence is num / (den + A * l), so a dispatch decision costs
        a few array operations. The scheduler keeps them per replica."""
        n1 = num_seqs + 1.0
        return n1, self.A * num_tokens + np.maximum(self.B, self.C * n1) + self.D

    def gains_from_terms(self, num: np.ndarray, den: np.ndarray, length: int,
                         before: np.ndarray, num_tokens: np.ndarray) -> np.ndarray:
        """``gains`` from the cached ``after_terms`` and current throughputs."""
        g = den + self.A * length
        np.divide(num, g, out=g)
        g -= before
        return g

    def save(self, path: str | Path, **extra: object) -> None:
        """Writes the constants (and any fit report in ``extra``) as JSON."""
        Path(path).write_text(json.dumps({"model": asdict(self), **extra}, indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "ThroughputModel":
        """Reads a profile file written by ``save`` (or by the profiling command)."""
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"throughput profile {p} does not exist; run the profiling "
                              f"command (benchmarks/profile_engine.py) or fix the path")
        try:
            data = json.loads(p.read_text())["model"]
            return cls(**{k: float(data[k]) for k in ("A", "B", "C", "D")})
        except (KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
            raise ConfigError(f"throughput profile {p} is malformed ({e}); it needs "
                              f'{{"model": {{"A": .., "B": .., "C": .., "D": ..}}}}') from None


class BinaryThroughputModel(ThroughputModel):
    """The ablation's 0/1 model: a replica's throughput is 1 if it runs anything (sec. 8.4).

    Dispatch under it prefers an empty replica, then the one with the fewest tokens, which
    is load balancing without a model.
    """

    def __init__(self) -> None:
        object.__setattr__(self, "A", 0.0)
        object.__setattr__(self, "B", 1.0)
        object.__setattr__(self, "C", 0.0)
        object.__setattr__(self, "D", 0.0)

    def throughput(self, num_seqs: int, num_tokens: int) -> float:
        return 1.0 if num_seqs > 0 else 0.0

    def gains(self, num_seqs: np.ndarray, num_tokens: np.ndarray, length: int,
              before: np.ndarray | None = None) -> np.ndarray:
        # 1 for an empty replica, else a tie broken towards fewer tokens (a tiny negative).
        return np.where(num_seqs > 0, 0.0, 1.0) - 1e-12 * num_tokens

    def throughputs(self, num_seqs: np.ndarray, num_tokens: np.ndarray) -> np.ndarray:
        return (num_seqs > 0).astype(float)

    def gains_from_terms(self, num: np.ndarray, den: np.ndarray, length: int,
                         before: np.ndarray, num_tokens: np.ndarray) -> np.ndarray:
        return 1.0 - before - 1e-12 * num_tokens


@dataclass(frozen=True, slots=True)
class LatencySample:
    """One measured decode step: running sequences, their total tokens, step seconds."""

    num_seqs: int
    num_tokens: int
    latency: float


@dataclass(frozen=True, slots=True)
class FitReport:
    """How well the fitted model explains the samples."""

    num_samples: int
    rmse: float
    """Root mean squared error of the step latency, seconds."""
    mean_rel_error: float
    """Mean of |predicted - measured| / measured."""
    max_rel_error: float
    r2: float
    breakpoint_seqs: float
    """B / C: the batch size where the FFN term turns from weight loading to compute."""


def _nnls_small(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares for a handful of columns, by active sets."""
    best, best_err = np.zeros(X.shape[1]), float(np.sum(y ** 2))
    for k in range(1, X.shape[1] + 1):
        for cols in itertools.combinations(range(X.shape[1]), k):
            coef, *_ = np.linalg.lstsq(X[:, cols], y, rcond=None)
            if np.any(coef < 0):
                continue
            err = float(np.sum((X[:, cols] @ coef - y) ** 2))
            if err < best_err:
                best_err = err
                best = np.zeros(X.shape[1])
                best[list(cols)] = coef
    return best


def fit_throughput_model(samples: Iterable[LatencySample]) -> tuple[ThroughputModel, FitReport]:
    """Fits A, B, C, D to measured decode steps by least squares (app. A).

    Rows are weighted by 1 / latency (relative error), since steps of a long batch would
    otherwise drown the short ones. The max makes the model piecewise linear. With the
    breakpoint n* = B / C fixed, the latency is A * N_tok + C * max(n*, N_seq) + D, linear
    in (A, C, D) with B = C * n*. We scan n* over the measured batch sizes (and the
    midpoints between them), solve a non-negative least squares problem for each, and keep the best.

    Raises:
        StateError: fewer than 4 samples, or a sample with a non-positive latency.
    """
    s = list(samples)
    if len(s) < 4:
        raise StateError(f"fitting A, B, C, D needs at least 4 samples, got {len(s)}")
    n = np.array([x.num_seqs for x in s], dtype=float)
    t = np.array([x.num_tokens for x in s], dtype=float)
    y = np.array([x.latency for x in s], dtype=float)
    if np.any(y <= 0) or np.any(n <= 0) or np.any(t < 0):
        raise StateError("latency samples need num_seqs > 0, num_tokens >= 0, latency > 0")
    w = 1.0 / y  # relative least squares: step latencies span orders of magnitude

    def solve(nstar: float) -> tuple[float, np.ndarray, float]:
        X = np.stack([t, np.maximum(nstar, n), np.ones_like(n)], axis=1)
        coef = _nnls_small(X * w[:, None], y * w)
        return float(np.sum(((X @ coef - y) * w) ** 2)), coef, float(nstar)

    levels = np.unique(n)
    grid = np.geomspace(max(levels[0] / 2, 0.5), levels[-1], 256)
    cands = np.unique(np.concatenate([[0.0], levels, grid]))
    fits = [solve(c) for c in cands]
    i = min(range(len(fits)), key=lambda k: fits[k][0])
    best = fits[i]
    # Refine the breakpoint between the neighbouring candidates (golden-section search).
    lo, hi = cands[max(i - 2, 0)], cands[min(i + 2, len(cands) - 1)]
    g = (math.sqrt(5) - 1) / 2
    for _ in range(40):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        if solve(a)[0] < solve(b)[0]:
            hi = b
        else:
            lo = a
    refined = solve((lo + hi) / 2)
    if refined[0] < best[0]:
        best = refined
    _, (A, C, D), nstar = best
    model = ThroughputModel(A=float(A), B=float(C * nstar), C=float(C), D=float(D))
    pred = np.array([model.step_latency(int(a), int(b)) for a, b in zip(n, t)])
    rel = np.abs(pred - y) / y
    sse = float(np.sum((pred - y) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    report = FitReport(
        num_samples=len(s), rmse=math.sqrt(sse / len(s)), mean_rel_error=float(rel.mean()),
        max_rel_error=float(rel.max()), r2=1.0 - sse / ss_tot if ss_tot > 0 else 1.0,
        breakpoint_seqs=nstar)
    return model, report


def samples_from_arrays(num_seqs: Sequence[int], num_tokens: Sequence[int],
                        latency: Sequence[float]) -> list[LatencySample]:
    """Zips three equal-length columns into samples."""
    if not (len(num_seqs) == len(num_tokens) == len(latency)):
        raise StateError("num_seqs, num_tokens and latency must have the same length")
    return [LatencySample(int(a), int(b), float(c))
            for a, b, c in zip(num_seqs, num_tokens, latency)]
