"""Full tensors from FSDP2 shards in one collective (the GPS Write and the optimizer state).

``DTensor.full_tensor()`` is one all-gather per tensor; across slots capped at half a core
each, every collective waits for the slowest rank's quota, and a step's GPS Write (every
parameter) plus its optimizer state (two moments per parameter) took 0.16 s and 0.30 s on
4 slots (``benchmarks/train_slots.py``). Here every rank packs its shards of all the
tensors into one buffer, one ``all_gather_into_tensor`` exchanges them, and each full
tensor is put back together from the ranks' dim-0 chunks. Values are copied, never
reduced: the result equals ``full_tensor()`` bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

__all__ = ["gather_full"]


def _rows(n: int, rank: int, world: int) -> int:
    """Rows of dim 0 that ``torch.chunk`` (FSDP2's sharding) gives ``rank``."""
    per = -(-n // world)
    return max(0, min(per, n - rank * per))


def _packable(t: torch.Tensor) -> bool:
    return (isinstance(t, DTensor) and t.device_mesh.ndim == 1
            and tuple(t.placements) == (Shard(0),) and t.dtype == torch.float32
            and t.dim() > 0)


def gather_full(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Full (unsharded) copies of ``tensors``, in order, on every rank. Collective.

    Float32 DTensors sharded on dim 0 of one 1-D mesh go through one all-gather; anything
    else (plain tensors, other placements) is copied or gathered on its own.
    """
    out: list[torch.Tensor | None] = [None] * len(tensors)
    packed = [i for i, t in enumerate(tensors) if _packable(t)]
    mesh = tensors[packed[0]].device_mesh if packed else None
    packed = [i for i in packed if tensors[i].device_mesh is mesh]
    for i, t in enumerate(tensors):
        if i not in packed:
            out[i] = t.full_tensor() if isinstance(t, DTensor) else t.detach().clone()
    if not packed:
        return out  # type: ignore[return-value]
    group = mesh.get_group(0)
    world, me = group.size(), group.rank()
    shapes = [tuple(tensors[i].shape) for i in packed]
    inner = [int(torch.Size(s[1:]).numel()) for s in shapes]
    sizes = [[_rows(s[0], r, world) * k for s, k in zip(shapes, inner)] for r in range(world)]
    width = max(sum(s) for s in sizes)
    buf = torch.zeros(width, dtype=torch.float32)
    off = 0
    for i, n in zip(packed, sizes[me]):
        local = tensors[i].to_local()
        if local.numel() != n:
            raise RuntimeError(f"gather_full: a shard of shape {tuple(local.shape)} is not "
                               f"torch.chunk's rank-{me} chunk of {tuple(tensors[i].shape)}")
        buf[off:off + n] = local.detach().reshape(-1)
        off += n
    every = torch.empty(world * width, dtype=torch.float32)
    dist.all_gather_into_tensor(every, buf, group=group)
    offs = [0] * world
    for j, i in enumerate(packed):
        pieces = []
        for r in range(world):
            n = sizes[r][j]
            start = r * width + offs[r]
            pieces.append(every[start:start + n])
            offs[r] += n
        out[i] = torch.cat(pieces).view(shapes[j])
    return out  # type: ignore[return-value]
