"""The deterministic prompt stream of the RL loop (sec. 8.1: DAPO-Math-17k schema).

Step k's prompts depend only on (seed, k), so a run resumed at step k sees exactly the
prompts it would have seen (the data position in a checkpoint is the next step to
release). Sources: the generated math task (``pivot.data.dataset``), or a DAPO-schema
parquet file, validated row by row before any engine starts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gin

from pivot.data.chains import check_step_weights
from pivot.data.dataset import (MathTaskConfig, held_out_keys, training_records,
                                validation_records)
from pivot.data.records import ground_truth, question_of_record, validate_record
from pivot.data.template import render_prompt
from pivot.config.validation import check_range, check_text, default_of
from pivot.errors import ConfigError


@gin.configurable
@dataclass(frozen=True)
class PromptStream:
    """Attributes:
        prompts_per_step: prompts in one RL step's batch (each gets n responses).
        seed: data seed (validation from ``seed``, training from ``seed + 1``).
        parquet: a DAPO-Math-17k parquet file; None uses the generated task.
        num_val: validation problems (accuracy@1); the model build evaluates on the same
            set (``MathTaskConfig.num_val``), so its report and the run's compare.
        train_step_weights: relative frequency of 1..10 steps in the training batches
            (a curriculum; None: the task's own, ``pivot.data.chains``); the validation
            set and what it holds out of training stay the task's.
    """

    prompts_per_step: int = 8
    seed: int = 0
    parquet: str | None = None
    num_val: int = default_of(MathTaskConfig, "num_val")
    train_step_weights: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        check_range("PromptStream.prompts_per_step", self.prompts_per_step, 1, integer=True)
        check_range("PromptStream.seed", self.seed, 0, integer=True)
        check_range("PromptStream.num_val", self.num_val, 1, integer=True,
                    why="validation problems for accuracy@1")
        check_text("PromptStream.parquet", self.parquet, optional=True)
        if self.train_step_weights is not None:
            try:
                check_step_weights(tuple(self.train_step_weights))
            except ConfigError as e:
                raise ConfigError(f"PromptStream.train_step_weights: {e}") from None
        if self.parquet is not None:
            object.__setattr__(self, "_rows", _load_parquet(self.parquet))

    @property
    def task(self) -> MathTaskConfig:
        return MathTaskConfig(seed=self.seed, num_val=self.num_val)

    def batch(self, step: int) -> list[dict[str, Any]]:
        """The records of step ``step`` (same for a seed whatever came before)."""
        if step < 0:
            raise ConfigError(f"PromptStream.batch: step must be >= 0, got {step}")
        m = self.prompts_per_step
        if self.parquet is None and self.train_step_weights is not None:
            cfg = dataclasses.replace(self.task, step_weights=tuple(self.train_step_weights))
            return training_records(cfg, m, offset=step, held_out=held_out_keys(self.task))
        if self.parquet is None:
            return training_records(self.task, m, offset=step)
        rows = self._rows  # type: ignore[attr-defined]
        return [rows[(step * m + i) % len(rows)] for i in range(m)]

    def validation(self) -> list[dict[str, Any]]:
        return validation_records(self.task)


def _load_parquet(path: str) -> list[dict[str, Any]]:
    """Reads and validates a DAPO-schema parquet file (ConfigError names the bad row)."""
    from pivot.data.loaders import load_dapo_parquet

    if not Path(path).is_file():
        raise ConfigError(f"PromptStream.parquet: {path} does not exist")
    rows = load_dapo_parquet(path)
    if not rows:
        raise ConfigError(f"PromptStream.parquet: {path} holds no rows")
    for i, r in enumerate(rows):
        validate_record(r, path, i)
    return rows


def prompt_text(record: dict[str, Any]) -> str:
    return render_prompt(record["prompt"])


def record_fields(record: dict[str, Any]) -> tuple[str, str, str]:
    """(prompt text, bare question, ground truth) of a record."""
    return prompt_text(record), question_of_record(record), ground_truth(record)
