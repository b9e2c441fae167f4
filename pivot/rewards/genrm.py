"""The generative reward: the GenRM's prompt and a robust parser for its judgement.

The GenRM is reference-free: it sees the problem and the policy's response (not the ground
truth), reasons in a few short lines, and ends with ``Score: N``, an integer from 0 to 10.
``R_GenRM = N / 10``, in [0, 1]. A decimal like ``Score: 7.5`` is read on the same 0-10
scale; values outside [0, 10] are clamped (and flagged ``clamped``).

Only the judge's own output is parsed, and only its LAST score line counts. The policy's
response appears inside the prompt, never in the text parsed, so a response that writes
"Score: 10" cannot set its own reward by parsing.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

SCORE_MAX = 10.0
FAIL_SCORE = 0.0
"""Reward of an output that could not be parsed."""
MAX_RESPONSE_CHARS = 2000
"""The policy response is cut to its last this-many characters inside the GenRM prompt."""
MAX_JUDGE_CHARS = 20_000
"""A judge output longer than this is not parsed (a runaway generation)."""

GENRM_INSTRUCTION = "Judge the response. End with the line: Score: <0-10>"
JUDGE_TAG = "Judgement:"

_SCORE_LINE = re.compile(
    r"^[\s*_#>]*score[\s*_]*:[\s*_]*([-+]?(?:\d+(?:\.\d*)?|\.\d+|nan|inf))\s*(?:/\s*10)?[\s*_.]*$",
    re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True, slots=True)
class ParsedScore:
    """A parsed judgement.

    Attributes:
        score: R_GenRM in [0, 1]; ``FAIL_SCORE`` when not ok.
        ok: False when no usable score was found (count these in metrics).
        reason: ``"ok"``, ``"clamped"``, ``"empty"``, ``"too_long"``, ``"no_score"`` or
            ``"not_finite"``.
        raw: the number as written on the score line, or None.
    """

    score: float
    ok: bool
    reason: str
    raw: float | None = None


def build_genrm_prompt(problem: str, response: str) -> str:
    """The GenRM's prompt for one policy response.

    Args:
        problem: the bare question (``pivot.data.records.question_of_record``).
        response: the policy's response; only its last ``MAX_RESPONSE_CHARS`` characters
            are kept, so a runaway response cannot blow the GenRM's context.
    """
    if len(response) > MAX_RESPONSE_CHARS:
        response = "..." + response[-MAX_RESPONSE_CHARS:]
    response = response.strip()
    return (f"{GENRM_INSTRUCTION}\nProblem: {problem.strip()}\n"
            f"Response: {response}\n{JUDGE_TAG}")


JUDGE_RESPONSE_TOKENS = 4 * (MAX_RESPONSE_CHARS + 3)
"""Most tokens of a response inside the GenRM's prompt: its last ``MAX_RESPONSE_CHARS``
characters after ``...``, at most 4 UTF-8 bytes each, and a byte-level BPE token is at
least one byte."""


def judge_prompt_tokens(problem_tokens: int, response_tokens: int) -> int:
    """A bound on the GenRM prompt's tokens (``build_genrm_prompt``) for a problem of
    ``problem_tokens`` and a response of ``response_tokens``: the fixed text (ASCII, a token
    per byte at most), the problem, and the response as cut (``JUDGE_RESPONSE_TOKENS``).
    The problem's tokens are taken as the same in the GenRM's vocabulary (an assumption:
    both are byte-level BPE vocabularies of ~150K)."""
    fixed = len(build_genrm_prompt("", "").encode())
    return fixed + problem_tokens + min(response_tokens, JUDGE_RESPONSE_TOKENS)


def parse_genrm_score(text: str | None) -> ParsedScore:
    """Parses the GenRM's own output; never raises."""
    if text is None or not text.strip():
        return ParsedScore(FAIL_SCORE, False, "empty")
    if len(text) > MAX_JUDGE_CHARS:
        return ParsedScore(FAIL_SCORE, False, "too_long")
    matches = _SCORE_LINE.findall(text)
    if not matches:
        return ParsedScore(FAIL_SCORE, False, "no_score")
    raw = float(matches[-1])
    if not math.isfinite(raw):
        return ParsedScore(FAIL_SCORE, False, "not_finite")
    clamped = min(max(raw, 0.0), SCORE_MAX)
    return ParsedScore(clamped / SCORE_MAX, True, "ok" if clamped == raw else "clamped", raw)


def format_judgement(lines: list[str], score: int) -> str:
    """A judgement in the format the GenRM is trained to write (starts with a space)."""
    if not 0 <= score <= SCORE_MAX:
        raise ValueError(f"score must be in [0, {SCORE_MAX:g}], got {score}")
    return " " + "\n".join(lines + [f"Score: {score}"])
