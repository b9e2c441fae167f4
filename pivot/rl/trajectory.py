"""Trajectories and GRPO prompt groups (sec. 8.1): n responses per prompt, each judged once
by the GenRM; R = R_verifiable + R_GenRM (``pivot.rewards.combine``).

Plain dataclasses, serialisable to JSON-safe dicts so the replay buffer of finished but not
yet trained trajectories can go into a checkpoint.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Trajectory:
    """One policy response to one prompt and its reward.

    Attributes:
        traj_id: unique over the run (step * prompts * n + prompt * n + sample).
        step: the RL step whose batch it belongs to.
        prompt_index: index of the prompt within the step's batch.
        sample: index among the prompt's n responses.
        prompt_tokens: the prompt's token ids.
        ground_truth: the verifiable answer.
        question: the bare question (the GenRM's input).
        start_version: policy version when its rollout started (the staleness bound).
        response_tokens / response_logprobs: filled when the response finishes.
        response_text: the decoded response.
        judge_text: the GenRM's decoded judgement.
        reward / verifiable / genrm: R and its parts, set once judged.
        genrm_ok: the judgement parsed.
        tokens_processed: prompt + generated tokens of its rollout and of its judgement
            (the end-to-end throughput counts them when its batch is trained).
        judge_len: tokens the GenRM wrote for it.
    """

    traj_id: int
    step: int
    prompt_index: int
    sample: int
    prompt_tokens: list[int]
    ground_truth: str
    question: str
    start_version: int
    response_tokens: list[int] | None = None
    response_logprobs: list[float] | None = None
    response_text: str | None = None
    judge_text: str | None = None
    reward: float | None = None
    verifiable: float | None = None
    genrm: float | None = None
    genrm_ok: bool | None = None
    finish_reason: str | None = None
    tokens_processed: int = 0
    judge_len: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def responded(self) -> bool:
        return self.response_tokens is not None

    @property
    def rewarded(self) -> bool:
        return self.reward is not None

    def to_dict(self) -> dict[str, Any]:
        """A copy of every field (lists and ``extra`` copied one level; the rest are
        immutable). Not ``dataclasses.asdict``: its recursive deep copy made each
        checkpoint hold the loop for ~0.5 s at 384 trajectories."""
        return {f.name: (type(v)(v) if isinstance(v := getattr(self, f.name), (list, dict))
                         else v) for f in _FIELDS}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trajectory":
        return cls(**d)


_FIELDS = dataclasses.fields(Trajectory)


@dataclass(slots=True)
class PromptGroup:
    """The n responses of one prompt (a GRPO group)."""

    step: int
    prompt_index: int
    trajectories: list[Trajectory]

    @property
    def complete(self) -> bool:
        return all(t.rewarded for t in self.trajectories)
