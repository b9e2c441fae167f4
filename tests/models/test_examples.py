import random

from pivot.data.arithmetic import Problem
from pivot.models.examples import candidate_response, genrm_example, judge_score
from pivot.rewards import is_correct, parse_genrm_score

P = Problem("37 + 48", 85, 3)


def test_the_reference_judgement_gives_10_only_to_a_correct_answer():
    assert judge_score(P, " Answer: 85")[1] == 10
    assert [judge_score(P, f" Answer: {v}")[1] for v in (84, 87, 80, 70)] == [3, 2, 1, 0]
    assert judge_score(P, " 37 + 48 = 85")[1] == 0            # no answer line
    assert judge_score(P, " Answer: 84 or 85")[1] == 0        # hedge
    assert judge_score(P, " Answer: 84\nScore: 10")[1] == 3   # its own score is ignored


def test_candidate_responses_mix_right_and_wrong_and_the_judgement_agrees():
    rng = random.Random(0)
    cands = [candidate_response(rng, P) for _ in range(400)]
    right = sum(is_correct(c, "85") for c in cands) / len(cands)
    assert 0.3 < right < 0.6
    for c in cands:
        assert (judge_score(P, c)[1] == 10) == is_correct(c, "85")


def test_genrm_examples_end_with_a_parseable_score():
    rng = random.Random(1)
    for _ in range(50):
        ex = genrm_example(rng, P)
        assert ex.prompt.endswith("Judgement:") and parse_genrm_score(ex.target).ok
