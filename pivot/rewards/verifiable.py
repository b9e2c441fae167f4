"""The verifiable (rule-based) reward: is the response's final answer the ground truth?

The answer is read from the LAST line that starts with ``Answer:`` (DAPO's format), or,
failing that, from the last ``\\boxed{...}``. It must hold exactly one number: a hedged
line like ``Answer: 84 or 85`` scores 0. Equality is decided by math-verify.

Reward values: 1.0 correct, 0.0 otherwise (DAPO uses +1/-1; with 0/1 the sum with the
GenRM reward, R = R_verifiable + R_GenRM (sec. 8.1), lies in [0, 2]).
"""

from __future__ import annotations

import re
import threading

from math_verify import parse, verify

CORRECT = 1.0
INCORRECT = 0.0
MAX_ANSWER_CHARS = 200
"""Longer answer strings are not parsed (a sympy parse of a huge string can take minutes)."""

_ANSWER_LINE = re.compile(r"^\s*\**\s*Answer\s*\**\s*:\s*(.*?)\s*$", re.IGNORECASE | re.MULTILINE)
_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_NUMBER = re.compile(r"[-+]?\d+(?:[.,]\d+)*(?:/\d+)?")


def extract_answer(response: str) -> str | None:
    """The final answer string of ``response``, or None if it states none."""
    lines = _ANSWER_LINE.findall(response)
    if lines:
        ans = lines[-1]
    else:
        boxed = _BOXED.findall(response)
        if not boxed:
            return None
        ans = boxed[-1]
    inner = _BOXED.findall(ans)
    if inner:
        ans = inner[-1]
    ans = ans.strip().strip("$").strip().rstrip(".").strip()
    return ans or None


def _timeout() -> int | None:
    # math-verify times out with SIGALRM, which only the main thread may install.
    return 5 if threading.current_thread() is threading.main_thread() else None


def is_correct(response: str, ground_truth: str) -> bool:
    """True iff the response's final answer equals ``ground_truth`` (math-verify)."""
    ans = extract_answer(response)
    if ans is None or len(ans) > MAX_ANSWER_CHARS:
        return False
    if len(_NUMBER.findall(ans)) > 1 and len(_NUMBER.findall(ground_truth)) <= 1:
        return False  # several numbers for a one-number truth: a hedge ("84 or 85")
    t = _timeout()
    gold = parse(f"${ground_truth}$", parsing_timeout=t)
    pred = parse(f"${ans}$", parsing_timeout=t)
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=t))


def verifiable_reward(response: str, ground_truth: str) -> float:
    """R_verifiable: 1.0 if the final answer is correct, else 0.0."""
    return CORRECT if is_correct(response, ground_truth) else INCORRECT


def accuracy_at_1(responses: list[str], ground_truths: list[str]) -> float:
    """Accuracy@1 (the paper's AIME@1): the fraction of single responses that are correct."""
    if len(responses) != len(ground_truths):
        raise ValueError(f"{len(responses)} responses for {len(ground_truths)} ground truths")
    if not responses:
        raise ValueError("accuracy_at_1 of an empty set")
    return sum(is_correct(r, g) for r, g in zip(responses, ground_truths)) / len(responses)
