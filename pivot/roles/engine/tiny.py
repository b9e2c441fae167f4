"""A random tiny Qwen3 (or Qwen3-MoE) model folder, for profiling and engine tests when
the built models (``launchers/build_models.py``, in ``cache/models``) are absent.

The shape follows ``pivot.models.config.ArchConfig`` (head_dim 32, which vLLM's CPU
attention supports; fp32). The tokenizer is a byte-level BPE trained on a few sentences.
Weights are random, so outputs are gibberish, but the engine and transformers must agree
on them token for token, which is what the tests check.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM)

SENTENCES = [
    "the policy model generates responses to a set of prompts",
    "a generative reward model reasons over the response before it scores it",
    "devices shift between rollout, reward and training at run time",
    "what is 12 + 30? the answer is 42.",
    "the scheduler dispatches each sequence to the replica with the largest gain",
]


def make_tiny_qwen3(out: str | Path, *, seed: int = 0, hidden: int = 128, layers: int = 2,
                    heads: int = 4, kv_heads: int = 2, head_dim: int = 32,
                    vocab: int = 512, max_len: int = 512, init_std: float = 0.3) -> Path:
    """Writes a random Qwen3 (config, safetensors weights, tokenizer) to ``out``.

    ``init_std`` is large (transformers uses 0.02) so random logits are spread out: greedy
    outputs vary token to token and near-ties between two implementations are rare.
    """
    out, fast = _tokenizer(out, vocab, max_len)
    cfg = Qwen3Config(
        vocab_size=(len(fast) + 63) // 64 * 64, hidden_size=hidden,
        intermediate_size=3 * hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=head_dim, max_position_embeddings=max_len,
        tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=10000.0,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, torch_dtype="float32",
        initializer_range=init_std)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(out)
    return out


def make_tiny_qwen3_moe(out: str | Path, *, seed: int = 0, hidden: int = 128,
                        layers: int = 2, heads: int = 4, kv_heads: int = 2,
                        head_dim: int = 32, experts: int = 4, top_k: int = 2,
                        expert_intermediate: int = 64, vocab: int = 512, max_len: int = 512,
                        init_std: float = 0.3) -> Path:
    """Writes a random Qwen3-MoE (every layer sparse, ``experts`` routed experts, top
    ``top_k``) to ``out``: the architecture of the paper's MoE GenRMs (Qwen3-30B-A3B) at
    a size an expert-parallel test runs in seconds. vLLM's CPU MoE kernel needs the
    hidden and expert intermediate sizes in multiples of 32."""
    out, fast = _tokenizer(out, vocab, max_len)
    cfg = Qwen3MoeConfig(
        vocab_size=(len(fast) + 63) // 64 * 64, hidden_size=hidden,
        intermediate_size=3 * hidden, moe_intermediate_size=expert_intermediate,
        num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=True,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=head_dim, max_position_embeddings=max_len, tie_word_embeddings=True,
        rms_norm_eps=1e-6, rope_theta=10000.0, bos_token_id=1, eos_token_id=2,
        pad_token_id=0, torch_dtype="float32", initializer_range=init_std)
    torch.manual_seed(seed)
    Qwen3MoeForCausalLM(cfg).to(torch.float32).save_pretrained(out)
    return out


def _tokenizer(out: str | Path, vocab: int,
               max_len: int) -> tuple[Path, PreTrainedTokenizerFast]:
    """The tiny byte-level BPE, trained on ``SENTENCES`` and saved to ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|pad|>", "<|bos|>",
                                                                    "<|eos|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(SENTENCES * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>",
                                   eos_token="<|eos|>", pad_token="<|pad|>",
                                   model_max_length=max_len)
    fast.save_pretrained(out)
    return out, fast
