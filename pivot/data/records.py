"""Records in the DAPO-Math-17k schema, and their validation.

A record (one row of the real parquet file) is::

    {"data_source": "math_dapo",
     "prompt": [{"role": "user", "content": "..."}],
     "ability": "MATH",
     "reward_model": {"ground_truth": "85", "style": "rule"},
     "extra_info": {"index": 0, ...}}

The real data set has ``style = "rule-lighteval/MATH_v2"`` and a string (uuid) index; both
are accepted. Generated records add ``question``, ``level`` and ``split`` to ``extra_info``.
"""

from __future__ import annotations

from typing import Any

from pivot.data.arithmetic import Problem
from pivot.data.template import problem_content, question_of
from pivot.errors import ConfigError

DAPO_FIELDS: tuple[str, ...] = ("data_source", "prompt", "ability", "reward_model", "extra_info")
GENERATED_SOURCE = "pivot_arithmetic"


def make_record(problem: Problem, index: int, split: str) -> dict[str, Any]:
    """The DAPO-schema record of one generated problem."""
    return {
        "data_source": GENERATED_SOURCE,
        "prompt": [{"role": "user", "content": problem_content(problem.question)}],
        "ability": "MATH",
        "reward_model": {"ground_truth": str(problem.answer), "style": "rule"},
        "extra_info": {"index": index, "split": split, "level": problem.level,
                       "question": problem.question},
    }


def _fail(source: str, row: int, msg: str) -> ConfigError:
    return ConfigError(f"{source}: row {row}: {msg}")


def validate_record(record: Any, source: str = "<memory>", row: int = 0) -> None:
    """Raises ConfigError naming ``source``, the row, the field and the fix if ``record``
    does not follow the DAPO-Math-17k schema."""
    if not isinstance(record, dict):
        raise _fail(source, row, f"a record must be a mapping, got {type(record).__name__}")
    missing = [f for f in DAPO_FIELDS if f not in record]
    extra = [f for f in record if f not in DAPO_FIELDS]
    if missing:
        raise _fail(source, row, f"missing field(s) {missing}; a DAPO-Math-17k record has "
                                 f"exactly {list(DAPO_FIELDS)}")
    if extra:
        raise _fail(source, row, f"unexpected field(s) {extra}; move them into 'extra_info' "
                                 f"or drop them (the schema is {list(DAPO_FIELDS)})")
    prompt = record["prompt"]
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise _fail(source, row, "field 'prompt' must be a non-empty list of "
                                 "{'role', 'content'} messages")
    for i, m in enumerate(prompt):
        if not isinstance(m, dict) or set(m) != {"role", "content"}:
            keys = sorted(m) if isinstance(m, dict) else type(m).__name__
            raise _fail(source, row, f"field 'prompt[{i}]' must have exactly the keys "
                                     f"['content', 'role'], got {keys}")
        if not isinstance(m["content"], str) or not isinstance(m["role"], str):
            raise _fail(source, row, f"field 'prompt[{i}]': role and content must be strings")
    rm = record["reward_model"]
    if not isinstance(rm, dict) or "ground_truth" not in rm:
        raise _fail(source, row, "field 'reward_model' must be a mapping with a "
                                 "'ground_truth' string (and a 'style')")
    if not isinstance(rm["ground_truth"], str) or not rm["ground_truth"].strip():
        raise _fail(source, row, "field 'reward_model.ground_truth' must be a non-empty "
                                 f"string, got {rm['ground_truth']!r}")
    info = record["extra_info"]
    if not isinstance(info, dict) or "index" not in info:
        raise _fail(source, row, "field 'extra_info' must be a mapping with an 'index'")
    for f in ("data_source", "ability"):
        if not isinstance(record[f], str):
            raise _fail(source, row, f"field '{f}' must be a string")


def question_of_record(record: dict[str, Any]) -> str:
    """The bare question of a record (what the GenRM is shown as the problem)."""
    info = record.get("extra_info") or {}
    if isinstance(info, dict) and isinstance(info.get("question"), str):
        return info["question"]
    user = [m["content"] for m in record["prompt"] if m["role"] == "user"]
    return question_of(user[-1] if user else record["prompt"][-1]["content"])


def ground_truth(record: dict[str, Any]) -> str:
    return record["reward_model"]["ground_truth"]
