"""Rewards of the RL loop: R = R_verifiable + R_GenRM (sec. 8.1).

API used by the RL loop::

    from pivot.rewards import build_genrm_prompt, parse_genrm_score, verifiable_reward
    prompt = build_genrm_prompt(problem, response)     # text for the GenRM engine
    parsed = parse_genrm_score(judge_output)           # ParsedScore(score, ok, reason)
    r_v = verifiable_reward(response, ground_truth)    # 1.0 / 0.0 via math-verify
    reward = combine(r_v, parsed)                      # Reward(total, ...), total in [0, 2]

Scales: R_verifiable is 1.0 (correct) or 0.0 (DAPO's +1/-1 is not used); R_GenRM is the
judge's last ``Score: N`` line, N in 0-10, divided by 10. Unparseable, empty or runaway
judgements give 0.0 with ``ok=False``: count them in metrics.
"""

from pivot.rewards.combine import Reward, combine, trajectory_reward
from pivot.rewards.genrm import ParsedScore, build_genrm_prompt, parse_genrm_score
from pivot.rewards.verifiable import (accuracy_at_1, extract_answer, is_correct,
                                      verifiable_reward)

__all__ = ["ParsedScore", "Reward", "accuracy_at_1", "build_genrm_prompt", "combine",
           "extract_answer", "is_correct", "parse_genrm_score", "trajectory_reward",
           "verifiable_reward"]
