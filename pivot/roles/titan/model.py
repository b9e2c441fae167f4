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
from typing import Any, ClassVar

import torch

from pivot.errors import ConfigError
from pivot.roles.titan.hf_shape import DenseShape

logger = logging.getLogger(__name__)

__all__ = ["Qwen3Shape", "build_qwen3", "qwen3_model_config"]


@dataclass(kw_only=True, slots=True, frozen=True)
class Qwen3Shape(DenseShape):
    """The fields of a HF ``Qwen3Config`` that decide the torchtitan model (dense only)."""

    MODEL_TYPE: ClassVar[str] = "qwen3"
    LABEL: ClassVar[str] = "Qwen3"
    DEFAULT_MAX_POSITIONS: ClassVar[int] = 40960
    WRONG_TYPE: ClassVar[str] = "only dense 'qwen3' is supported by the torchtitan trainer"

    @classmethod
    def _refuse(cls, cfg: Mapping[str, Any], label: str) -> None:
        if cfg.get("attention_bias", False):
            raise ConfigError(f"{label}: attention_bias=True is not supported (torchtitan's "
                              f"Qwen3 has no q/k/v bias); set it to false")
        if cfg.get("use_sliding_window", False):
            raise ConfigError(f"{label}: use_sliding_window=True is not supported; set it to "
                              f"false")


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
