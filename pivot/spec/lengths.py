"""Long-tailed lengths of prompts, policy responses and GenRM judgements (sec. 8.1).

Lognormal, capped. The shape sigma comes from Laminar's p99 ~ 10 x median
(third_party/calibration/README.md): sigma = ln(10) / z_0.99 = 2.3026 / 2.3263 = 0.99.
Medians are gin bindings per model group; caps are the paper's 2K / 15K / 20K.
``tail_share`` checks Seer's "the last 10% of requests take up to 50% of rollout time".
"""

from __future__ import annotations

from dataclasses import dataclass

import gin
import numpy as np

from pivot.config.validation import check_range

LAMINAR_SIGMA = float(np.log(10.0) / 2.3263)


@gin.configurable
@dataclass(frozen=True)
class LengthModel:
    """Attributes:
        prompt_median / response_median / judge_median: medians in tokens (prompts 300:
            DAPO-Math-17k problems are short, an assumption; the other two are bound per
            workload, ``gin/base.gin``).
        prompt_cap / response_cap / judge_cap: the paper's limits (2K, 15K, 20K, sec. 8.1).
        sigma: lognormal shape (Laminar); prompts use ``prompt_sigma``.
    """

    prompt_median: float = 300.0
    response_median: float = 3000.0
    judge_median: float = 1500.0
    prompt_cap: int = 2048
    response_cap: int = 15360
    judge_cap: int = 20480
    sigma: float = LAMINAR_SIGMA
    prompt_sigma: float = 0.5

    def __post_init__(self) -> None:
        for k in ("prompt", "response", "judge"):
            cap = getattr(self, f"{k}_cap")
            check_range(f"LengthModel.{k}_cap", cap, 1, integer=True, why="tokens")
            check_range(f"LengthModel.{k}_median", getattr(self, f"{k}_median"), 0, cap,
                        open_lo=True, why=f"tokens, at most LengthModel.{k}_cap={cap}")
        for k in ("sigma", "prompt_sigma"):
            check_range(f"LengthModel.{k}", getattr(self, k), 0, open_lo=True,
                        why="lognormal shape")

    @staticmethod
    def _draw(rng: np.random.Generator, median: float, sigma: float, cap: int,
              size: int) -> np.ndarray:
        x = rng.lognormal(np.log(median), sigma, size)
        return np.clip(np.rint(x), 1, cap).astype(np.int64)

    def prompts(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return self._draw(rng, self.prompt_median, self.prompt_sigma, self.prompt_cap, size)

    def responses(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return self._draw(rng, self.response_median, self.sigma, self.response_cap, size)

    def judgements(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return self._draw(rng, self.judge_median, self.sigma, self.judge_cap, size)


def tail_share(lengths: np.ndarray, top: float = 0.1) -> float:
    """Share of decode steps spent after the first (1 - top) of requests finished, for a
    batch started together (the rollout-time view of Seer's observation)."""
    s = np.sort(lengths)
    cut = s[int(np.ceil((1 - top) * len(s))) - 1]
    return float((s.max() - cut) / s.max())
