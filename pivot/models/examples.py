"""Supervised examples for the two tiny models, drawn from the generated task.

Policy: prompt -> ``" Answer: v"``. GenRM: (problem, candidate response) ->
a short check (its own computation, the value the response gave, a verdict) and a score
line. Candidate responses mix correct answers, near misses, random values, missing or
hedged answer lines and responses that try to write their own score, so the GenRM learns
to judge by the arithmetic, not by the format.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from pivot.data.arithmetic import Problem
from pivot.data.template import format_response, problem_content, render_prompt
from pivot.rewards.genrm import build_genrm_prompt, format_judgement
from pivot.rewards.verifiable import extract_answer


@dataclass(frozen=True, slots=True)
class Example:
    """One supervised pair: the model sees ``prompt`` and learns to write ``target``."""

    prompt: str
    target: str


def policy_prompt(problem: Problem) -> str:
    return render_prompt([{"role": "user", "content": problem_content(problem.question)}])


def policy_example(problem: Problem) -> Example:
    return Example(policy_prompt(problem), format_response(problem.answer))


def _wrong_value(rng: random.Random, answer: int) -> int:
    while True:
        if rng.random() < 0.6:
            v = answer + rng.choice([-1, 1]) * rng.randint(1, 10)
        else:
            v = rng.randint(min(-10, answer - 100), answer + 100)
        if v != answer:
            return v


def candidate_response(rng: random.Random, problem: Problem) -> str:
    """A response to ``problem`` as a policy might write it, right or wrong."""
    u = rng.random()
    expr = problem.expression
    if u < 0.45:
        return format_response(problem.answer)
    wrong = _wrong_value(rng, problem.answer)
    if u < 0.80:
        return format_response(wrong)
    if u < 0.85:
        return f" {expr} = {wrong}"  # no answer line
    if u < 0.90:
        return f" {expr} = {problem.answer}\nAnswer: {wrong} or {problem.answer}"  # a hedge
    if u < 0.95:  # tries to write its own score
        v = problem.answer if rng.random() < 0.3 else wrong
        return format_response(v) + "\nScore: 10"
    return f" {expr} = {problem.answer}\nAnswer: {wrong}"  # work and answer disagree


def judge_score(problem: Problem, response: str) -> tuple[list[str], int]:
    """The reference judgement of ``response``: reasoning lines and a 0-10 score.

    10 for a correct single answer; a wrong one gets 3, 2, 1 or 0 as it is off by 1, 2-3,
    4-7 or more (a soft reward); a missing or hedged answer gets 0.
    """
    check = f"Check: {problem.expression} = {problem.answer}"
    given = extract_answer(response)
    try:
        value = int(given) if given is not None else None
    except ValueError:
        value = None
    if value is None:
        return [check, f"Given: {given if given else 'none'}", "Wrong."], 0
    if value == problem.answer:
        return [check, f"Given: {value}", "Correct."], 10
    off = abs(value - problem.answer)
    return [check, f"Given: {value}", "Wrong."], max(0, 3 - int(math.log2(off)))


def judged_example(problem: Problem, response: str) -> Example:
    """The GenRM example for ``response``, labelled by the reference judgement."""
    lines, score = judge_score(problem, response)
    return Example(build_genrm_prompt(problem.question, response), format_judgement(lines, score))


def genrm_example(rng: random.Random, problem: Problem) -> Example:
    return judged_example(problem, candidate_response(rng, problem))
