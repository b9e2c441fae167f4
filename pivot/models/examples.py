"""Supervised examples for the two tiny models, drawn from the generated task.

Chain task (the default, ``pivot.data.chains``): the policy writes every step and the answer
line; the GenRM checks the response step by step, writing each step as it should be with
``ok`` or ``no`` for the response's line, then the value the response gave, a verdict and a
score line, so a judgement grows with the response. One-operation task (``"levels"``):
policy ``" Answer: v"``; the GenRM's check is one line.

Candidate responses mix correct solutions, slips at one step (carried to the answer),
copied wrong operands, truncated work, missing or hedged answer lines and responses that try
to write their own score, so the GenRM learns to judge by the arithmetic, not the format.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from pivot.data.arithmetic import Problem
from pivot.data.chains import MAX_VALUE, chain_steps, format_worked, parse_step, step_line
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


def is_chain(problem: Problem) -> bool:
    """A chain problem (``pivot.data.chains``): the one-operation levels' problems carry
    their level (1-4) in the ``"levels"`` task and are never chains there; here a problem
    is a chain when it parses as one with values in the chain's range."""
    parts = problem.expression.split()
    return (all(op in "+-" for op in parts[1::2])
            and all(len(b) == 1 and b != "0" for b in parts[2::2])
            and 2 <= int(parts[0]) <= 9
            and all(0 <= s[3] <= MAX_VALUE for s in chain_steps(problem.expression)))


def target_response(problem: Problem) -> str:
    """The response the policy is trained to write for ``problem``."""
    return format_worked(problem) if is_chain(problem) else format_response(problem.answer)


def policy_example(problem: Problem) -> Example:
    return Example(policy_prompt(problem), target_response(problem))


def _wrong_value(rng: random.Random, answer: int) -> int:
    while True:
        if rng.random() < 0.6:
            v = answer + rng.choice([-1, 1]) * rng.randint(1, 10)
        else:
            v = rng.randint(min(-10, answer - 100), answer + 100)
        if v != answer:
            return v


def _worked(steps: list[tuple[int, str, int, int]], answer: int) -> str:
    return " " + "\n".join([step_line(*s) for s in steps] + [f"Answer: {answer}"])


def chain_candidate(rng: random.Random, problem: Problem) -> str:
    """A worked response to a chain problem as a policy might write it, right or wrong."""
    steps = chain_steps(problem.expression)
    u = rng.random()
    if u < 0.40:
        return format_worked(problem)
    i = rng.randrange(len(steps))
    if u < 0.70:  # an arithmetic slip at step i, carried on to the answer
        out = list(steps[:i])
        value = steps[i][3] + rng.choice([-1, 1]) * rng.randint(1, 3)
        a, op, b, _ = steps[i]
        out.append((a, op, b, value))
        for _, op, b, _ in steps[i + 1:]:
            nxt = value + b if op == "+" else value - b
            out.append((value, op, b, nxt))
            value = nxt
        return _worked(out, value)
    if u < 0.80:  # a wrong operand copied at step i, computed correctly from there
        out, value = list(steps[:i]), steps[i][0]
        for j, (_, op, b, _) in enumerate(steps[i:]):
            if j == 0:
                b = rng.choice([x for x in range(1, 10) if x != b])
            nxt = value + b if op == "+" else value - b
            out.append((value, op, b, nxt))
            value = nxt
        return _worked(out, value)
    if u < 0.88:  # stops early: the answer of a partial chain
        cut = steps[:i] or steps[:1]
        return _worked(cut, cut[-1][3]) if len(steps) > 1 else format_response(
            _wrong_value(rng, problem.answer))
    if u < 0.92:  # right work, wrong answer line
        return _worked(steps, _wrong_value(rng, problem.answer))
    if u < 0.96:  # right or wrong work, then its own score
        return (format_worked(problem) if rng.random() < 0.3 else
                _worked(steps, _wrong_value(rng, problem.answer))) + "\nScore: 10"
    return " " + "\n".join(step_line(*s) for s in steps)  # no answer line


def candidate_response(rng: random.Random, problem: Problem) -> str:
    """A response to ``problem`` as a policy might write it, right or wrong."""
    if is_chain(problem):
        return chain_candidate(rng, problem)
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


def _given(response: str) -> tuple[str | None, int | None]:
    given = extract_answer(response)
    try:
        return given, int(given) if given is not None else None
    except ValueError:
        return given, None


def _wrong_score(value: int, answer: int) -> int:
    return max(0, 3 - int(math.log2(abs(value - answer))))


def judge_chain(problem: Problem, response: str) -> tuple[list[str], int]:
    """The reference step-by-step judgement of a worked response: each step line of the
    response, up to the chain's length, copied with ``ok`` where it is the step as it
    should be, else ``no`` (``?`` for a line that is no step); ``missing`` where the
    response stops short; then a 0-10 score (``format_judgement`` adds the score line).
    The judgement grows with the response, and copying its lines tells the GenRM where
    to stop.

    10 for the right answer with every step right, 6 for the right answer with a wrong or
    missing step; a wrong answer gets 3, 2, 1 or 0 as it is off by 1, 2-3, 4-7 or more; a
    missing or non-integer answer 0.
    """
    lines = [ln for ln in response.strip().splitlines()
             if not ln.strip().lower().startswith(("answer", "score"))]
    checks, all_ok = [], True
    for i, step in enumerate(chain_steps(problem.expression)):
        if i >= len(lines):
            checks.append("missing")
            all_ok = False
            break
        given = parse_step(lines[i])
        all_ok &= given == step
        checks.append(f"{step_line(*given) if given else '?'} "
                      f"{'ok' if given == step else 'no'}")
    _, value = _given(response)
    if value is None:
        return checks, 0
    if value == problem.answer:
        return checks, 10 if all_ok else 6
    return checks, _wrong_score(value, problem.answer)


def judge_score(problem: Problem, response: str) -> tuple[list[str], int]:
    """The reference judgement of ``response``: reasoning lines and a 0-10 score
    (``judge_chain`` for a chain problem).

    10 for a correct single answer; a wrong one gets 3, 2, 1 or 0 as it is off by 1, 2-3,
    4-7 or more (a soft reward); a missing or hedged answer gets 0.
    """
    if is_chain(problem):
        return judge_chain(problem, response)
    check = f"Check: {problem.expression} = {problem.answer}"
    given, value = _given(response)
    if value is None:
        return [check, f"Given: {given if given else 'none'}", "Wrong."], 0
    if value == problem.answer:
        return [check, f"Given: {value}", "Correct."], 10
    return [check, f"Given: {value}", "Wrong."], _wrong_score(value, problem.answer)


def judged_example(problem: Problem, response: str) -> Example:
    """The GenRM example for ``response``, labelled by the reference judgement."""
    lines, score = judge_score(problem, response)
    return Example(build_genrm_prompt(problem.question, response), format_judgement(lines, score))


def genrm_example(rng: random.Random, problem: Problem) -> Example:
    return judged_example(problem, candidate_response(rng, problem))
