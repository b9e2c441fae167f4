"""A GRPO training batch from rewarded prompt groups (sec. 8.1, app. E).

Rows are prompt + response, right padded (the CPU trainer's SDPA is causal and takes no
mask). Advantages are group-normalised (``pivot.losses.grpo.group_advantages``); the
behaviour log-probs are the rollout engine's per-token log-probs, placed at the columns
of the tokens they score.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pivot.errors import StateError
from pivot.losses.grpo import group_advantages
from pivot.roles.titan.batch import TrainBatch
from pivot.rl.trajectory import PromptGroup


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
