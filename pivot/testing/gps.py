"""GPS stand-ins and builders (tests and benchmarks only; see ``pivot.testing``).

``LocalHost`` is the host handle of ``pivot.gps.actor.ActorHost`` over an in-process
``HostStore`` (no Monarch actor), so a ``GlobalParameterStorage`` client can run on stores
of this process. The rest builds what GPS tests and benchmarks feed it: random states of
a model, the shard a device must hold, and the storage layout for a group size ``k``.
Hypothesis strategies of random models and pools are in ``pivot.testing.strategies``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from pivot.errors import StateError
from pivot.gps.actor import HOST_OPS, nixl_expose
from pivot.gps.client import GlobalParameterStorage
from pivot.gps.layout import (ModelMeta, ParallelLayout, StorageLayout, _shard_models,
                              param_stage, plan_storage, qwen3_model)
from pivot.gps.plan import Link
from pivot.gps.recovery import PeerTransports, pull_shards
from pivot.gps.storage import HostStore
from pivot.gps.transport import MonarchTransport, ShmTransport, Transport

SMALL_POLICY = qwen3_model("policy", layers=2, hidden=64, intermediate=128, heads=4,
                           kv_heads=2, head_dim=16, vocab=96)
"""A small Qwen3-shaped policy (HF names): 2 layers, hidden 64, TP up to 2."""
SMALL_GENRM = qwen3_model("genrm", layers=2, hidden=32, intermediate=64, heads=2, kv_heads=1,
                          head_dim=16, vocab=96)
"""A smaller Qwen3-shaped GenRM beside ``SMALL_POLICY``."""
SMALL_MODELS = {"policy": SMALL_POLICY, "genrm": SMALL_GENRM}


class LocalHost:
    """The same handle on an in-process :class:`HostStore` (no actor). ``peers`` is how
    its :meth:`pull` reaches other hosts (default :class:`PeerTransports`)."""

    def __init__(self, store: HostStore, peers: "PeerTransports | None" = None) -> None:
        self.index, self.store = store.host, store
        self._nixl = None
        self.peers = peers

    def pull(self, model: str, version: int, sources: list, verify: bool = True) -> int:
        if self.peers is None:
            self.peers = PeerTransports()
        return pull_shards(self.store, model, version, sources, self.peers, verify)

    def load_shards(self, model: str, version: int, folder: str) -> int:
        from pivot.gps.checkpoint import fill_host

        return fill_host(self.store, model, version, folder)

    def nixl_expose(self, model: str, version: int, staged: bool = False):
        self._nixl = nixl_expose(self.store, self._nixl, model, version, staged)
        return self._nixl[1]

    def __getattr__(self, op: str):
        if op not in HOST_OPS:
            raise AttributeError(op)
        return getattr(self.store, op)


def layout_for(model: ModelMeta, split: dict, dp: int, tp: int, pp: int,
               owners: dict | None = None) -> ParallelLayout:
    """DP x TP x PP over ``model``, each parameter split on ``split[name]`` (None: replicated),
    those in ``owners`` held whole by that TP rank alone."""
    return ParallelLayout(dp, tp, pp, tuple((p.name, split[p.name]) for p in model.params),
                          tuple((p.name, owners[p.name]) for p in model.params
                                if p.name in (owners or {})))


def storage_with_k(model_list, hosts: int, k: int) -> StorageLayout:
    """The GPS layout plan_storage picks for a budget that exactly fits groups of k."""
    _, load = _shard_models(model_list, k, 0)
    return plan_storage(model_list, hosts, int(load.max()), min_split_bytes=0)


def random_state(model: ModelMeta, seed: int) -> dict[str, torch.Tensor]:
    """Standard-normal tensors of every parameter of ``model`` (fp32), from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return {p.name: torch.randn(p.shape, generator=g) for p in model.params}


def shard_of(full: dict, layout: ParallelLayout, rank: int, stage_of) -> dict:
    """What device ``rank`` must hold under ``layout``: chunks of the full tensors."""
    _, stage, t = layout.coords(rank)
    split = dict(layout.split_dims)
    out = {}
    for name, x in full.items():
        if stage_of(name) != stage or not layout.holds(name, t):
            continue
        d = split.get(name)
        out[name] = x if d is None else x.chunk(layout.tp, d)[t]
    return out


def local_gps(models: Mapping[str, ModelMeta], storage: StorageLayout,
              device_host: Sequence[int], transports: Mapping[Link, Transport] | None = None
              ) -> tuple[GlobalParameterStorage, list[HostStore]]:
    """A GPS client on in-process stores (one ``LocalHost`` per host); remote links go
    through the Monarch transport's code (host.get / host.put), so no NIXL agent starts.
    Returns (client, stores); ``close_gps`` ends both."""
    stores = [HostStore(h, storage, models) for h in range(storage.hosts)]
    transports = transports or {Link.LOCAL: ShmTransport(), Link.REMOTE: MonarchTransport()}
    gps = GlobalParameterStorage([LocalHost(s) for s in stores], models, storage,
                                 device_host, transports=transports)
    return gps, stores


def close_gps(gps: GlobalParameterStorage, stores: Sequence[HostStore]) -> None:
    gps.close()
    for s in stores:
        s.close()


def expected_shard(full: dict, model: ModelMeta, layout: ParallelLayout, rank: int) -> dict:
    """``shard_of`` with ``model``'s own stage of every parameter under ``layout.pp``."""
    return shard_of(full, layout, rank,
                    lambda n: param_stage(next(p for p in model.params if p.name == n),
                                          model.num_layers, layout.pp))


class DeadHost:
    """The handle of a host whose actor died: every endpoint fails."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __getattr__(self, op: str):
        def call(*a, **k):
            raise StateError(f"GPS host {self.index}: {op} failed: actor is dead")
        return call


def kill_host(gps: GlobalParameterStorage, stores: Sequence[HostStore], h: int) -> None:
    """Host ``h``'s actor dies and its arena files go with it."""
    stores[h].close()
    gps.hosts[h] = DeadHost(h)
