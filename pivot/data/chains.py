"""Worked multi-step arithmetic: the long-tail workload of the local run.

A chain problem is a left-to-right sum such as ``7 + 8 - 4 + 9`` of 1 to 10 operations
whose running value stays in [0, 19] (single-digit operands; a tiny model learns these few
hundred facts in a short SFT, so the chains' length, not their arithmetic, sets how hard a
problem is). The policy writes every step on its own line and ends with the answer line::

    7 + 8 = 15
    15 - 4 = 11
    11 + 8 = 19
    Answer: 19

so a response's length grows with its number of steps, and the step counts are drawn with
a heavy tail (60% of the problems take one step, a few percent nine or ten): within a
batch the longest responses are 5-8x the median, the shape of the long-tail rollouts of
the paper's workloads (sec. 2.2, fig. 3) at this scale. The GenRM checks the response
step by step (``pivot.models.examples.judge_chain``), so judgements grow with it.
"""

from __future__ import annotations

import random
import re

from pivot.data.arithmetic import Problem
from pivot.errors import ConfigError

MAX_STEPS = 10
MAX_VALUE = 19
DEFAULT_STEP_WEIGHTS: tuple[float, ...] = (
    0.60, 0.10, 0.06, 0.05, 0.04, 0.04, 0.035, 0.03, 0.025, 0.02)
"""Relative frequency of 1..10 steps: median 1, p90 7, p99 10 steps (a response of 16
tokens at the median, 98 at ten steps)."""

_STEP = re.compile(r"^\s*(-?\d+)\s*([+-])\s*(\d+)\s*=\s*(-?\d+)\s*$")


def check_step_weights(weights: tuple[float, ...]) -> None:
    if (len(weights) != MAX_STEPS or any(w < 0 for w in weights) or sum(weights) <= 0):
        raise ConfigError(f"step_weights must be {MAX_STEPS} non-negative numbers with a "
                          f"positive sum (one per step count 1..{MAX_STEPS}), got {weights}")


def sample_chain(rng: random.Random, steps: int) -> Problem:
    """A chain of ``steps`` operations: a start in [2, 9], operands in [1, 9], each
    operation drawn among those that keep the value in [0, ``MAX_VALUE``]."""
    if not 1 <= steps <= MAX_STEPS:
        raise ConfigError(f"a chain has 1..{MAX_STEPS} steps, got {steps}")
    value = rng.randint(2, 9)
    expr = str(value)
    for _ in range(steps):
        b = rng.randint(1, 9)
        ops = [op for op, v in (("+", value + b), ("-", value - b)) if 0 <= v <= MAX_VALUE]
        op = rng.choice(ops)
        value = value + b if op == "+" else value - b
        expr = f"{expr} {op} {b}"
    return Problem(expr, value, steps)


def draw_chain(rng: random.Random, weights: tuple[float, ...] = DEFAULT_STEP_WEIGHTS
               ) -> Problem:
    return sample_chain(rng, rng.choices(range(1, MAX_STEPS + 1), weights=weights)[0])


def chain_steps(expression: str) -> list[tuple[int, str, int, int]]:
    """The worked steps ``(a, op, b, a op b)`` of a chain expression, in order."""
    parts = expression.split()
    if len(parts) < 3 or len(parts) % 2 == 0:
        raise ConfigError(f"not a chain expression: {expression!r}")
    value = int(parts[0])
    out = []
    for op, b in zip(parts[1::2], parts[2::2]):
        nxt = value + int(b) if op == "+" else value - int(b)
        out.append((value, op, int(b), nxt))
        value = nxt
    return out


def step_line(a: int, op: str, b: int, c: int) -> str:
    return f"{a} {op} {b} = {c}"


def format_worked(problem: Problem) -> str:
    """The response the policy is trained to write: each step, then the answer line.

    It starts with a space because it follows the ``Response:`` tag directly.
    """
    lines = [step_line(*s) for s in chain_steps(problem.expression)]
    return " " + "\n".join(lines + [f"Answer: {problem.answer}"])


def parse_step(line: str) -> tuple[int, str, int, int] | None:
    """``(a, op, b, c)`` of a written step ``a op b = c``, or None."""
    m = _STEP.match(line)
    if m is None:
        return None
    return int(m[1]), m[2], int(m[3]), int(m[4])
