"""The shape of a dense Qwen-family model as its Hugging Face ``config.json`` gives it:
the one reader the trainer's model builders share (``Qwen3Shape`` in
``pivot.roles.titan.model``, ``Qwen2Shape`` in ``pivot.roles.titan.qwen2_config``). Imports
neither torch nor torchtitan (the GPU check builds shapes without them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pivot.errors import ConfigError


@dataclass(kw_only=True, slots=True, frozen=True)
class DenseShape:
    """The fields of a HF config that decide the torchtitan model. A family subclasses it
    with its ``model_type``, its default context and what it refuses (``_refuse``)."""

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

    MODEL_TYPE: ClassVar[str] = ""
    LABEL: ClassVar[str] = ""
    """How messages name the family (``Qwen3``)."""
    DEFAULT_MAX_POSITIONS: ClassVar[int] = 32768
    WRONG_TYPE: ClassVar[str] = ""
    """The fix a message gives for another ``model_type``."""

    @classmethod
    def _refuse(cls, cfg: Mapping[str, Any], label: str) -> None:
        """Raises ConfigError for a setting this family's builder does not reproduce."""

    @classmethod
    def from_hf(cls, source: str | Path | Mapping[str, Any]):
        """Reads a HF model folder (its ``config.json``), a ``config.json`` path or a dict.

        Raises ConfigError naming the file when ``config.json`` is missing or malformed
        (``read_hf_config``), and naming the field when the config is not one this
        family's builder reproduces exactly (non-default RoPE and the family's own
        refusals).
        """
        if isinstance(source, Mapping):
            cfg, where = dict(source), "the given config dict"
        else:
            # The same reader as the engine's model check: a missing, truncated or
            # non-object config.json is a ConfigError naming the file and the fix.
            from pivot.roles.engine.config import read_hf_config

            cfg, path = read_hf_config(source)
            where = str(path)
        label = f"{cls.LABEL} config ({where})"

        def need(name: str) -> Any:
            if cfg.get(name) is None:
                raise ConfigError(f"{label}: field {name!r} is missing; save the config "
                                  f"with transformers' {cls.LABEL}Config")
            return cfg[name]

        model_type = cfg.get("model_type", cls.MODEL_TYPE)
        if model_type != cls.MODEL_TYPE:
            raise ConfigError(f"{label}: model_type is {model_type!r}; {cls.WRONG_TYPE}")
        cls._refuse(cfg, label)
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ConfigError(f"{label}: rope_type {rope_type!r} is not supported; only "
                              f"'default' RoPE matches CosSinRoPE")
        theta = rope.get("rope_theta", cfg.get("rope_theta"))
        if theta is None:
            raise ConfigError(f"{label}: no rope_theta in rope_parameters nor at top level")
        hidden, heads = int(need("hidden_size")), int(need("num_attention_heads"))
        shape = cls(
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(need("intermediate_size")),
            num_hidden_layers=int(need("num_hidden_layers")),
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rope_theta=float(theta),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_position_embeddings=int(cfg.get("max_position_embeddings",
                                                cls.DEFAULT_MAX_POSITIONS)),
        )
        if shape.num_attention_heads % shape.num_key_value_heads != 0:
            raise ConfigError(f"{label}: num_attention_heads={shape.num_attention_heads} is "
                              f"not a multiple of num_key_value_heads="
                              f"{shape.num_key_value_heads}")
        return shape
