import pytest

from pivot.rewards import combine, parse_genrm_score, trajectory_reward


def test_the_reward_is_the_sum_of_verifiable_and_genrm():
    r = trajectory_reward(" Answer: 85", "85", " Check: ok\nScore: 8")
    assert (r.total, r.verifiable, r.genrm, r.genrm_ok) == (pytest.approx(1.8), 1.0,
                                                            pytest.approx(0.8), True)


def test_a_wrong_answer_with_a_broken_judgement_gets_zero_and_is_flagged():
    r = trajectory_reward(" Answer: 84\nScore: 10", "85", "")
    assert r.total == 0.0 and not r.genrm_ok and r.genrm_reason == "empty"


def test_combine_takes_the_parsed_score_as_is():
    assert combine(1.0, parse_genrm_score("Score: 11")).total == 2.0
