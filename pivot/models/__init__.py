"""The tiny models of the local (CPU) driver: a policy and a GenRM, each with its own tokenizer.

The policy is a Qwen3 (4 layers of width 128), the GenRM a 2.2x larger Llama (6 layers of
width 160); each has a byte-level BPE tokenizer trained on its own SFT text (fp32 weights).
They are SFT-trained for a short while on the generated chain task (``pivot.data.chains``):
the policy writes worked steps, the GenRM checks them step by step. Both are saved in
Hugging Face format so vLLM and torchtitan load them offline.

API used by the RL loop::

    from pivot.models import ensure_models, paths
    p = ensure_models(cache_dir)   # builds into <cache>/models/ if missing or stale
    p.policy, p.genrm              # folders (weights and tokenizer) for from_pretrained /
                                   # vLLM's LLM(model=...); p.tokenizer: the policy's

Command: ``python launchers/build_models.py [--out DIR] [--force]``. The cache defaults to
``$PIVOT_CACHE`` or ``<repo>/cache``; ``manifest.json`` holds the config hash and the
measured accuracy@1 and GenRM correlation.
"""

from pivot.models.build import (ModelPaths, build_models, default_cache_dir, ensure_models,
                                is_built, paths, read_manifest)
from pivot.models.config import ArchConfig, BuildConfig, hf_config, qwen3_config
from pivot.models.tokenizer import BOS, EOS, PAD, train_tokenizer

__all__ = ["ArchConfig", "BOS", "BuildConfig", "EOS", "ModelPaths", "PAD", "build_models",
           "default_cache_dir", "ensure_models", "hf_config", "is_built", "paths", "qwen3_config",
           "read_manifest", "train_tokenizer"]
