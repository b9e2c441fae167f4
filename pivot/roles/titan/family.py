"""The policy's model family, chosen by its ``config.json``'s ``model_type``:
the paper's policies are Qwen2.5 (``qwen2``); the tiny CPU policy is a Qwen3.
Both are torchtitan Qwen3 blocks (``pivot.roles.titan.model`` / ``qwen2``); the trainer
sees only this record, never the family."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pivot.errors import ConfigError


@dataclass(frozen=True)
class Family:
    """How to build one family: HF shape, torchtitan config, adapter, build."""

    name: str
    shape: Callable[[Any], Any]              # HF folder / config.json / dict -> shape
    model_config: Callable[[Any, int], Any]  # (shape, max_seq_len) -> torchtitan config
    adapter: Callable[[Any], Any]            # torchtitan config -> HF state-dict adapter
    build: Callable[..., Any]                # (torchtitan config, seed=) -> model on CPU


def _qwen3() -> Family:
    from pivot.roles.titan import model as m
    return Family("qwen3", m.Qwen3Shape.from_hf, m.qwen3_model_config, m.state_dict_adapter,
                  m.build_qwen3)


def _qwen2() -> Family:
    from pivot.roles.titan import qwen2 as m
    return Family("qwen2", m.Qwen2Shape.from_hf, m.qwen2_model_config, m.state_dict_adapter,
                  lambda cfg, seed=0: m.build_qwen2(cfg, seed=seed))


FAMILIES: Mapping[str, Callable[[], Family]] = {"qwen3": _qwen3, "qwen2": _qwen2}


def family_of(source: str | Path | Mapping[str, Any]) -> Family:
    """The family of a HF model folder, ``config.json`` path or config dict.

    Raises:
        ConfigError: naming the file and the families the trainer builds.
    """
    if isinstance(source, Mapping):
        cfg, where = dict(source), "the given config dict"
    else:
        from pivot.roles.engine.config import read_hf_config
        cfg, path = read_hf_config(source)
        where = str(path)
    kind = cfg.get("model_type", "qwen3")
    if kind not in FAMILIES:
        raise ConfigError(f"{where}: model_type {kind!r} has no trainer; the trainer builds "
                          f"{sorted(FAMILIES)} (pivot.roles.titan.family)")
    return FAMILIES[kind]()
