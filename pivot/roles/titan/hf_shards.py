"""Each rank Reads and Writes only its own shard of a HF-named checkpoint.

A model built on the meta device and sharded with FSDP2 (dim-0 chunks, ``torch.chunk``'s
split) holds on each rank a contiguous row range of every parameter. This module maps
that range to row ranges of the Hugging Face tensors it comes from, so a rank fills its
shards from a reader that returns rows (a safetensors checkpoint read by slices, or a GPS
Read, sec. 5.1) and hands back only its own rows on a Write. No collective runs.

The one parameter that is not a renamed HF tensor is torchtitan's fused QKV projection:
``wqkv`` rows are laid out ``[n_kv, heads_per_kv + 2, head_dim]`` (the query heads of a
KV group, then its key head, then its value head), the layout of
``FusedQKVLinear._merge_qkv_on_load``; its rows come from ``q_proj``, ``k_proj`` and
``v_proj`` in runs of ``head_dim`` rows (weights and biases alike).

Names go through the model's state-dict adapter (``to_hf``), so the same code serves
Qwen3 and Qwen2. Only 1-D meshes with ``Shard(0)`` (FSDP2) or plain tensors are handled;
anything else (TP, HSDP) raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch
from torch.distributed.tensor import DTensor, Shard

from pivot.errors import StateError

__all__ = [
    "ChunkRows",
    "HFShard",
    "chunk_of",
    "RowReader",
    "RowSegment",
    "fused_qkv_segments",
    "StateDictRows",
    "hf_shapes",
    "hf_shards",
    "load_hf_shards",
    "local_rows",
    "merge_hf_shards",
    "row_segments",
]

_FUSED = ("wqkv.weight", "wqkv.bias")


@dataclass(frozen=True, slots=True)
class RowSegment:
    """Rows ``[dst, dst + rows)`` of a rank-local tensor are rows ``[src, src + rows)`` of
    the HF tensor ``hf_name``."""

    hf_name: str
    src: int
    dst: int
    rows: int


@dataclass(frozen=True, slots=True)
class HFShard:
    """Rows ``[start, start + len(tensor))`` of the HF tensor ``name`` (a Write piece)."""

    name: str
    start: int
    tensor: torch.Tensor


class RowReader(Protocol):
    """Where a rank's rows come from: a checkpoint on disk, a GPS Read, a state dict."""

    def shape(self, name: str) -> tuple[int, ...]:
        """Full shape of the HF tensor ``name`` (KeyError if absent)."""
        ...

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``[start, stop)`` of dim 0 of the HF tensor ``name``."""
        ...


class StateDictRows:
    """Rows of an in-memory HF state dict."""

    def __init__(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        self.state_dict = state_dict

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.state_dict[name].shape)

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        return self.state_dict[name][start:stop]


class ChunkRows:
    """Rows of this rank's dim-0 chunk of each HF tensor (a GPS Read under the FSDP read
    layout, ``pivot.runtime.gps_source.FsdpShardLayouts``): rank ``rank`` of ``world`` holds
    rows ``chunk_bounds(rows, world)[rank:rank + 2]`` of every tensor. A request outside the
    chunk raises: the model's shards and the Read's chunks do not line up."""

    def __init__(self, chunks: Mapping[str, torch.Tensor],
                 full_shapes: Mapping[str, tuple[int, ...]], rank: int, world: int) -> None:
        self.chunks, self.full_shapes = chunks, dict(full_shapes)
        self.first: dict[str, int] = {}
        for name, t in chunks.items():
            full = self.full_shapes.get(name)
            if full is None:
                raise StateError(f"ChunkRows: {name!r} is not a tensor of the model")
            lo, hi = _chunk(full[0], rank, world)
            if tuple(t.shape) != (hi - lo, *full[1:]):
                raise StateError(f"ChunkRows: {name} holds shape {tuple(t.shape)}, but rank "
                                 f"{rank} of {world} holds rows [{lo}, {hi}) of "
                                 f"{tuple(full)}")
            self.first[name] = lo

    def shape(self, name: str) -> tuple[int, ...]:
        return self.full_shapes[name]

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        if name not in self.first:
            raise StateError(f"ChunkRows: the Read holds no {name!r}")
        lo = self.first[name]
        hi = lo + self.chunks[name].shape[0]
        if not lo <= start <= stop <= hi:
            raise StateError(f"ChunkRows: rows [{start}, {stop}) of {name} lie outside "
                             f"this rank's chunk [{lo}, {hi}); read full tensors instead")
        return self.chunks[name][start - lo:stop - lo]


def local_rows(p: torch.Tensor) -> tuple[int, int]:
    """``[start, stop)`` of dim 0 of the full parameter that this rank holds.

    FSDP2 shards dim 0 with ``torch.chunk``: ``ceil(n / world)`` rows a rank, the last
    ranks short or empty. A plain tensor is held whole.
    """
    if not isinstance(p, DTensor):
        return 0, p.shape[0]
    if p.device_mesh.ndim != 1 or tuple(p.placements) != (Shard(0),):
        raise StateError(f"hf_shards: a parameter placed {tuple(p.placements)} on a "
                         f"{p.device_mesh.ndim}-D mesh; only FSDP2's Shard(0) on a 1-D mesh "
                         f"is supported")
    # the mesh's coordinate, not get_local_rank(): that translates the default group's
    # rank, which is 0 in every slot of a side group (pivot.compat.torch_dist)
    n, world, me = p.shape[0], p.device_mesh.size(0), p.device_mesh.get_coordinate()[0]
    per = -(-n // world)
    start = min(me * per, n)
    return start, min(start + per, n)


def fused_qkv_segments(mod, names: tuple[str, str, str], start: int, stop: int
                    ) -> list[RowSegment]:
    """Segments of rows ``[start, stop)`` of a fused ``wqkv`` (weight or bias).

    Args:
        mod: the ``FusedQKVLinear`` (its ``head_dim``, ``heads_per_kv``, ``r_dim``).
        names: the HF names of the q, k and v projections it fuses.
    """
    hd, hpk, r_dim = mod.head_dim, mod.heads_per_kv, mod.r_dim
    out: list[RowSegment] = []
    first, last = start // hd, -(-stop // hd)
    for block in range(first, last):  # a block is one head: hd rows of one HF tensor
        g, r = divmod(block, r_dim)
        lo, hi = max(start, block * hd), min(stop, (block + 1) * hd)
        if r < hpk:
            name, src = names[0], (g * hpk + r) * hd
        else:
            name, src = names[1 if r == hpk else 2], g * hd
        src += lo - block * hd
        prev = out[-1] if out else None
        if prev and prev.hf_name == name and prev.src + prev.rows == src:
            out[-1] = RowSegment(name, prev.src, prev.dst, prev.rows + hi - lo)
        else:
            out.append(RowSegment(name, src, lo - start, hi - lo))
    return out


def _split_names(name: str) -> tuple[str, str, str]:
    """``<qkv>.wqkv.<kind>`` -> the names of its ``wq``, ``wk``, ``wv`` pieces."""
    base, _, kind = name.rsplit(".", 2)
    return tuple(f"{base}.{w}.{kind}" for w in ("wq", "wk", "wv"))  # type: ignore[return-value]


def _fused_module(model: torch.nn.Module, name: str):
    """The ``FusedQKVLinear`` that owns the parameter ``name`` (``<qkv>.wqkv.<kind>``)."""
    return model.get_submodule(name.rsplit(".", 2)[0])


def _hf_names(model: torch.nn.Module, adapter) -> dict[str, str]:
    """torchtitan state-dict name (split q/k/v) -> HF name, through ``adapter.to_hf``."""
    split: list[str] = []
    for n, _ in model.named_parameters():
        split += list(_split_names(n)) if n.endswith(_FUSED) else [n]
    back = adapter.to_hf({s: s for s in split})
    return {titan: hf for hf, titan in back.items()}


def row_segments(model: torch.nn.Module, adapter) -> dict[str, list[RowSegment]]:
    """For each parameter (deduplicated, as ``named_parameters`` gives them), the HF row
    ranges its rank-local rows come from, in local order."""
    names = _hf_names(model, adapter)
    out: dict[str, list[RowSegment]] = {}
    for n, p in model.named_parameters():
        start, stop = local_rows(p)
        if n.endswith(_FUSED):
            split = _split_names(n)
            missing = [s for s in split if s not in names]
            if missing:
                raise StateError(f"hf_shards: the adapter gives no HF name for {missing}")
            mod = _fused_module(model, n)
            out[n] = fused_qkv_segments(mod, tuple(names[s] for s in split), start, stop)
        else:
            if n not in names:
                raise StateError(f"hf_shards: the adapter gives no HF name for {n!r}")
            out[n] = [RowSegment(names[n], start, 0, stop - start)] if stop > start else []
    return out


def hf_shapes(model: torch.nn.Module, adapter) -> dict[str, tuple[int, ...]]:
    """Full shape of every HF tensor the model's parameters come from."""
    names = _hf_names(model, adapter)
    shapes: dict[str, tuple[int, ...]] = {}
    for n, p in model.named_parameters():
        if n.endswith(_FUSED):
            mod = _fused_module(model, n)
            tail = tuple(p.shape[1:])
            n_kv = p.shape[0] // (mod.r_dim * mod.head_dim)
            q, k, v = (names[s] for s in _split_names(n))
            shapes[q] = (n_kv * mod.heads_per_kv * mod.head_dim, *tail)
            shapes[k] = shapes[v] = (n_kv * mod.head_dim, *tail)
        else:
            shapes[names[n]] = tuple(p.shape)
    return shapes


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if isinstance(p, DTensor) else p


