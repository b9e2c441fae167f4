import random
import statistics

import pytest

from pivot.data.chains import (MAX_STEPS, chain_steps, draw_chain, format_worked, parse_step,
                               sample_chain)
from pivot.data.dataset import MathTaskConfig, training_problems, validation_problems
from pivot.errors import ConfigError
from pivot.rewards import is_correct


def test_a_chain_is_computed_left_to_right_and_its_worked_solution_is_correct():
    rng = random.Random(0)
    for steps in range(1, MAX_STEPS + 1):
        p = sample_chain(rng, steps)
        assert p.level == steps and len(chain_steps(p.expression)) == steps
        assert eval(p.expression) == p.answer  # noqa: S307 - our own + / - expression
        text = format_worked(p)
        assert is_correct(text, str(p.answer))
        lines = text.strip().splitlines()
        assert len(lines) == steps + 1
        assert [parse_step(ln) for ln in lines[:-1]] == chain_steps(p.expression)


def test_step_counts_have_a_long_tail():
    rng = random.Random(1)
    steps = sorted(draw_chain(rng).level for _ in range(5000))
    q = statistics.quantiles(steps, n=100)
    assert q[49] == 1 and q[98] >= 9     # median one step, p99 nine or ten


def test_the_default_task_is_chains_and_validation_stays_out_of_training():
    cfg = MathTaskConfig()
    val = validation_problems(cfg)
    assert len(val) == cfg.num_val == 128
    train = training_problems(cfg, 2000)
    assert {p.key for p in val if p.level >= 2}.isdisjoint(p.key for p in train)
    assert max(p.level for p in val) >= 8
    # one-step problems (single facts every chain repeats) are not held out, so the
    # training stream keeps the step distribution it is drawn with
    assert 0.55 < sum(p.level == 1 for p in train) / len(train) < 0.65


def test_bad_task_settings_are_refused():
    with pytest.raises(ConfigError, match="kind"):
        MathTaskConfig(kind="calculus")
    with pytest.raises(ConfigError, match="step_weights"):
        MathTaskConfig(step_weights=(1.0,))
