"""Hypothesis strategies for property tests (tests only; see ``pivot.testing``).

Needs hypothesis, which the ``test`` extra installs (``pip install .[test]``); the other
``pivot.testing`` modules do not import this one.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from pivot.gps.layout import ModelMeta, ParallelLayout, ParamMeta
from pivot.testing.gps import layout_for


@dataclass
class GPSSetup:
    """A random GPS case: a model and its split dims, a caller layout P over ``devices``
    of a pool (``device_host``), and GPS on ``hosts`` hosts in groups of ``k``."""

    model: ModelMeta
    split: dict
    layout: ParallelLayout
    hosts: int
    k: int
    device_host: tuple[int, ...]
    devices: tuple[int, ...]


@st.composite
def gps_models(draw, tp: int, pp: int, name: str = "policy"):
    """A small model whose split dims TP divides; layers >= PP. Draws (model, split,
    owners): ``owners`` maps the parameters one TP rank holds whole (EP's experts)."""
    params, split, owners = [], {}, {}

    def add(pname, shape, d):
        params.append(ParamMeta(pname, shape))
        split[pname] = d

    add("model.embed_tokens.weight", (tp * draw(st.integers(1, 4)), draw(st.integers(1, 4))), 0)
    for i in range(draw(st.integers(pp, 3))):
        for j in range(draw(st.integers(1, 2))):
            kind = draw(st.sampled_from(["col", "row", "rep1", "rep2", "col3", "own"]))
            n = f"model.layers.{i}.p{j}.weight"
            if kind == "col":
                add(n, (tp * draw(st.integers(1, 4)), draw(st.integers(1, 6))), 0)
            elif kind == "row":
                add(n, (draw(st.integers(1, 10)), tp * draw(st.integers(1, 3))), 1)
            elif kind == "col3":
                add(n, (draw(st.integers(1, 5)), 2, tp * draw(st.integers(1, 2))), 2)
            elif kind == "own":
                add(n, (draw(st.integers(1, 10)), draw(st.integers(1, 5))), None)
                owners[n] = draw(st.integers(0, tp - 1))
            elif kind == "rep1":
                add(n, (draw(st.integers(1, 10)),), None)
            else:
                add(n, (draw(st.integers(1, 10)), draw(st.integers(1, 5))), None)
    add("model.norm.weight", (draw(st.integers(1, 6)),), None)
    return ModelMeta(name, tuple(params)), split, owners


@st.composite
def gps_setups(draw) -> GPSSetup:
    """A ``GPSSetup``: TP 1-3, PP 1-2, DP 1-2, 1-4 hosts, a pool of up to 2 spare devices."""
    tp = draw(st.sampled_from([1, 2, 3]))
    pp = draw(st.integers(1, 2))
    dp = draw(st.integers(1, 2))
    model, split, owners = draw(gps_models(tp, pp))
    hosts = draw(st.integers(1, 4))
    k = draw(st.sampled_from([d for d in range(1, hosts + 1) if hosts % d == 0]))
    world = dp * tp * pp
    pool = world + draw(st.integers(0, 2))
    device_host = tuple(draw(st.lists(st.integers(0, hosts - 1), min_size=pool,
                                      max_size=pool)))
    devices = tuple(draw(st.permutations(range(pool)))[:world])
    return GPSSetup(model, split, layout_for(model, split, dp, tp, pp, owners), hosts, k,
                    device_host, devices)
