"""Policy losses, one file per algorithm."""

from pivot.losses.grpo import GRPOLoss, clipped_surrogate, group_advantages, kl_k3, token_logprobs

__all__ = ["GRPOLoss", "clipped_surrogate", "group_advantages", "kl_k3", "token_logprobs"]
