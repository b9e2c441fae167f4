"""A tensor-parallel rank's own shard of a model, Read from GPS (sec. 5.1, Read(M, G, P)
with P = TP k) and handed to vLLM's loaders.

vLLM loads a TP rank's weights from full Hugging Face tensors: each parameter's loader
narrows the tensor to the rank's rows or columns (``ColumnParallelLinear``, the fused
``QKVParallelLinear`` / ``MergedColumnParallelLinear`` and ``RowParallelLinear``). So a
rank needs only the part its loaders read. ``vllm_tp_split_dim`` is that part in GPS's
terms: the Megatron split of ``qwen3_split_dim`` (even contiguous ranges, rank r the r-th),
except where vLLM cuts otherwise, which are Read whole:

- the vocabulary (``VocabParallelEmbedding`` and ``ParallelLMHead`` pad each rank's range
  to a multiple of 64 rows, so rank 0 of a 308-row vocabulary at TP 2 holds rows 0-159,
  not GPS's 0-153);
- k/v projections whose KV heads do not divide by k (vLLM replicates them on several
  ranks; ``num_kv_head_replicas``);
- an MoE's experts under expert parallelism (``enable_expert_parallel``): each rank holds
  whole experts, not a slice of every expert (TP without EP slices each expert's
  intermediate dim as a dense MLP, which the Megatron split describes). Each expert is
  Read whole by the one rank that holds it (``ep_expert_owner``, vLLM's linear
  placement; the layout's ``owners``), so a rank Reads its experts and none of the others.

``RankShards`` holds what a rank Read and gives each tensor back at its full shape, built
when the loader asks for it (one at a time): the rank's range is the Read, the rest is
never read by the loader and is left uninitialised. Only the rank's bytes cross from GPS.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence

import torch

from pivot.errors import StateError
from pivot.gps.layout import qwen3_split_dim
from pivot.shifting.params import tensor_bytes

_VOCAB = re.compile(r"(embed_tokens|lm_head)\.weight$")
_KV = re.compile(r"(k_proj|v_proj)\.(weight|bias)$")
_EXPERT = re.compile(r"\.experts\.(\d+)\.")


def vllm_tp_split_dim(name: str, shape: Sequence[int], *, tp: int, kv_heads: int,
                      expert_parallel: bool = False) -> int | None:
    """The dim along which vLLM's loaders give TP rank r the r-th of ``tp`` even ranges of
    the HF parameter ``name``; None: the rank reads it whole (see the module docstring)."""
    if _VOCAB.search(name) or (expert_parallel and _EXPERT.search(name)):
        return None
    if _KV.search(name) and kv_heads % tp:
        return None
    return qwen3_split_dim(name, shape)


def ep_expert_owner(name: str, *, experts: int, ep: int) -> int | None:
    """The rank of an expert-parallel replica of ``ep`` ranks that holds the HF parameter
    ``name`` of an expert (``...experts.<e>...``), or None for any other parameter.

    vLLM's default "linear" placement: rank r holds experts ``[r*E/ep, (r+1)*E/ep)``
    (``vllm.model_executor.layers.fused_moe`` ``determine_expert_map``; E divides by ep,
    ``pivot.roles.engine.tp.check_ep_size``)."""
    m = _EXPERT.search(name)
    return None if m is None else int(m.group(1)) // (experts // ep)


class RankShards(Mapping[str, torch.Tensor]):
    """One TP rank's Read, by HF name; ``self[name]`` is the full-shape tensor whose
    rank-r range along ``dims[name]`` holds the Read (the rest uninitialised), or the
    Read itself where ``dims[name]`` is None.

    Args:
        shards: the GPS Read (``only`` this rank's device) under the TP layout; under
            expert parallelism it holds this rank's experts only, and so does the map.
        shapes: every parameter's full shape.
        dims: every parameter's split dim (``vllm_tp_split_dim``).
        rank / tp: this rank and the replica's size.
        version: the GPS version Read; it names the weights to the other ranks.
    """

    def __init__(self, shards: Mapping[str, torch.Tensor], shapes: Mapping[str, tuple],
                 dims: Mapping[str, int | None], rank: int, tp: int, version: int) -> None:
        self.shards, self.shapes, self.dims = dict(shards), dict(shapes), dict(dims)
        self.rank, self.tp, self.version = rank, tp, version
        for name, t in self.shards.items():
            d, full = self.dims.get(name), tuple(self.shapes[name])
            want = full if d is None else full[:d] + (full[d] // tp,) + full[d + 1:]
            if tuple(t.shape) != want:
                raise StateError(f"GPS Read for TP rank {rank} of {tp}: {name} has shape "
                                 f"{tuple(t.shape)}, expected {want} (full {full}, split "
                                 f"dim {d})")

    @property
    def nbytes(self) -> int:
        """Bytes this rank Read from GPS."""
        return tensor_bytes(self.shards.values())

    def __getitem__(self, name: str) -> torch.Tensor:
        shard, d = self.shards[name], self.dims.get(name)
        if d is None:
            return shard
        full = torch.empty(self.shapes[name], dtype=shard.dtype, device=shard.device)
        size = shard.shape[d]
        full.narrow(d, self.rank * size, size).copy_(shard)
        return full

    def __iter__(self) -> Iterator[str]:
        return iter(self.shards)

    def __len__(self) -> int:
        return len(self.shards)
