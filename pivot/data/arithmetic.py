"""Simple arithmetic problems with integer answers, at four difficulty levels.

The levels are chosen so a sub-million-parameter model trained for a minute or two gets the easy
ones mostly right and the hard ones mostly wrong: RL then has something to improve.

    level 1  a * 0, a + 0, a * 1   a in [0, 99]   (the answer is 0 or a copy of a)
    level 2  a + b            a, b in [0, 9]
    level 3  a + b, a - b     a, b in [10, 99]
    level 4  a * b, a * b - c a in [11, 99], b in [3, 9] / a, b in [2, 9], c in [1, 9]

Problems are identified by ``key`` (the expression), so splits can be made disjoint.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from pivot.errors import ConfigError

LEVELS: tuple[int, ...] = (1, 2, 3, 4)
DEFAULT_LEVEL_WEIGHTS: tuple[float, ...] = (0.4, 0.2, 0.25, 0.15)


@dataclass(frozen=True, slots=True)
class Problem:
    """One arithmetic problem.

    Attributes:
        expression: the expression, e.g. ``"37 + 48"``; also the problem's identity.
        answer: its integer value.
        level: difficulty level, 1 (easiest) to 4.
    """

    expression: str
    answer: int
    level: int

    @property
    def key(self) -> str:
        return self.expression

    @property
    def question(self) -> str:
        """The problem statement as shown to the policy and the GenRM."""
        return f"What is {self.expression}?"


def sample_problem(rng: random.Random, level: int) -> Problem:
    """Draws one problem of ``level`` from ``rng``."""
    if level == 1:
        a = rng.randint(0, 99)
        kind = rng.randrange(3)
        if kind == 0:
            return Problem(f"{a} * 0", 0, 1)
        return Problem(f"{a} + 0", a, 1) if kind == 1 else Problem(f"{a} * 1", a, 1)
    if level == 2:
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        return Problem(f"{a} + {b}", a + b, 2)
    if level == 3:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if rng.random() < 0.5:
            return Problem(f"{a} + {b}", a + b, 3)
        return Problem(f"{a} - {b}", a - b, 3)
    if level == 4:
        if rng.random() < 0.5:
            a, b = rng.randint(11, 99), rng.randint(3, 9)
            return Problem(f"{a} * {b}", a * b, 4)
        a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 9)
        return Problem(f"{a} * {b} - {c}", a * b - c, 4)
    raise ConfigError(f"unknown difficulty level {level}; expected one of {LEVELS}")


def _check_weights(weights: tuple[float, ...]) -> None:
    if len(weights) != len(LEVELS) or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ConfigError(f"level_weights must be {len(LEVELS)} non-negative numbers with a "
                          f"positive sum (one per level {LEVELS}), got {weights}")


def sample_problems(
    seed: int,
    n: int,
    *,
    level_weights: tuple[float, ...] = DEFAULT_LEVEL_WEIGHTS,
    exclude: frozenset[str] = frozenset(),
    unique: bool = False,
    draw: Callable[[random.Random], Problem] | None = None,
) -> list[Problem]:
    """Returns ``n`` problems drawn deterministically from ``seed``.

    Args:
        seed: the random seed; the same seed gives the same list.
        n: how many problems.
        level_weights: relative frequency of each level.
        exclude: problem keys never to return (e.g. the validation set's).
        unique: if True, no key appears twice.
        draw: draws one problem from the rng instead of the levels (the chain task,
            ``pivot.data.chains``); ``level_weights`` is then unused.
    Raises:
        ConfigError: bad weights, or the levels cannot supply ``n`` unique problems.
    """
    _check_weights(level_weights)
    if n < 0:
        raise ConfigError(f"n must be >= 0, got {n}")
    rng = random.Random(seed)
    out: list[Problem] = []
    seen: set[str] = set()
    misses = 0
    while len(out) < n:
        if draw is None:
            p = sample_problem(rng, rng.choices(LEVELS, weights=level_weights)[0])
        else:
            p = draw(rng)
        if p.key in exclude or (unique and p.key in seen):
            misses += 1
            if misses > 100 * n + 10_000:
                raise ConfigError(f"could not draw {n} distinct problems outside the "
                                  f"{len(exclude)} excluded ones; lower n or change "
                                  f"level_weights")
            continue
        seen.add(p.key)
        out.append(p)
    return out
