"""The RL run's prompt stream (pivot/rl/data.py): a curriculum of step counts for the
training batches leaves the validation set, and what it holds out, as they were."""

import collections

import pytest

from pivot.data import question_of_record
from pivot.data.dataset import held_out_keys
from pivot.errors import ConfigError
from pivot.rl.data import PromptStream

LEVELS_2_TO_4 = (0, 1, 1, 1, 0, 0, 0, 0, 0, 0)


def test_a_curriculum_draws_only_its_levels_and_keeps_validation_held_out():
    base = PromptStream(prompts_per_step=64)
    cur = PromptStream(prompts_per_step=64, train_step_weights=LEVELS_2_TO_4)
    assert cur.validation() == base.validation()
    held = {f"What is {k}?" for k in held_out_keys(cur.task)}
    batches = [cur.batch(s) for s in range(20)]
    levels = collections.Counter(r["extra_info"]["level"] for b in batches for r in b)
    assert set(levels) == {2, 3, 4} and min(levels.values()) > 300
    assert not held & {question_of_record(r) for b in batches for r in b}
    assert cur.batch(3) == PromptStream(prompts_per_step=64,
                                        train_step_weights=LEVELS_2_TO_4).batch(3)
    assert base.batch(0) != cur.batch(0)


@pytest.mark.parametrize("weights", [(1, 2), (0,) * 10, (-1,) + (1,) * 9])
def test_bad_weights_are_refused_naming_the_binding(weights):
    with pytest.raises(ConfigError, match="PromptStream.train_step_weights"):
        PromptStream(train_step_weights=weights)
