"""The tiny models of the local (CPU) driver: a shared BPE tokenizer, a policy and a GenRM.

Both models are Qwen3 (transformers ``Qwen3ForCausalLM``) of the same shape (hidden 128,
4 layers, 4 heads of dim 32, 2 KV heads, fp32), SFT-trained for a short while on the
generated arithmetic task, and saved in Hugging Face format so vLLM and torchtitan load
them offline.

API used by the RL loop::

    from pivot.models import ensure_models, paths
    p = ensure_models(cache_dir)   # builds into <cache>/models/ if missing or stale
    p.policy, p.genrm, p.tokenizer # folders for from_pretrained / vLLM's LLM(model=...)

Command: ``python launchers/build_models.py [--out DIR] [--force]``. The cache defaults to
``$PIVOT_CACHE`` or ``<repo>/cache``; ``manifest.json`` holds the config hash and the
measured accuracy@1 and GenRM correlation.
"""

from pivot.models.build import (ModelPaths, build_models, default_cache_dir, ensure_models,
                                is_built, paths, read_manifest)
from pivot.models.config import ArchConfig, BuildConfig, qwen3_config
from pivot.models.tokenizer import BOS, EOS, PAD, train_tokenizer

__all__ = ["ArchConfig", "BOS", "BuildConfig", "EOS", "ModelPaths", "PAD", "build_models",
           "default_cache_dir", "ensure_models", "is_built", "paths", "qwen3_config",
           "read_manifest", "train_tokenizer"]
