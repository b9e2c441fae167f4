"""The GRPO training batch the trainer consumes, built from rewarded prompt groups
(sec. 8.1, app. E).

One row is one response of the policy to one prompt: prompt tokens then response tokens,
right padded to a common length L (SDPA is causal and takes no mask, so padding must come
after the real tokens and rows are never packed). ``response_mask`` selects the tokens the
policy loss is computed on. Advantages are group-normalised
(``pivot.losses.grpo.group_advantages``); the behaviour log-probs are the rollout engine's
per-token log-probs, placed at the columns of the tokens they score.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pivot.errors import StateError
from pivot.losses.grpo import group_advantages
from pivot.rl.trajectory import PromptGroup


@dataclass(slots=True)
class TrainBatch:
    """A right-padded batch of B rows of length L.

    Attributes:
        input_ids: [B, L] int64, prompt + response token ids, right padded.
        response_mask: [B, L] 0/1 (or bool), 1 on response tokens. Column 0 must be 0 (the
            first token has no context, so it cannot be a response token).
        advantages: [B] float, one advantage per row (``pivot.losses.grpo.group_advantages``).
        old_logprobs: [B, L] float or None: log-probs of ``input_ids`` under the behaviour
            policy (the rollout engine), aligned with ``input_ids`` (column t is
            log p(input_ids[t] | input_ids[:t])). None means on-policy: the trainer uses its
            own detached log-probs, so the ratio is 1.
        policy_version: [B] int64, the policy version that generated each row (for the
            staleness metric; the paper runs with staleness 2, App. E).
    """

    input_ids: torch.Tensor
    response_mask: torch.Tensor
    advantages: torch.Tensor
    old_logprobs: torch.Tensor | None = None
    policy_version: torch.Tensor | None = None

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_response_tokens(self) -> int:
        return int(self.response_mask.sum())

    def check(self, vocab_size: int | None = None, max_seq_len: int | None = None) -> None:
        """Raises ValueError naming the field when the batch is malformed."""
        ids = self.input_ids
        if ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"TrainBatch.input_ids must be an int [B, L] tensor, got "
                             f"{ids.dtype} {tuple(ids.shape)}")
        b, length = ids.shape
        if b == 0 or length < 2:
            raise ValueError(f"TrainBatch.input_ids has shape {tuple(ids.shape)}; it needs "
                             f"at least one row and two tokens")
        if tuple(self.response_mask.shape) != (b, length):
            raise ValueError(f"TrainBatch.response_mask has shape "
                             f"{tuple(self.response_mask.shape)}, expected [B, L] = {(b, length)}")
        if self.response_mask[:, 0].any():
            raise ValueError("TrainBatch.response_mask[:, 0] must be 0: the first token has "
                             "no context; put at least one prompt token first")
        if tuple(self.advantages.shape) != (b,):
            raise ValueError(f"TrainBatch.advantages has shape {tuple(self.advantages.shape)}"
                             f", expected [B] = ({b},); one advantage per row")
        if self.old_logprobs is not None and tuple(self.old_logprobs.shape) != (b, length):
            raise ValueError(f"TrainBatch.old_logprobs has shape "
                             f"{tuple(self.old_logprobs.shape)}, expected [B, L] = "
                             f"{(b, length)}; or pass None for on-policy")
        if self.policy_version is not None and tuple(self.policy_version.shape) != (b,):
            raise ValueError(f"TrainBatch.policy_version has shape "
                             f"{tuple(self.policy_version.shape)}, expected [B] = ({b},)")
        if vocab_size is not None and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
            raise ValueError(f"TrainBatch.input_ids holds ids in [{int(ids.min())}, "
                             f"{int(ids.max())}], outside the vocabulary of {vocab_size}")
        if max_seq_len is not None and length > max_seq_len:
            raise ValueError(f"TrainBatch.input_ids has length {length} > the trainer's "
                             f"max_seq_len {max_seq_len}; raise Trainer.Config.max_seq_len")

    def rows(self, index: torch.Tensor | slice) -> "TrainBatch":
        """The sub-batch of the given rows (for splitting across data-parallel ranks)."""
        pick = lambda t: None if t is None else t[index]  # noqa: E731
        return TrainBatch(self.input_ids[index], self.response_mask[index],
                          self.advantages[index], pick(self.old_logprobs),
                          pick(self.policy_version))

    def to(self, device: torch.device) -> "TrainBatch":
        """The batch on ``device`` (the trainer's; policy versions stay on the host)."""
        move = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        return TrainBatch(move(self.input_ids), move(self.response_mask),
                          move(self.advantages), move(self.old_logprobs), self.policy_version)


def build_train_batch(groups: Sequence[PromptGroup], pad_id: int = 0,
                      use_behaviour_logprobs: bool = True,
                      scale_by_std: bool = True) -> TrainBatch:
    """Returns the [B, L] batch of ``groups`` (B = groups x n, in group order);
    ``scale_by_std``: see ``group_advantages``."""
    rows = [t for g in groups for t in g.trajectories]
    if not rows:
        raise StateError("build_train_batch: no trajectories")
    n = len(groups[0].trajectories)
    if any(len(g.trajectories) != n for g in groups):
        raise StateError("build_train_batch: groups differ in size; every prompt needs n "
                         "responses")
    for t in rows:
        if not t.rewarded or t.response_tokens is None:
            raise StateError(f"build_train_batch: trajectory {t.traj_id} is not rewarded")
    length = max(len(t.prompt_tokens) + max(len(t.response_tokens or []), 1) for t in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.int64)
    mask = torch.zeros((len(rows), length), dtype=torch.float32)
    old = torch.zeros((len(rows), length), dtype=torch.float32)
    for b, t in enumerate(rows):
        p, r = len(t.prompt_tokens), list(t.response_tokens or [])
        ids[b, :p] = torch.tensor(t.prompt_tokens)
        if r:
            ids[b, p:p + len(r)] = torch.tensor(r)
            mask[b, p:p + len(r)] = 1.0
            old[b, p:p + len(r)] = torch.tensor(t.response_logprobs or [0.0] * len(r))
    rewards = torch.tensor([float(t.reward) for t in rows])
    adv = group_advantages(rewards, n, scale_by_std=scale_by_std)
    return TrainBatch(ids, mask, adv, old if use_behaviour_logprobs else None,
                      torch.tensor([t.start_version for t in rows], dtype=torch.int64))
