"""Workarounds of torchtitan's internals (PyPI ``torchtitan`` 0.3.0) and of FSDP2 over gloo
(torch 2.13.0, CPU).

The trainer (``pivot.roles.trainer``, ``pivot.roles.titan.model``) builds torchtitan's
Qwen3 from a Hugging Face config on CPU: that needs the Qwen3 module's private layer builder
and init tables, a swap of the inner attention to SDPA (flex has no CPU backward, varlen is
CUDA-only), the fused-QKV load hook called by hand, and FSDP2 on gloo set up the way
torchtitan's distributed helpers and gloo accept. Each is a function here;
``tests/compat/test_torchtitan.py`` checks them against the installed torchtitan and torch.

Importing this module imports neither torchtitan nor torch.
"""

from __future__ import annotations

DIST = "torchtitan"
VERSION = "0.3.0"
TORCH_VERSION = "2.13.0"
WRITTEN_FOR = f"{DIST} {VERSION} on torch {TORCH_VERSION} (CPU)"
"""The torchtitan (and torch) every shim below was written for and checked against."""

SPMD_BACKEND = "partial_dtensor"
"""torchtitan 0.3.0's SPMD backend that runs on torch 2.13 (the default ``spmd_types``
needs torch >= 2.14)."""


def qwen3_inits() -> tuple[dict, dict, dict]:
    """``(embedding, linear, norm)`` parameter-init tables of torchtitan's Qwen3
    (``_EMBEDDING_INIT``, ``_LINEAR_INIT``, ``_NORM_INIT`` of ``torchtitan.models.qwen3``,
    private in 0.3.0), so a model sized from a HF config initialises like the shipped ones."""
    from torchtitan.models.qwen3 import _EMBEDDING_INIT, _LINEAR_INIT, _NORM_INIT

    return _EMBEDDING_INIT, _LINEAR_INIT, _NORM_INIT


def qwen3_sdpa_layers(*, n_layers: int, dim: int, n_heads: int, n_kv_heads: int,
                      head_dim: int, hidden_dim: int, rope, fuse_qkv: bool = True) -> list:
    """Per-layer configs of a dense Qwen3 with ``ScaledDotProductAttention`` inside.

    torchtitan 0.3.0 builds the layers with the private ``_build_qwen3_layers``, and its
    ``get_attention_config`` offers no SDPA for language models (flex, flex_flash, varlen
    only). Flex has no CPU backward and varlen is CUDA-only, so the layers are built with
    "flex" and the inner attention is swapped for SDPA, which is causal and takes no masks:
    batches must be right padded and never packed.
    """
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.qwen3 import _build_qwen3_layers

    layers = _build_qwen3_layers(n_layers=n_layers, dim=dim, n_heads=n_heads,
                                 n_kv_heads=n_kv_heads, head_dim=head_dim,
                                 hidden_dim=hidden_dim, fuse_qkv=fuse_qkv,
                                 attn_backend="flex", rope=rope)
    for layer in layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    return layers


def merge_fused_qkv(model, state_dict: dict) -> dict:
    """Merges split ``wq``/``wk``/``wv`` entries of ``state_dict`` into each fused
    ``wqkv`` of ``model``, in place; returns ``state_dict``.

    torchtitan 0.3.0 saves a ``FusedQKVLinear`` split (a state-dict hook) and merges it back
    in its private load hook ``FusedQKVLinear._merge_qkv_on_load``; the trainer copies
    tensors into the parameters itself, so it calls that hook by hand.
    """
    from torchtitan.models.common.attention import FusedQKVLinear

    for name, mod in model.named_modules():
        if isinstance(mod, FusedQKVLinear):
            FusedQKVLinear._merge_qkv_on_load(mod, state_dict, f"{name}.")
    return state_dict


def use_partial_dtensor() -> None:
    """Selects torchtitan's ``SPMD_BACKEND`` process-wide (``set_spmd_backend``, a module
    global of ``torchtitan.distributed.utils`` in 0.3.0): FSDP2 on torch 2.13 works only
    with it."""
    from torchtitan.distributed.utils import set_spmd_backend

    set_spmd_backend(SPMD_BACKEND)


def sum_reduction_over_gloo(model) -> int:
    """Makes every FSDP2 module of ``model`` reduce gradients by plain SUM with a divide
    factor of 1; returns how many modules it set.

    gloo has no PREMUL_SUM or AVG (torch 2.13.0), which FSDP2's default gradient average
    uses, so ``set_force_sum_reduction_for_comms(True)``; the loss must then be normalised
    by the caller (the trainer divides by the global token count, hence a factor of 1).
    """
    from torch.distributed.fsdp import FSDPModule

    n = 0
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_force_sum_reduction_for_comms(True)
            m.set_gradient_divide_factor(1.0)
            n += 1
    return n
