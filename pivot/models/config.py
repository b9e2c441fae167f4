"""The build configuration of the tiny models, and their Qwen3 architecture.

Policy and GenRM share one architecture (so one vLLM engine definition fits either) and
one tokenizer; they differ only in their SFT data and steps. head_dim is 32, which vLLM's
CPU attention supports; weights are fp32.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

from transformers import Qwen3Config

from pivot.data.dataset import MathTaskConfig
from pivot.models.sft import SFTConfig


@dataclass(frozen=True, slots=True)
class ArchConfig:
    """Qwen3 shape shared by both models."""

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 384
    max_position_embeddings: int = 1024
    vocab_multiple: int = 64
    """The embedding is rounded up to a multiple of this (>= the tokenizer's size)."""


@dataclass(frozen=True, slots=True)
class BuildConfig:
    """Everything that determines the built models; its hash names the build.

    Attributes:
        task: the generated math task (validation split is held out of all SFT data).
        arch: the shared architecture.
        vocab_size: the BPE tokenizer's target size.
        tokenizer_corpus: examples of each kind used to train the tokenizer.
        policy_examples / genrm_examples: SFT set sizes.
        policy_sft / genrm_sft: SFT schedules.
        genrm_policy_candidates: how many of the GenRM's examples judge the trained
            policy's own greedy responses (the rest judge synthetic candidates).
        genrm_eval_pairs: held-out (problem, candidate) pairs for the GenRM's correlation.
    """

    task: MathTaskConfig = MathTaskConfig()
    arch: ArchConfig = ArchConfig()
    vocab_size: int = 512
    tokenizer_corpus: int = 3000
    policy_examples: int = 20_000
    genrm_examples: int = 20_000
    policy_sft: SFTConfig = SFTConfig(steps=500, batch_size=32, lr=5e-3, seed=1)
    genrm_sft: SFTConfig = SFTConfig(steps=400, batch_size=32, lr=5e-3, seed=2)
    genrm_policy_candidates: int = 6000
    genrm_eval_pairs: int = 300

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def digest(self) -> str:
        """A stable hash of the configuration (the manifest's key)."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def qwen3_config(arch: ArchConfig, vocab_len: int, bos_id: int, eos_id: int,
                 pad_id: int) -> Qwen3Config:
    """The transformers config of one tiny model for a tokenizer of ``vocab_len`` tokens."""
    m = arch.vocab_multiple
    return Qwen3Config(
        vocab_size=(vocab_len + m - 1) // m * m,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_heads,
        num_key_value_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        max_position_embeddings=arch.max_position_embeddings,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        torch_dtype="float32",
    )
