"""The RL workflow in the simulator: GRPO groups, data staleness, batches (sec. 8.1, app. E).

Step s has ``prompts_per_step`` prompts, each with ``n`` responses. Rollout of step s may
start once the policy version (completed training steps) is >= s - staleness. Each
response gets one GenRM judgement when it finishes (input = prompt + response); a training
batch is ready when all its responses are rewarded. With no GenRM the reward is the
verifiable one and is instant.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field

import numpy as np

from pivot.errors import StateError
from pivot.spec.lengths import LengthModel
from pivot.types import GENRM, POLICY, SequenceState


@dataclass(slots=True)
class Item:
    """One response and its judgement: true lengths known only to the simulator."""

    step: int
    prompt_len: int
    response_len: int
    judge_len: int
    response_id: int
    judge_id: int | None = None
    rewarded: bool = False


@dataclass
class Workflow:
    """Attributes:
        prompts_per_step / n: GRPO batch shape.
        steps: RL steps to run.
        staleness: max policy-version lag (2 in the paper; 0 for colocated).
        genrm: whether a GenRM judges each response.
    """

    prompts_per_step: int
    n: int
    steps: int
    staleness: int
    lengths: LengthModel
    rng: np.random.Generator
    genrm: bool = True
    version: int = 0
    released: int = 0
    items: dict[int, Item] = field(default_factory=dict)
    """Keyed by response id and judge id."""
    remaining: dict[int, int] = field(default_factory=dict)
    """Step -> responses still waiting for a reward."""
    unfinished_responses: dict[int, int] = field(default_factory=dict)
    step_tokens: dict[int, int] = field(default_factory=dict)
    """Step -> prompt + response tokens (the training batch size)."""
    step_processed: dict[int, int] = field(default_factory=dict)
    """Step -> prompt + generated tokens of its finished rollout and reward sequences."""
    processed_tokens: int = 0
    """Prompt + generated tokens of finished rollout and reward sequences."""
    _ids: itertools.count = field(default_factory=itertools.count)

    def release(self) -> list[SequenceState]:
        """Rollout sequences of every step the staleness bound now allows."""
        out: list[SequenceState] = []
        while self.released < self.steps and self.released <= self.version + self.staleness:
            s = self.released
            m = self.prompts_per_step
            prompts = self.lengths.prompts(self.rng, m)
            resp = self.lengths.responses(self.rng, m * self.n)
            judge = self.lengths.judgements(self.rng, m * self.n)
            self.remaining[s] = m * self.n
            self.unfinished_responses[s] = m * self.n
            self.step_tokens[s] = int(np.repeat(prompts, self.n).sum() + resp.sum())
            for j in range(m * self.n):
                sid = next(self._ids)
                p = int(prompts[j // self.n])
                self.items[sid] = Item(s, p, int(resp[j]), int(judge[j]), sid)
                out.append(SequenceState(sid, POLICY, p, self.lengths.response_cap))
            self.released += 1
        return out

    def planned(self) -> tuple[list[int], list[int]]:
        """Per step, the tokens ``step_processed`` will count (prompt + response of each
        response, prompt + response + judgement of each judgement) and the training batch
        (``step_tokens``), known before the run: ``release`` draws every length from
        ``rng`` in step order whatever the timing, so a copy of the generator replays the
        draws (the split search's bound, ``SimDriver.stop_below``)."""
        if self.released:
            raise StateError("Workflow.planned: steps were already released")
        rng = copy.deepcopy(self.rng)
        processed, batch = [], []
        for _ in range(self.steps):
            m = self.prompts_per_step
            prompts = np.repeat(self.lengths.prompts(rng, m), self.n)
            resp = self.lengths.responses(rng, m * self.n)
            judge = self.lengths.judgements(rng, m * self.n)
            done = int(prompts.sum() + resp.sum())
            batch.append(done)
            processed.append(done + (int((prompts + resp + judge).sum()) if self.genrm else 0))
        return processed, batch

    def target(self, seq_id: int) -> int:
        """True final length (prompt + output) of a rollout or reward sequence."""
        it = self.items[seq_id]
        if seq_id == it.response_id:
            return it.prompt_len + it.response_len
        return it.prompt_len + it.response_len + it.judge_len

    def response_done(self, seq_id: int) -> SequenceState | None:
        """A response finished; returns its GenRM sequence (None: rewarded at once)."""
        it = self.items[seq_id]
        if seq_id != it.response_id:
            raise StateError(f"sequence {seq_id} is a judgement, not a response")
        self.processed_tokens += it.prompt_len + it.response_len
        self.step_processed[it.step] = self.step_processed.get(it.step, 0) + (
            it.prompt_len + it.response_len)
        self.unfinished_responses[it.step] -= 1
        if not self.genrm:
            self._rewarded(it)
            return None
        jid = next(self._ids)
        it.judge_id = jid
        self.items[jid] = it
        return SequenceState(jid, GENRM, it.prompt_len + it.response_len,
                             self.lengths.judge_cap)

    def judgement_done(self, seq_id: int) -> None:
        it = self.items[seq_id]
        if seq_id != it.judge_id:
            raise StateError(f"sequence {seq_id} is not a judgement")
        n = it.prompt_len + it.response_len + it.judge_len
        self.processed_tokens += n
        self.step_processed[it.step] = self.step_processed.get(it.step, 0) + n
        self._rewarded(it)

    def _rewarded(self, it: Item) -> None:
        if it.rewarded:
            raise StateError(f"response {it.response_id} rewarded twice")
        it.rewarded = True
        self.remaining[it.step] -= 1

    def batch_ready(self) -> bool:
        """The batch of the next training step (= version) has all its rewards."""
        s = self.version
        return s < self.steps and self.remaining.get(s, -1) == 0

    def oldest_rollout_done(self) -> bool:
        """Every response of the oldest step still waiting for rewards has finished (the
        rollout-reward colocated baseline then turns its pool over to reward)."""
        for s in range(self.version, self.released):
            if self.remaining[s] > 0:
                return self.unfinished_responses[s] == 0
        return False

    def trained(self) -> None:
        """A training step finished: the policy version advances."""
        if not self.batch_ready():
            raise StateError(f"training step {self.version} ran before its batch was ready")
        self.version += 1

    @property
    def done(self) -> bool:
        return self.version >= self.steps
