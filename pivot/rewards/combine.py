"""The trajectory reward of sec. 8.1: R = R_verifiable + R_GenRM (``genrm_weight`` x
R_GenRM where a run weights it, ``pivot.rl.objective``)."""

from __future__ import annotations

from dataclasses import dataclass

from pivot.rewards.genrm import ParsedScore, parse_genrm_score
from pivot.rewards.verifiable import verifiable_reward


@dataclass(frozen=True, slots=True)
class Reward:
    """One trajectory's reward and its parts.

    Attributes:
        total: R = verifiable + w * genrm, in [0, 1 + w] (w = 1: the paper's sum).
        verifiable: R_verifiable in {0, 1}.
        genrm: R_GenRM in [0, 1].
        genrm_ok: False when the judgement was unparseable (its reward was FAIL_SCORE).
        genrm_reason: the parser's reason (see ``ParsedScore``).
    """

    total: float
    verifiable: float
    genrm: float
    genrm_ok: bool
    genrm_reason: str


def combine(verifiable: float, parsed: ParsedScore, genrm_weight: float = 1.0) -> Reward:
    """R = R_verifiable + genrm_weight * R_GenRM from the two parts."""
    return Reward(verifiable + genrm_weight * parsed.score, verifiable, parsed.score,
                  parsed.ok, parsed.reason)


def trajectory_reward(response: str, ground_truth: str, judge_output: str | None,
                      genrm_weight: float = 1.0) -> Reward:
    """R for one policy response, given the ground truth and the GenRM's output on it."""
    return combine(verifiable_reward(response, ground_truth), parse_genrm_score(judge_output),
                   genrm_weight)
