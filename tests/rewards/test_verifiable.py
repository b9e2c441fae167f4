import threading

import pytest

from pivot.rewards import accuracy_at_1, extract_answer, verifiable_reward


@pytest.mark.parametrize("response, truth, reward", [
    (" Answer: 85", "85", 1.0),
    (" 37 + 48 = 85\nAnswer: 85", "85", 1.0),
    ("Answer: 84", "85", 0.0),
    ("Answer: \\boxed{85}", "85", 1.0),
    ("the result is \\boxed{85}", "85", 1.0),
    ("Answer: $85$.", "85", 1.0),
    ("Answer: 85.0", "85", 1.0),
    ("Answer: -3", "-3", 1.0),
    ("Answer: 3", "-3", 0.0),
    ("Answer: \\frac{2}{4}", "\\frac{1}{2}", 1.0),
])
def test_the_final_answer_is_checked_against_the_ground_truth(response, truth, reward):
    assert verifiable_reward(response, truth) == reward


@pytest.mark.parametrize("response", [
    "",                                   # nothing
    "37 + 48 = 85",                       # no answer line: DAPO's format is required
    "Answer: 85\nAnswer: 84",             # the last answer line counts
    "Answer: 84 or 85",                   # a hedge
    "Answer: 80, 81, 82, 83, 84, 85, 86",  # a shotgun
    "Answer: eighty-five",
    "Answer: " + "9" * 5000,              # huge
    "Answer: 85" + "\n" + "x" * 100_000 + "\nAnswer: 1",
])
def test_adversarial_or_malformed_responses_earn_nothing(response):
    assert verifiable_reward(response, "85") == 0.0


def test_the_last_answer_line_wins_even_when_an_earlier_one_was_right():
    assert extract_answer("Answer: 1\nblah\nAnswer: 85") == "85"
    assert verifiable_reward("Answer: 84\nAnswer: 85", "85") == 1.0


def test_it_works_off_the_main_thread():
    out = []
    t = threading.Thread(target=lambda: out.append(verifiable_reward("Answer: 85", "85")))
    t.start()
    t.join()
    assert out == [1.0]


def test_accuracy_at_1_is_the_fraction_correct():
    assert accuracy_at_1(["Answer: 1", "Answer: 2", "x", "Answer: 4"], ["1", "2", "3", "5"]) \
        == 0.5
    with pytest.raises(ValueError):
        accuracy_at_1(["Answer: 1"], [])
