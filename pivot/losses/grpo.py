"""GRPO policy loss with DAPO's clip-higher and token-level aggregation (sec. 8.1, App. E).

PivotRL trains the policy with a GRPO-style policy gradient on the reward
R = R_verifiable + R_GenRM (App. E). This file holds the maths only, as pure functions:

* ``group_advantages``: per prompt group of ``n`` responses, A = (r - mean) / (std + eps)
  (GRPO, Shao et al. 2024).
* ``token_logprobs``: per-token log-probs of the given ids from logits.
* ``clipped_surrogate``: the PPO clipped surrogate per token, with DAPO's asymmetric
  "clip-higher" bounds [1 - eps_low, 1 + eps_high] (Yu et al. 2025, arXiv:2503.14476).
* ``kl_k3``: the optional k3 estimate of KL(pi_theta || pi_ref) per token.
* ``GRPOLoss``: combines them; the scalar is the sum of per-token losses over every response
  token of the (global) batch divided by the number of those tokens (DAPO's token-level
  aggregation), so long responses are not down-weighted and data-parallel ranks add up to
  exactly the single-process loss.

Shapes: B = rows (responses), L = sequence length (prompt + response, right padded),
V = vocabulary, G = prompt groups, n = responses per group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pivot.errors import ConfigError

__all__ = [
    "GRPOLoss",
    "clipped_surrogate",
    "group_advantages",
    "kl_k3",
    "token_logprobs",
]


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6,
                     scale_by_std: bool = True) -> torch.Tensor:
    """Group-normalised advantages: (r - mean_group) / (std_group + eps).

    With ``scale_by_std=False``, r - mean_group (Dr. GRPO, arXiv 2503.20783): a group whose
    rewards differ only by a little noise then gets small advantages, where the std
    scaling would blow that noise up to unit size.

    Rows are grouped consecutively: rows [g*n, (g+1)*n) are the ``n`` responses to prompt g.
    The standard deviation is the population one (``unbiased=False``), so a group of equal
    rewards gets advantage exactly 0 and a group of size 1 is all zeros.

    Args:
        rewards: [B] float rewards, B = G * group_size.
        group_size: n, responses per prompt.
        eps: added to the std so a constant group does not divide by zero.
        scale_by_std: divide by the group's std (GRPO) or not (Dr. GRPO).

    Returns:
        [B] advantages, same dtype as ``rewards``.
    """
    if rewards.dim() != 1:
        raise ValueError(f"group_advantages: rewards must be 1-D [B], got shape "
                         f"{tuple(rewards.shape)}; flatten the groups first")
    if group_size <= 0 or rewards.numel() % group_size != 0:
        raise ValueError(f"group_advantages: {rewards.numel()} rewards do not split into "
                         f"groups of group_size={group_size}; pass B = G * group_size rows")
    grouped = rewards.view(-1, group_size)
    mean = grouped.mean(dim=1, keepdim=True)
    if not scale_by_std:
        return (grouped - mean).view(-1)
    std = grouped.std(dim=1, unbiased=False, keepdim=True)
    return ((grouped - mean) / (std + eps)).view(-1)


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Log-probability of each token given the tokens before it.

    Position t of the result holds log p(input_ids[:, t] | input_ids[:, :t]); position 0 has
    no context and is 0. The log-softmax is taken in fp32.

    Args:
        logits: [B, L, V] model output at every position.
        input_ids: [B, L] token ids.

    Returns:
        [B, L] fp32 log-probs aligned with ``input_ids`` (column 0 is 0).
    """
    if logits.shape[:2] != input_ids.shape:
        raise ValueError(f"token_logprobs: logits {tuple(logits.shape)} do not match "
                         f"input_ids {tuple(input_ids.shape)} on [B, L]")
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.nn.functional.pad(picked, (1, 0), value=0.0)


