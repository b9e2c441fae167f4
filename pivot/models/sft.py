"""A short supervised fine-tuning loop for the tiny models (CPU, fp32).

Loss is next-token cross-entropy on the target tokens only (prompt and padding masked);
AdamW with linear warmup and cosine decay. Deterministic for a seed on one thread count.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from pivot.models.examples import Example

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SFTConfig:
    """Attributes:
        steps: optimizer steps.
        batch_size: examples per step.
        lr: peak learning rate.
        warmup: warmup steps.
        weight_decay: AdamW weight decay.
        seed: shuffling and init seed.
    """

    steps: int = 400
    batch_size: int = 64
    lr: float = 3e-3
    warmup: int = 20
    weight_decay: float = 0.01
    seed: int = 0


def encode_example(tok: PreTrainedTokenizerFast, ex: Example) -> tuple[list[int], int]:
    """Token ids of prompt + target + eos, and the number of prompt tokens (with bos).

    Prompt and target are tokenized apart, as at inference, where the engine tokenizes the
    prompt and the model writes the target token by token.
    """
    p = tok(ex.prompt).input_ids
    t = tok(ex.target, add_special_tokens=False).input_ids
    return p + t + [tok.eos_token_id], len(p)


def collate(encoded: list[tuple[list[int], int]], pad_id: int
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (-100 off target),
    each of shape [batch, max_len]."""
    n = max(len(ids) for ids, _ in encoded)
    ids = torch.full((len(encoded), n), pad_id, dtype=torch.long)
    mask = torch.zeros((len(encoded), n), dtype=torch.long)
    labels = torch.full((len(encoded), n), -100, dtype=torch.long)
    for i, (seq, n_prompt) in enumerate(encoded):
        ids[i, :len(seq)] = torch.tensor(seq)
        mask[i, :len(seq)] = 1
        labels[i, n_prompt:len(seq)] = torch.tensor(seq[n_prompt:])
    return ids, mask, labels


def length_grouped_batches(rng: random.Random, lengths: list[int], batch_size: int,
                           group: int = 16) -> list[list[int]]:
    """One epoch of batches of ``batch_size`` indices: shuffled, then sorted by length
    within windows of ``group`` batches, so a batch pads to a length near its own
    (worked responses and judgements vary by an order of magnitude); batch order shuffled.
    Deterministic for the rng's state."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    out: list[list[int]] = []
    w = batch_size * group
    for i in range(0, len(order), w):
        window = sorted(order[i:i + w], key=lengths.__getitem__)
        out += [window[j:j + batch_size] for j in range(0, len(window), batch_size)
                if len(window[j:j + batch_size]) == batch_size]
    if not out:  # fewer examples than one batch: repeat them
        out = [[order[j % len(order)] for j in range(batch_size)]]
    rng.shuffle(out)
    return out


def _lr_at(step: int, cfg: SFTConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))


def train_sft(model: PreTrainedModel, tok: PreTrainedTokenizerFast,
              examples: list[Example], cfg: SFTConfig,
              progress: Callable[[int, int, float], None] | None = None) -> list[float]:
    """Trains ``model`` in place on ``examples``; returns the loss of every step.
    ``progress(step, steps, seconds)``, if given, is called after every fifth of the steps
    (the console's build lines)."""
    if not examples:
        raise ValueError("train_sft: no examples")
    encoded = [encode_example(tok, ex) for ex in examples]
    rng = random.Random(cfg.seed)
    batches: list[list[int]] = []
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                            betas=(0.9, 0.98))
    model.train()
    losses = []
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        if not batches:
            batches = length_grouped_batches(rng, [len(e[0]) for e in encoded],
                                             cfg.batch_size)
        batch = [encoded[i] for i in batches.pop()]
        ids, mask, labels = collate(batch, tok.pad_token_id)
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, cfg)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == cfg.steps - 1:
            logger.info("sft step %d/%d loss %.4f (%.1fs)", step, cfg.steps, losses[-1],
                        time.perf_counter() - t0)
        if progress is not None and (step + 1) % max(1, cfg.steps // 5) == 0:
            progress(step + 1, cfg.steps, time.perf_counter() - t0)
    model.eval()
    return losses
