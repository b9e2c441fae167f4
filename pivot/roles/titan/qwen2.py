"""Qwen2 / Qwen2.5 from torchtitan's Qwen3 blocks (the paper's policies,
sec. 8, table 1).

torchtitan 0.3.0 ships Qwen3 but not Qwen2. A dense Qwen2 is a Qwen3 with three changes,
all of which torchtitan's building blocks already express:

* a bias on the q, k and v projections (the fused ``wqkv`` gets ``bias=True``; torchtitan's
  fused-QKV save/load hooks split and merge biases like weights);
* no per-head q/k RMSNorm (``qk_norm=None``);
* ``head_dim = hidden_size / num_attention_heads`` (the config has no ``head_dim``);
  tied embeddings for the small sizes and the RoPE theta come from the config as in Qwen3.

So ``qwen2_model_config`` builds the Qwen3 config (``pivot.roles.titan.model``, SDPA
inside) and switches those fields, and ``Qwen2StateDictAdapter`` is torchtitan's
``Qwen3StateDictAdapter`` with the bias names added and the q/k norm names removed.
``build_qwen2`` builds on the meta device, shards with FSDP2 when given a mesh, and only
then allocates; each rank then fills its own shard (``pivot.roles.titan.hf_shards``).
``Qwen2Shape`` and real configs (no weights) are in ``pivot.roles.titan.qwen2_config``.
"""

from __future__ import annotations

import dataclasses

import torch
from torchtitan.models.qwen3 import Qwen3StateDictAdapter

from pivot.roles.titan.model import Qwen3Shape, qwen3_model_config
from pivot.roles.titan.qwen2_config import Qwen2Shape
from pivot.roles.titan.sharding import build_on_meta

__all__ = ["Qwen2Shape", "Qwen2StateDictAdapter", "build_qwen2", "qwen2_model_config",
           "state_dict_adapter"]


def qwen2_model_config(shape: Qwen2Shape, max_seq_len: int | None = None):
    """The torchtitan ``Qwen3Model.Config`` of a Qwen2: Qwen3 layers (SDPA inside) with a
    q/k/v bias and no q/k norm.

    Args:
        shape: the HF fields.
        max_seq_len: length of the RoPE cache; defaults to ``max_position_embeddings``.
    """
    config = qwen3_model_config(Qwen3Shape(**dataclasses.asdict(shape)), max_seq_len)
    for layer in config.layers:
        layer.attention.qk_norm = None
        # the fused wqkv's init table has a "bias" entry already (zeros, from Qwen3's
        # linear init), so the bias is initialised like the weight, per q/k/v slice
        layer.attention.qkv_linear.wqkv.bias = True
    return config


class Qwen2StateDictAdapter(Qwen3StateDictAdapter):
    """torchtitan's ``Qwen3StateDictAdapter`` for Qwen2: ``to_hf`` / ``from_hf`` between
    torchtitan names (split ``wq``/``wk``/``wv``, as ``model.state_dict()`` gives them) and
    HF names, with the q/k/v biases added and the q/k norms removed."""

    def __init__(self, model_config, hf_assets_path: str | None = None):
        super().__init__(model_config, hf_assets_path)
        for norm in ("q_norm", "k_norm"):
            del self.from_hf_map[f"model.layers.{{}}.self_attn.{norm}.weight"]
        for hf, titan in (("q_proj", "wq"), ("k_proj", "wk"), ("v_proj", "wv")):
            self.from_hf_map[f"model.layers.{{}}.self_attn.{hf}.bias"] = \
                f"layers.{{}}.attention.qkv_linear.{titan}.bias"


def state_dict_adapter(model_config):
    """The HF <-> torchtitan converter for a model built by ``qwen2_model_config``."""
    return Qwen2StateDictAdapter(model_config, None)


def build_qwen2(model_config, *, device: str | torch.device = "cpu", seed: int = 0,
                mesh=None, mp_policy=None) -> torch.nn.Module:
    """A Qwen2 built on the meta device, sharded with FSDP2 over ``mesh`` (if given), then
    allocated on ``device`` (``pivot.roles.titan.sharding.build_on_meta``); fill each
    rank's shards with ``hf_shards.load_hf_shards``."""
    return build_on_meta(model_config, device=device, seed=seed, mesh=mesh,
                         mp_policy=mp_policy)
