"""AdamW state by parameter name, full (unsharded), so it can move between device sets.

Sec. 5.2 offloads training's optimizer state to host memory on a shift down and reloads it
on the shift up. PivotRL may bring training back on *other* devices (the planner frees
whichever replicas are cheapest), and an FSDP2 rank's shard is only valid on the rank that
holds it: moved to other slots, or to a different number of them, the shards must be cut
again. The format here is the layout-free one: parameter name -> {state key -> full
tensor} (AdamW's ``exp_avg`` and ``exp_avg_sq`` gathered, ``step`` as is), built by a
collective on every rank and loaded by each rank taking its own shard locally (no
communication), like ``Trainer.load_hf_state_dict``. Gather and re-cut copy values
exactly, so a state that went through this format is bit-identical to one that did not.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor, distribute_tensor

from pivot.errors import StateError

FORMAT = "adamw-full/1"
"""Tag of the dict ``full_state`` returns; ``load_full_state`` refuses anything else."""

__all__ = ["FORMAT", "full_state", "load_full_state"]


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``{"format": FORMAT, "state": {name: {key: tensor}}}``, full tensors on every rank.

    Collective under FSDP2 (every rank must call it, in the same order of parameters).
    Parameters without state (never stepped) are left out.
    """
    from pivot.roles.titan.gather import gather_full

    entries = [(name, optimizer.state.get(p)) for name, p in model.named_parameters()]
    entries = [(name, st) for name, st in entries if st]
    keys = [(name, k) for name, st in entries for k, v in st.items()
            if isinstance(v, torch.Tensor)]
    with torch.no_grad():
        full = gather_full([dict(entries)[name][k] for name, k in keys])
    out: dict[str, dict[str, Any]] = {name: {k: v for k, v in st.items()
                                             if not isinstance(v, torch.Tensor)}
                                      for name, st in entries}
    for (name, k), v in zip(keys, full):
        out[name][k] = v
    return {"format": FORMAT, "state": out}


def load_full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    state: dict[str, Any]) -> int:
    """Replaces ``optimizer``'s state with ``state`` (from ``full_state``, possibly on
    another number of ranks); each rank keeps its shard. Returns the parameters loaded.

    Raises StateError naming the parameter when names or shapes disagree with the model.
    """
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        got = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise StateError(f"optimizer state has format {got!r}, expected {FORMAT!r} (from "
                         f"pivot.roles.titan.optim_state.full_state); a checkpoint written "
                         f"before it cannot restore AdamW: start the run fresh")
    params = dict(model.named_parameters())
    unknown = sorted(set(state["state"]) - set(params))
    if unknown:
        raise StateError(f"optimizer state names parameters the model lacks: {unknown[:5]}")
    optimizer.state.clear()
    with torch.no_grad():
        for name, entry in state["state"].items():
            p = params[name]
            st: dict[str, Any] = {}
            for k, v in entry.items():
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    if tuple(v.shape) != tuple(p.shape):
                        raise StateError(f"optimizer state {name}.{k} has shape "
                                         f"{tuple(v.shape)}, the parameter {tuple(p.shape)}")
                    v = v.to(dtype=p.dtype, device="cpu")
                    if isinstance(p, DTensor):
                        # this rank's shard, cut like the parameter's, in its own storage
                        # (AdamW updates it in place)
                        mine = distribute_tensor(v, p.device_mesh, p.placements,
                                                 src_data_rank=None).to_local().clone()
                        v = DTensor.from_local(mine, p.device_mesh, p.placements,
                                               shape=p.shape, stride=p.stride(),
                                               run_check=False)
                    else:
                        v = v.clone()
                elif isinstance(v, torch.Tensor):
                    v = v.clone()
                st[k] = v
            optimizer.state[p] = st
    return len(state["state"])