def load_hf_shards(model: torch.nn.Module, adapter, reader: RowReader) -> int:
    """Fills every parameter's rank-local rows from ``reader``; returns the bytes copied.

    Checks each HF tensor's full shape against the model first (StateError naming it).
    """
    segments = row_segments(model, adapter)
    want = hf_shapes(model, adapter)
    for name, shape in want.items():
        try:
            got = reader.shape(name)
        except KeyError:
            raise StateError(f"load_hf_shards: the checkpoint has no {name!r}") from None
        if tuple(got) != shape:
            raise StateError(f"load_hf_shards: {name} has shape {tuple(got)}, the model "
                             f"expects {shape}")
    total = 0
    with torch.no_grad():
        for n, p in model.named_parameters():
            loc = _local(p)
            for s in segments[n]:
                src = reader.rows(s.hf_name, s.src, s.src + s.rows)
                loc[s.dst:s.dst + s.rows].copy_(src)
                total += src.numel() * loc.element_size()
    return total


def hf_shards(model: torch.nn.Module, adapter) -> list[HFShard]:
    """This rank's rows of every HF tensor (views of the parameters, no copy): the pieces of
    a Write. Across ranks they partition every HF tensor exactly once."""
    out = []
    params = dict(model.named_parameters())
    for n, segs in row_segments(model, adapter).items():
        loc = _local(params[n]).detach()
        out += [HFShard(s.hf_name, s.src, loc[s.dst:s.dst + s.rows]) for s in segs]
    return out


