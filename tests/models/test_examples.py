import random

from pivot.data.arithmetic import Problem
from pivot.data.chains import chain_steps
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


C = Problem("7 + 8 - 4", 11, 2)


def test_a_chain_judgement_checks_every_step_and_grows_with_the_chain():
    good = " 7 + 8 = 15\n15 - 4 = 11\nAnswer: 11"
    lines, score = judge_score(C, good)
    assert score == 10 and lines == ["7 + 8 = 15 ok", "15 - 4 = 11 ok"]
    slip = " 7 + 8 = 16\n16 - 4 = 12\nAnswer: 12"
    assert judge_score(C, slip) == (["7 + 8 = 16 no", "16 - 4 = 12 no"], 3)
    lucky = " 7 + 8 = 16\n15 - 4 = 11\nAnswer: 11"          # right answer, a wrong step
    assert judge_score(C, lucky)[1] == 6
    assert judge_score(C, " 7 + 8 = 15\n15 - 4 = 11")[1] == 0   # no answer line
    assert judge_score(C, " 7 + 8 = 15\nAnswer: 15") == (["7 + 8 = 15 ok", "missing"], 1)
    long = Problem("7 + 8 - 4 + 1 + 1 + 1 + 1 + 1 + 1 + 1", 18, 9)
    worked = " " + "\n".join(f"{a} {op} {b} = {c}" for a, op, b, c in
                               chain_steps(long.expression)) + "\nAnswer: 18"
    assert len(judge_score(long, worked)[0]) == 9        # a check per step


def test_chain_candidates_mix_right_and_wrong_and_the_judgement_agrees():
    rng = random.Random(2)
    cands = [candidate_response(rng, C) for _ in range(400)]
    right = sum(is_correct(c, "11") for c in cands) / len(cands)
    assert 0.3 < right < 0.7
    for c in cands:
        assert (judge_score(C, c)[1] >= 6) == is_correct(c, "11")
