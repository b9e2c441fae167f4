"""Qwen2 shapes: ``Qwen2Shape`` read from a HF ``config.json``, and the configs of the
paper's Qwen2.5 policies (sec. 8, table 1), no weights, which the Qwen2 trainer
(``pivot.roles.titan.qwen2``) and the GPU check (``launchers/gpu_check.py``) build at real
size with dummy values. Imports neither torch nor torchtitan.

Origin: ``https://huggingface.co/Qwen/<name>/blob/main/config.json`` (the base models,
Apache-2.0), transcribed field for field; the shape fields agree with the model group gin
files (``gin/qwen1.5b_glm9b.gin``, ``gin/qwen7b_30b.gin``). ``max_window_layers`` and
``sliding_window`` are inert there (``use_sliding_window`` is false).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

from pivot.errors import ConfigError
from pivot.roles.titan.hf_shape import DenseShape

__all__ = ["QWEN2_5", "QWEN2_5_0_5B", "QWEN2_5_1_5B", "QWEN2_5_7B", "Qwen2Shape"]

_COMMON = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "model_type": "qwen2",
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_mrope": False,
    "use_sliding_window": False,
}

QWEN2_5_0_5B = MappingProxyType({
    **_COMMON,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 24,
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "vocab_size": 151936,
})
"""Qwen/Qwen2.5-0.5B: 24 layers, hidden 896, 14 query / 2 KV heads of 64, tied."""

QWEN2_5_1_5B = MappingProxyType({
    **_COMMON,
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "num_attention_heads": 12,
    "num_hidden_layers": 28,
    "num_key_value_heads": 2,
    "sliding_window": 131072,
    "tie_word_embeddings": True,
    "vocab_size": 151936,
})
"""Qwen/Qwen2.5-1.5B: 28 layers, hidden 1536, 12 query / 2 KV heads of 128, tied."""

QWEN2_5_7B = MappingProxyType({
    **_COMMON,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "vocab_size": 152064,
})
"""Qwen/Qwen2.5-7B: 28 layers, hidden 3584, 28 query / 4 KV heads of 128, untied."""

QWEN2_5 = MappingProxyType({"0.5B": QWEN2_5_0_5B, "1.5B": QWEN2_5_1_5B, "7B": QWEN2_5_7B})
"""By size name."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Qwen2Shape(DenseShape):
    """The fields of a HF ``Qwen2Config`` that decide the model (dense, full attention)."""

    MODEL_TYPE: ClassVar[str] = "qwen2"
    LABEL: ClassVar[str] = "Qwen2"
    DEFAULT_MAX_POSITIONS: ClassVar[int] = 32768
    WRONG_TYPE: ClassVar[str] = ("this builder takes 'qwen2' (Qwen2, Qwen2.5); use "
                                 "pivot.roles.titan.model for 'qwen3'")

    @classmethod
    def _refuse(cls, cfg: Mapping[str, Any], label: str) -> None:
        if cfg.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"{label}: hidden_act {cfg['hidden_act']!r} is not supported; "
                              f"torchtitan's FeedForward is SwiGLU ('silu')")
        layer_types = cfg.get("layer_types") or []
        if cfg.get("use_sliding_window", False) or any(t != "full_attention"
                                                       for t in layer_types):
            raise ConfigError(f"{label}: sliding-window layers are not supported; set "
                              f"use_sliding_window to false")

    def hf_param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor of the HF checkpoint, by HF name (``lm_head`` only when untied)."""
        h, hd, inter = self.hidden_size, self.head_dim, self.intermediate_size
        q, kv = self.num_attention_heads * hd, self.num_key_value_heads * hd
        out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (self.vocab_size, h)}
        for i in range(self.num_hidden_layers):
            p = f"model.layers.{i}."
            out.update({
                p + "self_attn.q_proj.weight": (q, h), p + "self_attn.q_proj.bias": (q,),
                p + "self_attn.k_proj.weight": (kv, h), p + "self_attn.k_proj.bias": (kv,),
                p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.v_proj.bias": (kv,),
                p + "self_attn.o_proj.weight": (h, q),
                p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                p + "mlp.down_proj.weight": (h, inter),
                p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            })
        out["model.norm.weight"] = (h,)
        if not self.tie_word_embeddings:
            out["lm_head.weight"] = (self.vocab_size, h)
        return out

    def num_params(self) -> int:
        n = 0
        for s in self.hf_param_shapes().values():
            k = 1
            for d in s:
                k *= d
            n += k
        return n
