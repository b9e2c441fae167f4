"""Engine test helpers (tests and benchmarks only; see ``pivot.testing``): fresh random
weights for the tiny Qwen3 of ``pivot.roles.engine.tiny``, standing in for a GPS Read; and
a heap that hands out NaN-filled memory (``poisoned_heap``), to show what an engine serves
when re-allocated memory is not cleared."""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def random_state_dict(model_dir: str | Path, seed: int) -> dict[str, torch.Tensor]:
    """A fresh random state dict (HF names) with the shapes of the model in ``model_dir``.

    An MoE's is in its checkpoint's names (one tensor per expert, as GPS stores it and
    vLLM loads it; transformers 5 fuses the experts in memory), drawn here from the
    checkpoint's names and shapes: norms 1, the rest normal with the config's
    ``initializer_range``, the same on every rank of a replica."""
    cfg = AutoConfig.from_pretrained(model_dir)   # Qwen3, or Qwen3-MoE
    torch.manual_seed(seed)
    if not getattr(cfg, "num_experts", 0):
        model = AutoModelForCausalLM.from_config(cfg).to(torch.float32)
        return {k: v.detach().clone() for k, v in model.state_dict().items()}
    from pivot.roles.engine.config import read_hf_weights

    g = torch.Generator().manual_seed(seed)
    return {k: torch.ones(v.shape) if k.endswith("norm.weight") else
            torch.randn(v.shape, generator=g) * cfg.initializer_range
            for k, v in sorted(read_hf_weights(model_dir).items())}


M_PERTURB = -6
"""glibc's ``mallopt`` parameter: fill each allocation with the complement of the value's
low byte (and each freed chunk with the byte)."""


@contextlib.contextmanager
def poisoned_heap() -> Iterator[None]:
    """Every C-heap allocation made inside is filled with 0xFF bytes (a float32 NaN), the
    worst that reused memory can hold (glibc ``mallopt(M_PERTURB, 0x100)``: a non-zero
    value whose low byte is 0, so allocations get 0x00 ^ 0xFF). Restores glibc's default
    (no perturbation) on exit. Process-wide: use it around one engine call at a time."""
    libc = ctypes.CDLL("libc.so.6")
    if libc.mallopt(M_PERTURB, 0x100) != 1:
        raise RuntimeError("mallopt(M_PERTURB) refused: not glibc?")
    try:
        yield
    finally:
        libc.mallopt(M_PERTURB, 0)