def clipped_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float,
    eps_high: float,
    max_log_ratio: float = 10.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate per token with DAPO clip-higher.

    loss_t = -min(rho_t * A, clip(rho_t, 1 - eps_low, 1 + eps_high) * A), with
    rho_t = exp(logprobs_t - old_logprobs_t). Where the clipped branch is the minimum the
    gradient is zero (rho > 1 + eps_high with A > 0, rho < 1 - eps_low with A < 0).
    The log-ratio is clamped to +-max_log_ratio before exp so a large mismatch cannot
    overflow.

    Args:
        logprobs: [B, L] current-policy log-probs (carry the gradient).
        old_logprobs: [B, L] behaviour-policy log-probs (no gradient).
        advantages: [B] per-row or [B, L] per-token advantages.
        eps_low / eps_high: the clip range.

    Returns:
        (token_loss [B, L], clipped [B, L] bool: tokens whose gradient the clip removed).
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    log_ratio = torch.clamp(logprobs - old_logprobs.detach(), -max_log_ratio, max_log_ratio)
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    unclipped_obj = ratio * advantages
    clipped_obj = clipped_ratio * advantages
    token_loss = -torch.minimum(unclipped_obj, clipped_obj)
    clipped = (clipped_obj < unclipped_obj).detach()
    return token_loss, clipped


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(pi_theta || pi_ref) per token: exp(d) - d - 1, d = ref - logprobs.

    Args:
        logprobs / ref_logprobs: [B, L].

    Returns:
        [B, L], >= 0, zero where the two agree.
    """
    d = torch.clamp(ref_logprobs.detach() - logprobs, -10.0, 10.0)
    return torch.exp(d) - d - 1.0


class GRPOLoss:
    """GRPO loss with DAPO clip-higher and token-level aggregation; no KL by default."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        eps_low: float = 0.2
        """Lower clip: the ratio is clamped to >= 1 - eps_low."""
        eps_high: float = 0.28
        """Upper clip (DAPO clip-higher): the ratio is clamped to <= 1 + eps_high."""
        kl_coef: float = 0.0
        """Weight of the k3 KL term to a reference policy; 0 disables it (DAPO)."""
        max_log_ratio: float = 10.0
        """|log rho| is clamped to this before exp."""

        def build(self) -> "GRPOLoss":
            return GRPOLoss(self)

    def __init__(self, config: Config) -> None:
        if not 0.0 <= config.eps_low < 1.0:
            raise ConfigError(f"GRPOLoss.Config.eps_low must be in [0, 1), got "
                              f"{config.eps_low}; the paper's setting follows DAPO (0.2)")
        if config.eps_high < 0.0:
            raise ConfigError(f"GRPOLoss.Config.eps_high must be >= 0, got {config.eps_high}")
        if config.kl_coef < 0.0:
            raise ConfigError(f"GRPOLoss.Config.kl_coef must be >= 0, got {config.kl_coef}")
        self.config = config

    def __call__(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        num_tokens: float | None = None,
        ref_logprobs: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Scalar loss and detached metrics.

        Args:
            logprobs: [B, L] current-policy log-probs.
            old_logprobs: [B, L] behaviour-policy log-probs.
            advantages: [B] or [B, L].
            mask: [B, L] 1 on response tokens, 0 on prompt and padding.
            num_tokens: denominator, the number of response tokens in the *global* batch
                (all data-parallel ranks); defaults to ``mask.sum()`` (single process).
            ref_logprobs: [B, L] reference log-probs, required when ``kl_coef > 0``.

        Returns:
            (loss, metrics): loss = sum_t mask_t * loss_t / num_tokens; metric sums are
            divided by the same denominator, so they add up across ranks.
        """
        cfg = self.config
        if mask.shape != logprobs.shape or old_logprobs.shape != logprobs.shape:
            raise ValueError(f"GRPOLoss: logprobs {tuple(logprobs.shape)}, old_logprobs "
                             f"{tuple(old_logprobs.shape)} and mask {tuple(mask.shape)} "
                             f"must all be [B, L]")
        maskf = mask.to(logprobs.dtype)
        denom = float(maskf.sum()) if num_tokens is None else float(num_tokens)
        denom = max(denom, 1.0)
        token_loss, clipped = clipped_surrogate(
            logprobs, old_logprobs, advantages, cfg.eps_low, cfg.eps_high, cfg.max_log_ratio)
        total = token_loss
        kl = None
        if cfg.kl_coef > 0.0:
            if ref_logprobs is None:
                raise ValueError("GRPOLoss: kl_coef > 0 needs ref_logprobs [B, L]; pass the "
                                 "reference policy's log-probs or set kl_coef=0")
            kl = kl_k3(logprobs, ref_logprobs)
            total = total + cfg.kl_coef * kl
        loss = (total * maskf).sum() / denom
        with torch.no_grad():
            ratio = torch.exp(torch.clamp(logprobs - old_logprobs, -cfg.max_log_ratio,
                                          cfg.max_log_ratio))
            metrics = {
                "loss": loss.detach(),
                "ratio_mean": (ratio * maskf).sum() / denom,
                "clip_frac": (clipped.to(maskf.dtype) * maskf).sum() / denom,
                "logprob_mean": (logprobs * maskf).sum() / denom,
            }
            if kl is not None:
                metrics["kl"] = (kl * maskf).sum() / denom
        return loss, metrics
