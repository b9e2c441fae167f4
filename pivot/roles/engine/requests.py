"""What a generator is asked to do and what it hands back (sec. 6.2: an aborted sequence
keeps its tokens and resumes after a re-prefill)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pivot.errors import PivotError


class RequestError(PivotError, ValueError):
    """One request is malformed (prompt too long, sampling parameter out of range); the
    engine rejects only that request."""


@dataclass(frozen=True, slots=True)
class SampleSpec:
    """Per-request sampling parameters; checked before they reach vLLM.

    Attributes:
        max_tokens: cap on generated tokens (over all dispatches of the sequence).
        temperature: 0 is greedy.
        top_p, top_k: nucleus and top-k filters (top_k 0 or -1: off).
        seed: per-sequence sampling seed (``None``: the engine's stream).
        logprobs: return the log-prob of every generated token (raw, before temperature).
        ignore_eos: keep generating past EOS (profiling).
        stop_token_ids: extra stop tokens.
    """

    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    logprobs: bool = True
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    def check(self) -> None:
        """Raises RequestError naming the first parameter out of range."""
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise RequestError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise RequestError(f"temperature must be finite and >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise RequestError(f"top_k must be -1, 0 (off) or >= 1, got {self.top_k}")


@dataclass(slots=True)
class GenRequest:
    """One sequence to run: its prompt, the tokens it generated before an abort (empty for
    a fresh sequence), and how to sample."""

    seq_id: int
    prompt: list[int]
    spec: SampleSpec = field(default_factory=SampleSpec)
    generated: list[int] = field(default_factory=list)
    generated_logprobs: list[float] = field(default_factory=list)

    @property
    def resume(self) -> bool:
        return bool(self.generated)


@dataclass(slots=True)
class SeqResult:
    """A finished or aborted sequence: every token generated so far (across dispatches).

    ``finish_reason`` is vLLM's ("length", "stop"), "abort", or "error" with ``error`` set.
    """

    seq_id: int
    prompt_len: int
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str
    error: str | None = None
