"""FSDP2 over a 1-D mesh and the meta-device build of a torchtitan Qwen model (sec. 8.1).

Both model families (``pivot.roles.titan.family``) are torchtitan ``Qwen3Model`` classes,
so one build serves them: on the meta device, sharded per transformer block and at the
root, then allocated on the rank's device and initialised. Nothing full-size is allocated
on a rank; its shards are filled from a GPS Read or a checkpoint
(``Trainer.load_hf_state_dict`` / ``load_hf_rows``).

Precision (``PRECISIONS``): ``fp32`` trains in fp32; ``bf16`` keeps fp32 master weights
and AdamW state and computes in bf16 — FSDP2's ``MixedPrecisionPolicy`` (bf16 parameters
for compute, fp32 gradient reduction) when sharded, ``torch.autocast`` on one rank.
"""

from __future__ import annotations

import logging

import torch

from pivot.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["PRECISIONS", "build_on_meta", "fully_shard_blocks", "mixed_precision_policy"]

PRECISIONS = ("fp32", "bf16")


def mixed_precision_policy(precision: str):
    """FSDP2's policy for ``precision``: None for fp32, bf16 compute with fp32 reduction
    for bf16 (torchtitan's default for training)."""
    if precision not in PRECISIONS:
        raise ConfigError(f"Trainer.Config.precision must be one of {PRECISIONS}, got "
                          f"{precision!r}")
    if precision == "fp32":
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def fully_shard_blocks(model: torch.nn.Module, mesh, mp_policy=None,
                       reshard_after_forward: bool = True) -> None:
    """FSDP2 per transformer block and at the root over ``mesh`` (1-D).

    Gradients are reduced by plain SUM with a divide factor of 1 on every backend: the
    trainer divides the loss by the global response-token count, so the summed gradient
    is the single-process one (and gloo has no PREMUL_SUM or AVG anyway).
    """
    from torch.distributed.fsdp import fully_shard

    from pivot.compat.torchtitan import sum_reduction_over_gloo, use_partial_dtensor

    use_partial_dtensor()  # spmd_types needs torch >= 2.14 (docs/stack.md)
    kw = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if mp_policy is not None:
        kw["mp_policy"] = mp_policy
    for block in model.layers.values():
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    sum_reduction_over_gloo(model)


def build_on_meta(model_config, *, device: str | torch.device = "cpu", seed: int = 0,
                  mesh=None, mp_policy=None) -> torch.nn.Module:
    """Builds on the meta device, shards with FSDP2 over ``mesh`` (if given), then
    allocates on ``device`` and initialises (random weights from ``seed``, RoPE buffers).

    With a mesh each rank holds its dim-0 chunk of every parameter, initialised from the
    same seed on every rank (so the ranks' random weights differ from a single-process
    build's: the weights are meant to be loaded).
    """
    device = torch.device(device)
    with torch.device("meta"):
        model = model_config.build()
    if mesh is not None:
        fully_shard_blocks(model, mesh, mp_policy)
    model.to_empty(device=device)
    rng_devices = [] if device.type == "cpu" else [device.index or 0]
    with torch.random.fork_rng(devices=rng_devices,
                               device_type="cuda" if device.type == "cpu" else device.type):
        torch.manual_seed(seed)
        model.init_states(buffer_device=device)
    n = sum(p.numel() for p in model.parameters())
    logger.info("built torchtitan %s on %s: %d layers, dim %d, %.2fM parameters%s",
                type(model).__name__, device, len(model.layers), model_config.dim, n / 1e6,
                " (FSDP2)" if mesh is not None else "")
    return model
