"""Greedy evaluation of the tiny models with plain transformers ``generate``.

- policy: accuracy@1 on the validation records (greedy, one response each);
- GenRM: Pearson correlation between its parsed score and the verifiable correctness of
  held-out (problem, candidate response) pairs;
- where a worked response first goes wrong (``first_step_error``), which says what a
  policy has not learned (copying the problem's numbers, carrying, the arithmetic).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from pivot.data.arithmetic import Problem
from pivot.data.chains import chain_steps, parse_step
from pivot.rewards.verifiable import is_correct


@torch.no_grad()
def greedy_generate(model: PreTrainedModel, tok: PreTrainedTokenizerFast, prompts: list[str],
                    max_new_tokens: int, batch_size: int = 128) -> list[str]:
    """Greedy continuations of ``prompts`` (left-padded batches), special tokens removed."""
    model.eval()
    out: list[str] = []
    old_side = tok.padding_side
    tok.padding_side = "left"
    try:
        for i in range(0, len(prompts), batch_size):
            enc = tok(prompts[i:i + batch_size], return_tensors="pt", padding=True)
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
            new = gen[:, enc["input_ids"].shape[1]:]
            out.extend(tok.batch_decode(new, skip_special_tokens=True))
    finally:
        tok.padding_side = old_side
    return out


def pearson(xs: list[float], ys: list[float]) -> float:
    """Pearson's r; NaN when either side is constant."""
    n = len(xs)
    if n != len(ys) or n < 2:
        raise ValueError(f"pearson needs two equal lists of >= 2 values, got {n}, {len(ys)}")
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else float("nan")


@dataclass(frozen=True, slots=True)
class PolicyEval:
    accuracy_at_1: float
    format_rate: float
    """Fraction of responses with a parseable final answer."""
    by_level: dict[int, float]


@dataclass(frozen=True, slots=True)
class GenRMEval:
    pearson: float
    parse_rate: float
    mean_score_correct: float
    mean_score_wrong: float
    n: int


STEP_ERRORS = ("copy", "carry", "arithmetic", "stopped_early", "extra_steps", "garbled",
               "answer")
"""The kinds ``first_step_error`` returns."""


def first_step_error(problem: Problem, response: str) -> str | None:
    """Where a worked response to a chain problem (``pivot.data.chains``) first goes wrong,
    or None when it is correct.

    Its step lines are compared with the chain's in order; at the first that differs:
    ``copy`` (the problem's start value, operator or operand copied wrong), ``carry`` (a
    step that does not start from the previous line's result), ``arithmetic`` (right
    operands, wrong result), ``garbled`` (a line that is no step). Past the last line:
    ``stopped_early``; with every step right: ``extra_steps`` (more lines than steps) or
    ``answer`` (a wrong or missing answer line).
    """
    if is_correct(response, str(problem.answer)):
        return None
    lines = [ln for ln in response.strip().splitlines()
             if not ln.strip().lower().startswith(("answer", "score"))]
    for i, step in enumerate(chain_steps(problem.expression)):
        if i >= len(lines):
            return "stopped_early"
        given = parse_step(lines[i])
        if given is None:
            return "garbled"
        if given == step:
            continue
        if given[0] != step[0]:
            return "copy" if i == 0 else "carry"
        return "copy" if given[1:3] != step[1:3] else "arithmetic"
    return "extra_steps" if len(lines) > len(chain_steps(problem.expression)) else "answer"