def chunk_of(pieces, full_shapes: Mapping[str, tuple[int, ...]], rank: int,
             world: int) -> dict[str, torch.Tensor]:
    """This rank's Write pieces (``hf_shards``) as its dim-0 chunk of each HF tensor (rows
    ``chunk_bounds(rows, world)[rank:rank + 2]``, what ``FsdpShardLayouts`` Writes): the
    pieces of a name must tile exactly that range, else StateError (the model's shards do
    not line up with the chunks)."""
    by_name: dict[str, list[HFShard]] = {}
    for p in pieces:
        by_name.setdefault(p.name, []).append(p)
    out = {}
    for name, full in full_shapes.items():
        lo, hi = _chunk(full[0], rank, world)
        mine = sorted(by_name.get(name, []), key=lambda p: p.start)
        at = lo
        for p in mine:
            if p.start != at:
                break
            at += p.tensor.shape[0]
        if at != hi:
            raise StateError(f"chunk_of: rank {rank} of {world} holds rows "
                             f"{[(p.start, p.start + p.tensor.shape[0]) for p in mine]} of "
                             f"{name}, not its chunk [{lo}, {hi}); write full tensors instead")
        out[name] = (torch.cat([p.tensor for p in mine]) if mine
                     else torch.empty((0, *full[1:])))
    return out


def _chunk(rows: int, rank: int, world: int) -> tuple[int, int]:
    """``[lo, hi)``: rank ``rank``'s rows of ``rows`` under GPS's dim-0 split into
    ``world`` chunks (``pivot.gps.layout.chunk_bounds``)."""
    from pivot.gps.layout import chunk_bounds

    lo, hi = chunk_bounds(rows, world)[rank:rank + 2]
    return int(lo), int(hi)


def merge_hf_shards(pieces, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """Full HF tensors from the Write pieces of all ranks (checks every row is written
    exactly once)."""
    pieces = list(pieces)
    dtype = pieces[0].tensor.dtype if pieces else torch.float32
    full = {k: torch.empty(s, dtype=dtype) for k, s in shapes.items()}
    seen = {k: torch.zeros(s[0], dtype=torch.int32) for k, s in shapes.items()}
    for p in pieces:
        rows = p.tensor.shape[0]
        full[p.name][p.start:p.start + rows] = p.tensor
        seen[p.name][p.start:p.start + rows] += 1
    bad = [k for k, s in seen.items() if not bool((s == 1).all())]
    if bad:
        raise StateError(f"merge_hf_shards: rows written other than exactly once in {bad[:5]}")
    return full
