import random

import pytest

from pivot.data.arithmetic import Problem
from pivot.data.chains import format_worked, sample_chain
from pivot.models.evaluate import STEP_ERRORS, first_step_error

P = Problem("4 - 2 - 2 + 8", 8, 3)


@pytest.mark.parametrize("response, kind", [
    (" 4 - 2 = 2\n2 - 2 = 0\n0 + 8 = 8\nAnswer: 8", None),
    (" 5 - 2 = 3\n3 - 2 = 1\n1 + 8 = 9\nAnswer: 9", "copy"),         # start value
    (" 4 - 3 = 1\n1 - 2 = -1\nAnswer: -1", "copy"),                   # operand
    (" 4 - 2 = 2\n2 + 2 = 4\n4 + 8 = 12\nAnswer: 12", "copy"),       # operator
    (" 4 - 2 = 2\n3 - 2 = 1\n1 + 8 = 9\nAnswer: 9", "carry"),
    (" 4 - 2 = 2\n2 - 2 = 0\n0 + 8 = 9\nAnswer: 9", "arithmetic"),
    (" 4 - 2 = 2\n2 - 2 = 0\nAnswer: 0", "stopped_early"),
    (" 4 - 2 = 2\nsee above\nAnswer: 8 or 9", "garbled"),
    (" 4 - 2 = 2\n2 - 2 = 0\n0 + 8 = 8\n8 + 1 = 9\nAnswer: 9", "extra_steps"),
    (" 4 - 2 = 2\n2 - 2 = 0\n0 + 8 = 8\nAnswer: 7", "answer"),
    (" 4 - 2 = 2\n2 - 2 = 0\n0 + 8 = 8", "answer"),
])
def test_first_step_error_names_the_first_wrong_step(response, kind):
    assert first_step_error(P, response) == kind
    assert kind is None or kind in STEP_ERRORS


def test_a_right_answer_after_wrong_work_counts_as_correct():
    # the verifiable reward reads the answer line only; so does this classifier's None
    assert first_step_error(P, " 4 + 4 = 8\nAnswer: 8") is None


def test_every_generated_chain_is_its_own_correct_response():
    rng = random.Random(0)
    for steps in range(1, 11):
        p = sample_chain(rng, steps)
        assert first_step_error(p, format_worked(p)) is None
