import pytest

from pivot.data.arithmetic import LEVELS, sample_problem, sample_problems
from pivot.errors import ConfigError
import random


def test_every_answer_is_the_value_of_its_expression():
    for p in sample_problems(0, 500):
        assert eval(p.expression) == p.answer  # expressions are plain integer arithmetic
        assert p.level in LEVELS


def test_the_same_seed_gives_the_same_problems_and_another_seed_does_not():
    assert sample_problems(3, 50) == sample_problems(3, 50)
    assert sample_problems(3, 50) != sample_problems(4, 50)


def test_unique_draws_hold_no_repeated_key_and_excluded_keys_never_appear():
    val = sample_problems(0, 200, unique=True)
    assert len({p.key for p in val}) == 200
    keys = frozenset(p.key for p in val)
    assert not keys & {p.key for p in sample_problems(1, 2000, exclude=keys)}


def test_the_level_mix_follows_the_weights():
    only_hard = sample_problems(0, 100, level_weights=(0, 0, 0, 1))
    assert {p.level for p in only_hard} == {4}
    mixed = sample_problems(0, 1000)
    assert {p.level for p in mixed} == set(LEVELS)


def test_bad_weights_and_impossible_requests_raise_a_config_error():
    with pytest.raises(ConfigError, match="level_weights"):
        sample_problems(0, 5, level_weights=(1, 1))
    with pytest.raises(ConfigError, match="distinct"):
        sample_problems(0, 200, level_weights=(0, 1, 0, 0), unique=True)  # 100 exist
    with pytest.raises(ConfigError, match="level"):
        sample_problem(random.Random(0), 9)
