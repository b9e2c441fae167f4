"""The generated training stream and the held-out validation set.

The validation set is drawn first from its own seed; training problems are drawn from the
training seed with every validation key excluded, so the two never overlap. Both are
deterministic for a seed.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pivot.data.arithmetic import DEFAULT_LEVEL_WEIGHTS, Problem, sample_problems
from pivot.data.chains import DEFAULT_STEP_WEIGHTS, check_step_weights, draw_chain
from pivot.data.records import make_record
from pivot.errors import ConfigError


@dataclass(frozen=True, slots=True)
class MathTaskConfig:
    """How the generated task is drawn.

    Attributes:
        seed: base seed; validation uses ``seed``, training ``seed + 1``.
        num_val: size of the validation set (unique problems); the model build and the RL
            run's validation use the same set (``pivot.rl.data.PromptStream.num_val``).
        kind: ``"chain"``, worked multi-step sums with a long tail of step counts
            (``pivot.data.chains``), or ``"levels"``, one-operation problems at four
            difficulty levels (``pivot.data.arithmetic``).
        level_weights: relative frequency of difficulty levels 1-4 (``"levels"``).
        step_weights: relative frequency of 1..10 steps (``"chain"``).
    """

    seed: int = 0
    num_val: int = 128
    kind: str = "chain"
    level_weights: tuple[float, ...] = DEFAULT_LEVEL_WEIGHTS
    step_weights: tuple[float, ...] = DEFAULT_STEP_WEIGHTS

    def __post_init__(self) -> None:
        if self.kind not in ("chain", "levels"):
            raise ConfigError(f"MathTaskConfig.kind={self.kind!r}: must be 'chain' or "
                              f"'levels'")
        check_step_weights(tuple(self.step_weights))

    def sampler(self) -> dict[str, Any]:
        """Keyword arguments of ``sample_problems`` for this task."""
        if self.kind == "levels":
            return {"level_weights": self.level_weights}
        return {"draw": functools.partial(draw_chain, weights=tuple(self.step_weights))}


def validation_problems(cfg: MathTaskConfig) -> list[Problem]:
    """The held-out validation problems (unique)."""
    return sample_problems(cfg.seed, cfg.num_val, unique=True, **cfg.sampler())


def validation_records(cfg: MathTaskConfig) -> list[dict[str, Any]]:
    """The validation set as DAPO-schema records, scored as accuracy@1."""
    return [make_record(p, i, "val") for i, p in enumerate(validation_problems(cfg))]


def held_out_keys(cfg: MathTaskConfig) -> frozenset[str]:
    """The validation problems no training stream may contain. For chains, those of two
    steps or more: a one-step problem is a single arithmetic fact that every chain's lines
    repeat, so holding it out would hold nothing out, while removing the 77 of the ~100
    one-step problems the validation set draws would skew training away from the short
    responses that make the length distribution's median."""
    val = validation_problems(cfg)
    return frozenset(p.key for p in val if cfg.kind == "levels" or p.level >= 2)


def training_problems(cfg: MathTaskConfig, n: int, *, offset: int = 0,
                      held_out: frozenset[str] | None = None) -> list[Problem]:
    """``n`` training problems, none of them in the validation set.

    ``offset`` selects a different deterministic chunk (chunk ``k`` is seeded by
    ``(seed + 1, k)``), so a stream can be resumed without redrawing what came before.
    ``held_out``: the keys to exclude (default: ``held_out_keys(cfg)``; a stream drawn
    with other step weights than its validation set passes the validation set's).
    """
    if offset < 0:
        raise ConfigError(f"offset must be >= 0, got {offset}")
    held_out = held_out_keys(cfg) if held_out is None else held_out
    chunk_seed = random.Random(f"{cfg.seed + 1}:{offset}").randrange(2**63)
    return sample_problems(chunk_seed, n, exclude=held_out, **cfg.sampler())


def training_records(cfg: MathTaskConfig, n: int, *, offset: int = 0,
                     held_out: frozenset[str] | None = None) -> list[dict[str, Any]]:
    """``n`` training records; ``extra_info.index`` continues across offsets."""
    return [make_record(p, offset * n + i, "train")
            for i, p in enumerate(training_problems(cfg, n, offset=offset,
                                                    held_out=held_out))]


def iterate_prompts(cfg: MathTaskConfig, batch_size: int,
                    start_batch: int = 0) -> Iterator[list[dict[str, Any]]]:
    """An endless, deterministic stream of training batches (lists of records).

    Batch ``k`` is the same list whatever ``start_batch`` was, so a run resumed at batch
    ``k`` sees the data it would have seen.
    """
    if batch_size <= 0:
        raise ConfigError(f"batch_size must be > 0, got {batch_size}")
    k = start_batch
    while True:
        yield training_records(cfg, batch_size, offset=k)
        k += 1
