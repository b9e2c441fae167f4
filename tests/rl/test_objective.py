"""The run's objective (pivot/rl/objective.py): the GenRM's weight in the reward and the
advantages' scaling, as the local trainer's batch uses them."""

import pytest

from pivot.errors import ConfigError
from pivot.rl.batch import build_train_batch
from pivot.rl.objective import Objective
from pivot.rl.trajectory import PromptGroup, Trajectory


def judged(i: int, answer: str, score: int) -> Trajectory:
    t = Trajectory(i, 0, 0, i, [1, 2], "7", "q", 0)
    t.response_tokens, t.response_logprobs = [3, 4], [-0.1, -0.2]
    t.response_text, t.judge_text = f"3 + 4 = {answer}\nAnswer: {answer}", f"ok\nScore: {score}"
    return t


@pytest.mark.parametrize("w", [0.0, 0.5, 1.0])
def test_the_genrm_weight_scales_only_the_genrms_part(w):
    r = Objective(genrm_weight=w).reward(judged(0, "7", 8))
    assert (r.verifiable, r.genrm) == (1.0, 0.8)
    assert r.total == pytest.approx(1.0 + w * 0.8)


def test_the_default_is_the_papers_sum():
    r = Objective().reward(judged(0, "6", 9))
    assert (r.total, r.verifiable, r.genrm) == (pytest.approx(0.9), 0.0, 0.9)


def test_a_batch_of_noise_alone_gets_small_advantages_without_std_scaling():
    trajs = [judged(i, "6", s) for i, s in enumerate((8, 9, 8, 9))]   # all wrong
    for t in trajs:
        t.reward = Objective().reward(t).total
    groups = [PromptGroup(0, 0, trajs)]
    scaled = build_train_batch(groups).advantages
    plain = build_train_batch(groups, scale_by_std=False).advantages
    assert scaled.abs().min() > 0.99 and plain.abs().max() < 0.051


@pytest.mark.parametrize("kwargs, match", [({"genrm_weight": -1.0}, "Objective.genrm_weight"),
                                           ({"scale_by_std": 1}, "Objective.scale_by_std")])
def test_bad_settings_are_refused_naming_the_binding(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        Objective(**kwargs)
