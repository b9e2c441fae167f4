"""torchtitan's Qwen3 model definition, sized from a Hugging Face ``Qwen3Config``.

The training role (sec. 5.2, 8.1) runs the policy on torchtitan, while rollout runs it on
vLLM and the Global Parameter Storage keeps it under Hugging Face names (sec. 5.1). This
module is the bridge: it reads a HF ``config.json`` (or its dict), builds the matching
``Qwen3Model.Config`` with ``ScaledDotProductAttention`` as the inner attention (flex has
no CPU backward and varlen is CUDA-only; SDPA is causal and takes no masks, so batches are
right padded and never packed), and converts weights with torchtitan's
``Qwen3StateDictAdapter``. The private builder pieces and the attention swap are shims of
``pivot.compat.torchtitan``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pivot.errors import ConfigError
from pivot.roles.engine.config import read_hf_config

logger = logging.getLogger(__name__)

__all__ = ["Qwen3Shape", "build_qwen3", "qwen3_model_config"]


@dataclass(kw_only=True, slots=True, frozen=True)
class Qwen3Shape:
    """The fields of a HF ``Qwen3Config`` that decide the torchtitan model (dense only)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    max_position_embeddings: int

    @classmethod
    def from_hf(cls, source: str | Path | Mapping[str, Any]) -> "Qwen3Shape":
        """Reads a HF model folder (its ``config.json``), a ``config.json`` path or a dict.

        Raises ConfigError naming the file when ``config.json`` is missing or malformed
        (``read_hf_config``), and naming the field when the config is not a dense Qwen3 that
        this builder reproduces exactly (attention bias, sliding window, non-default RoPE).
        """
        if isinstance(source, Mapping):
            cfg, where = dict(source), "the given config dict"
        else:
            # The same reader as the engine's model check: a missing, truncated or
            # non-object config.json is a ConfigError naming the file and the fix.
            cfg, path = read_hf_config(source)
            where = str(path)

        def need(name: str) -> Any:
            if name not in cfg:
                raise ConfigError(f"Qwen3 config ({where}): field {name!r} is missing; "
                                  f"save the config with transformers' Qwen3Config")
            return cfg[name]

        model_type = cfg.get("model_type", "qwen3")
        if model_type != "qwen3":
            raise ConfigError(f"Qwen3 config ({where}): model_type is {model_type!r}; only "
                              f"dense 'qwen3' is supported by the torchtitan trainer")
        if cfg.get("attention_bias", False):
            raise ConfigError(f"Qwen3 config ({where}): attention_bias=True is not supported "
                              f"(torchtitan's Qwen3 has no q/k/v bias); set it to false")
        if cfg.get("use_sliding_window", False):
            raise ConfigError(f"Qwen3 config ({where}): use_sliding_window=True is not "
                              f"supported; set it to false")
        rope = cfg.get("rope_parameters") or {}
        rope_type = rope.get("rope_type", (cfg.get("rope_scaling") or {}).get("rope_type",
                                                                             "default"))
        if rope_type != "default":
            raise ConfigError(f"Qwen3 config ({where}): rope_type {rope_type!r} is not "
                              f"supported; only 'default' RoPE matches CosSinRoPE")
        theta = rope.get("rope_theta", cfg.get("rope_theta"))
        if theta is None:
            raise ConfigError(f"Qwen3 config ({where}): no rope_theta in rope_parameters "
                              f"nor at top level")
        hidden, heads = int(need("hidden_size")), int(need("num_attention_heads"))
        head_dim = cfg.get("head_dim") or hidden // heads
        shape = cls(
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(need("intermediate_size")),
            num_hidden_layers=int(need("num_hidden_layers")),
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            rope_theta=float(theta),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 40960)),
        )
        if shape.num_attention_heads % shape.num_key_value_heads != 0:
            raise ConfigError(f"Qwen3 config ({where}): num_attention_heads="
                              f"{shape.num_attention_heads} is not a multiple of "
                              f"num_key_value_heads={shape.num_key_value_heads}")
        return shape


def qwen3_model_config(shape: Qwen3Shape, max_seq_len: int | None = None):
    """The torchtitan ``Qwen3Model.Config`` matching ``shape``, with SDPA attention.

    Args:
        shape: the HF fields.
        max_seq_len: length of the RoPE cache; defaults to ``max_position_embeddings``.
            A smaller value saves memory ([max_seq_len, 2 * head_dim] fp32 per layer).
    """
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear
    from torchtitan.models.common.nn_modules import RMSNorm
    from torchtitan.models.qwen3 import Qwen3Model

    from pivot.compat.torchtitan import qwen3_inits, qwen3_sdpa_layers

    _EMBEDDING_INIT, _LINEAR_INIT, _NORM_INIT = qwen3_inits()
    seq = max_seq_len or shape.max_position_embeddings
    if seq <= 0:
        raise ConfigError(f"qwen3_model_config: max_seq_len must be > 0, got {seq}")
    layers = qwen3_sdpa_layers(  # flex built, then swapped to SDPA (pivot.compat.torchtitan)
        n_layers=shape.num_hidden_layers,
        dim=shape.hidden_size,
        n_heads=shape.num_attention_heads,
        n_kv_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        hidden_dim=shape.intermediate_size,
        fuse_qkv=True,
        rope=CosSinRoPE.Config(dim=shape.head_dim, max_seq_len=seq, theta=shape.rope_theta),
    )

    def norm(dim: int) -> RMSNorm.Config:
        return RMSNorm.Config(normalized_shape=dim, eps=shape.rms_norm_eps,
                              param_init=_NORM_INIT)

    for layer in layers:
        layer.attention_norm = norm(shape.hidden_size)
        layer.ffn_norm = norm(shape.hidden_size)
        layer.attention.qk_norm = norm(shape.head_dim)
    return Qwen3Model.Config(
        vocab_size=shape.vocab_size,
        dim=shape.hidden_size,
        norm=norm(shape.hidden_size),
        enable_weight_tying=shape.tie_word_embeddings,
        tok_embeddings=Embedding.Config(num_embeddings=shape.vocab_size,
                                        embedding_dim=shape.hidden_size,
                                        param_init=_EMBEDDING_INIT),
        lm_head=Linear.Config(in_features=shape.hidden_size, out_features=shape.vocab_size,
                              param_init=_LINEAR_INIT),
        layers=layers,
    )


def build_qwen3(model_config, seed: int = 0) -> torch.nn.Module:
    """Builds and initialises the model on CPU in fp32 (deterministic for a given seed)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_config.build()
        model.init_states(buffer_device=torch.device("cpu"))
    n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    logger.info("built torchtitan Qwen3: %d layers, dim %d, %.2fM parameters",
                len(model.layers), model_config.dim, n / 1e6)
    return model


def state_dict_adapter(model_config):
    """torchtitan's HF <-> torchtitan name and layout converter for this model."""
    from torchtitan.models.qwen3 import Qwen3StateDictAdapter

    return Qwen3StateDictAdapter(model_config, None)
