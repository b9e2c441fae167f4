"""Engine test helpers (tests and benchmarks only; see ``pivot.testing``): fresh random
weights for the tiny Qwen3 of ``pivot.roles.engine.tiny``, standing in for a GPS Read."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def random_state_dict(model_dir: str | Path, seed: int) -> dict[str, torch.Tensor]:
    """A fresh random state dict (HF names) with the shapes of the model in ``model_dir``."""
    cfg = Qwen3Config.from_pretrained(model_dir)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).to(torch.float32)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
