"""The build configuration of the tiny models and their two architectures.

The policy is a Qwen3 (the paper's policies are Qwen); the GenRM is a larger Llama of
another depth and width with its own tokenizer (the paper pairs a 1.5B policy with a 9B
GenRM, a 7B with a 30B-A3B). Both are architectures vLLM serves; only the policy is trained
by torchtitan. head_dim is 32, which vLLM's CPU attention supports; weights are fp32.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

from transformers import LlamaConfig, PretrainedConfig, Qwen3Config

from pivot.data.dataset import MathTaskConfig
from pivot.models.sft import SFTConfig


FAMILIES = ("qwen3", "llama")


@dataclass(frozen=True, slots=True)
class ArchConfig:
    """A model's shape; ``family`` picks the architecture (``FAMILIES``)."""

    family: str = "qwen3"
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 384
    max_position_embeddings: int = 1024
    vocab_multiple: int = 64
    """The embedding is rounded up to a multiple of this (>= the tokenizer's size)."""
    tie_word_embeddings: bool = True

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"ArchConfig.family={self.family!r}: must be one of {FAMILIES}")


GENRM_ARCH = ArchConfig(family="llama", hidden_size=160, num_layers=6, num_heads=5,
                        num_kv_heads=1, head_dim=32, intermediate_size=448,
                        tie_word_embeddings=False)
"""The GenRM: 6 layers of width 160 against the policy's 4 of 128, untied head;
about 2.2x the policy's parameters."""


@dataclass(frozen=True, slots=True)
class BuildConfig:
    """Everything that determines the built models; its hash names the build.

    Attributes:
        task: the generated math task (validation split is held out of all SFT data).
        arch: the policy's architecture.
        genrm_arch: the GenRM's architecture.
        vocab_size / genrm_vocab_size: the two BPE tokenizers' target sizes.
        tokenizer_corpus: examples of each kind used to train the tokenizer.
        policy_examples / genrm_examples: SFT set sizes.
        policy_sft / genrm_sft: SFT schedules. The policy's peak lr is 2e-3: at 5e-3 the
            one-step sums came out learned or half learned (accuracy 0.60-1.00) with the
            seed and the machine's summation order, so the build's accuracy@1 ranged
            0.22-0.58 across machines; at 2e-3 every seed learns them
            (``experiments/sft_sweep.py``, docs/results.md).
        genrm_policy_candidates: how many of the GenRM's examples judge the trained
            policy's own greedy responses (the rest judge synthetic candidates).
        genrm_eval_pairs: held-out (problem, candidate) pairs for the GenRM's correlation.
    """

    task: MathTaskConfig = MathTaskConfig()
    arch: ArchConfig = ArchConfig()
    genrm_arch: ArchConfig = GENRM_ARCH
    vocab_size: int = 512
    genrm_vocab_size: int = 576
    tokenizer_corpus: int = 3000
    policy_examples: int = 20_000
    genrm_examples: int = 20_000
    policy_sft: SFTConfig = SFTConfig(steps=1000, batch_size=32, lr=2e-3, seed=1)
    genrm_sft: SFTConfig = SFTConfig(steps=600, batch_size=32, lr=5e-3, seed=2)
    genrm_policy_candidates: int = 1500
    genrm_eval_pairs: int = 300

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def digest(self) -> str:
        """A stable hash of the configuration (the manifest's key)."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def hf_config(arch: ArchConfig, vocab_len: int, bos_id: int, eos_id: int,
              pad_id: int) -> PretrainedConfig:
    """The transformers config of ``arch`` (Qwen3 or Llama) for a tokenizer of
    ``vocab_len`` tokens."""
    m = arch.vocab_multiple
    cls = Qwen3Config if arch.family == "qwen3" else LlamaConfig
    return cls(
        vocab_size=(vocab_len + m - 1) // m * m,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_heads,
        num_key_value_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        max_position_embeddings=arch.max_position_embeddings,
        tie_word_embeddings=arch.tie_word_embeddings,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        torch_dtype="float32",
    )


def qwen3_config(arch: ArchConfig, vocab_len: int, bos_id: int, eos_id: int,
                 pad_id: int) -> Qwen3Config:
    """The Qwen3 config of ``arch`` (``hf_config`` with the family forced to qwen3)."""
    return hf_config(dataclasses.replace(arch, family="qwen3"), vocab_len, bos_id, eos_id,
                     pad_id)
