"""What a run optimises (sec. 8.1, app. E): how the GenRM's score enters the reward and
how a GRPO group's rewards become advantages. The paper's setting is the default:
R = R_verifiable + R_GenRM, advantages scaled by the group's standard deviation."""

from __future__ import annotations

from dataclasses import dataclass

import gin

from pivot.config.validation import check_bool, check_range
from pivot.rewards.combine import Reward, trajectory_reward
from pivot.rl.trajectory import Trajectory


@gin.configurable
@dataclass(frozen=True)
class Objective:
    """Attributes:
        genrm_weight: R = R_verifiable + genrm_weight * R_GenRM (1: the paper; 0: the
            verifier alone, the GenRM still judges every response and its score is
            still logged).
        scale_by_std: GRPO's (r - mean) / std per group (the paper); False: r - mean
            (Dr. GRPO), so a group whose rewards differ only by the GenRM's noise gets
            small advantages instead of unit ones.
    """

    genrm_weight: float = 1.0
    scale_by_std: bool = True

    def __post_init__(self) -> None:
        check_range("Objective.genrm_weight", self.genrm_weight, 0,
                    why="weight of the GenRM's score in the reward")
        check_bool("Objective.scale_by_std", self.scale_by_std)

    def reward(self, t: Trajectory) -> Reward:
        """R of one judged trajectory."""
        return trajectory_reward(t.response_text or "", t.ground_truth, t.judge_text,
                                 self.genrm_weight)
