"""Shared builders for the GPS tests: random small models, layouts and pools."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st

from pivot.gps.layout import ModelMeta, ParallelLayout, ParamMeta, _shard_models, plan_storage


@dataclass
class Setup:
    model: ModelMeta
    split: dict
    layout: ParallelLayout
    hosts: int
    k: int
    device_host: tuple[int, ...]
    devices: tuple[int, ...]


def layout_for(model: ModelMeta, split: dict, dp: int, tp: int, pp: int) -> ParallelLayout:
    return ParallelLayout(dp, tp, pp, tuple((p.name, split[p.name]) for p in model.params))


@st.composite
def models(draw, tp: int, pp: int, name: str = "policy"):
    """A small model whose split dims TP divides; layers >= PP."""
    params, split = [], {}

    def add(pname, shape, d):
        params.append(ParamMeta(pname, shape))
        split[pname] = d

    add("model.embed_tokens.weight", (tp * draw(st.integers(1, 4)), draw(st.integers(1, 4))), 0)
    for i in range(draw(st.integers(pp, 3))):
        for j in range(draw(st.integers(1, 2))):
            kind = draw(st.sampled_from(["col", "row", "rep1", "rep2", "col3"]))
            n = f"model.layers.{i}.p{j}.weight"
            if kind == "col":
                add(n, (tp * draw(st.integers(1, 4)), draw(st.integers(1, 6))), 0)
            elif kind == "row":
                add(n, (draw(st.integers(1, 10)), tp * draw(st.integers(1, 3))), 1)
            elif kind == "col3":
                add(n, (draw(st.integers(1, 5)), 2, tp * draw(st.integers(1, 2))), 2)
            elif kind == "rep1":
                add(n, (draw(st.integers(1, 10)),), None)
            else:
                add(n, (draw(st.integers(1, 10)), draw(st.integers(1, 5))), None)
    add("model.norm.weight", (draw(st.integers(1, 6)),), None)
    return ModelMeta(name, tuple(params)), split


def storage_with_k(model_list, hosts: int, k: int):
    """The GPS layout plan_storage picks for a budget that exactly fits groups of k."""
    _, load = _shard_models(model_list, k, 0)
    return plan_storage(model_list, hosts, int(load.max()), min_split_bytes=0)


@st.composite
def setups(draw):
    tp = draw(st.sampled_from([1, 2, 3]))
    pp = draw(st.integers(1, 2))
    dp = draw(st.integers(1, 2))
    model, split = draw(models(tp, pp))
    hosts = draw(st.integers(1, 4))
    k = draw(st.sampled_from([d for d in range(1, hosts + 1) if hosts % d == 0]))
    world = dp * tp * pp
    pool = world + draw(st.integers(0, 2))
    device_host = tuple(draw(st.lists(st.integers(0, hosts - 1), min_size=pool,
                                      max_size=pool)))
    devices = tuple(draw(st.permutations(range(pool)))[:world])
    return Setup(model, split, layout_for(model, split, dp, tp, pp), hosts, k, device_host,
                 devices)


def random_state(model: ModelMeta, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {p.name: torch.randn(p.shape, generator=g) for p in model.params}


def shard_of(full: dict, layout: ParallelLayout, rank: int, stage_of) -> dict:
    """What device ``rank`` must hold under ``layout``: chunks of the full tensors."""
    _, stage, t = layout.coords(rank)
    split = dict(layout.split_dims)
    out = {}
    for name, x in full.items():
        if stage_of(name) != stage:
            continue
        d = split.get(name)
        out[name] = x if d is None else x.chunk(layout.tp, d)[t]
    return out


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)
