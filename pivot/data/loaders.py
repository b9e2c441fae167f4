"""Loaders for the real data sets' parquet files: DAPO-Math-17k (training) and AIME24
(validation), validated before any work starts.

Supported schemas:

- DAPO-Math-17k (``BytedTsinghua-SIA/DAPO-Math-17k``): exactly the columns ``data_source``,
  ``prompt``, ``ability``, ``reward_model``, ``extra_info`` (see ``pivot.data.records``).
- AIME24 (``math-ai/aime24`` and the ``HuggingFaceH4/aime_2024`` layout): required
  ``problem`` and at least one of ``answer`` or ``solution``; optional ``id``, ``url``,
  ``year``. The ground truth is ``answer`` when present, else the last ``\\boxed{...}`` of
  ``solution``, else ``solution`` itself. AIME rows are returned as DAPO-schema records
  with the same prompt template, so one validation loop serves both.
"""

from __future__ import annotations

import os
import re
from typing import Any

from pivot.data.records import DAPO_FIELDS, validate_record
from pivot.data.template import problem_content
from pivot.errors import ConfigError

AIME_REQUIRED = ("problem",)
AIME_ANSWER_COLUMNS = ("answer", "solution")
AIME_OPTIONAL = ("id", "url", "year")


def _read_parquet(path: str | os.PathLike[str]) -> tuple[list[str], list[dict[str, Any]]]:
    import pyarrow.parquet as pq  # imported here: pyarrow is slow to import

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: no such file; download the parquet file and pass its path")
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for a bad file
        raise ConfigError(f"{path}: not a readable parquet file ({e})") from e
    return list(table.column_names), table.to_pylist()


def load_dapo_parquet(path: str | os.PathLike[str], *, limit: int | None = None
                      ) -> list[dict[str, Any]]:
    """Loads and validates a DAPO-Math-17k parquet file.

    Raises:
        ConfigError: naming the file, the missing or extra column (or the bad field of a
            row) and the fix.
    """
    columns, rows = _read_parquet(path)
    missing = [c for c in DAPO_FIELDS if c not in columns]
    extra = [c for c in columns if c not in DAPO_FIELDS]
    if missing or extra:
        raise ConfigError(
            f"{os.fspath(path)}: not in the DAPO-Math-17k schema: missing column(s) "
            f"{missing}, unexpected column(s) {extra}; expected exactly {list(DAPO_FIELDS)} "
            f"(for AIME-style files with 'problem'/'answer' use load_aime_parquet)")
    rows = rows if limit is None else rows[:limit]
    for i, r in enumerate(rows):
        validate_record(r, os.fspath(path), i)
    if not rows:
        raise ConfigError(f"{os.fspath(path)}: holds no rows")
    return rows


_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")


def _aime_answer(row: dict[str, Any]) -> str | None:
    if row.get("answer") is not None and str(row["answer"]).strip():
        return str(row["answer"]).strip()
    sol = row.get("solution")
    if sol is None or not str(sol).strip():
        return None
    boxed = _BOXED.findall(str(sol))
    return boxed[-1].strip() if boxed else str(sol).strip()


def load_aime_parquet(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Loads and validates an AIME24 parquet file as DAPO-schema records.

    Raises:
        ConfigError: naming the file, the missing or unexpected column (or the row without
            an answer) and the fix.
    """
    p = os.fspath(path)
    columns, rows = _read_parquet(path)
    known = set(AIME_REQUIRED) | set(AIME_ANSWER_COLUMNS) | set(AIME_OPTIONAL)
    missing = [c for c in AIME_REQUIRED if c not in columns]
    if not any(c in columns for c in AIME_ANSWER_COLUMNS):
        missing.append("answer (or solution)")
    extra = [c for c in columns if c not in known]
    if missing:
        raise ConfigError(f"{p}: not an AIME24 file: missing column(s) {missing}; expected "
                          f"'problem' and 'answer' or 'solution' (optional {list(AIME_OPTIONAL)})")
    if extra:
        raise ConfigError(f"{p}: unexpected column(s) {extra} in an AIME24 file; supported "
                          f"columns are {sorted(known)}: drop the others before loading")
    records = []
    for i, row in enumerate(rows):
        problem = row.get("problem")
        if not isinstance(problem, str) or not problem.strip():
            raise ConfigError(f"{p}: row {i}: field 'problem' is empty; every row needs the "
                              f"problem text")
        answer = _aime_answer(row)
        if answer is None:
            raise ConfigError(f"{p}: row {i}: no answer: fill 'answer' or put the answer "
                              f"in a \\boxed{{}} in 'solution'")
        index = row.get("id", i)
        records.append({
            "data_source": "aime24",
            "prompt": [{"role": "user", "content": problem_content(problem.strip())}],
            "ability": "MATH",
            "reward_model": {"ground_truth": answer, "style": "rule"},
            "extra_info": {"index": index if index is not None else i, "split": "val",
                           "question": problem.strip()},
        })
    if not records:
        raise ConfigError(f"{p}: holds no rows")
    return records
