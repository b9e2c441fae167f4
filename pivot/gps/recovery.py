"""Rebuilding a lost GPS host (paper sec. 5.1, appendix B.1; the reliability requirement).

A GPS host whose actor died (or whose ``/dev/shm`` arenas are gone, or which came back
empty) is rebuilt into a fresh store with the same layout:

* from the surviving replicas: the lost host is the receiver of every shard its slot
  holds, the other holders of that slot (its replicas in the other groups, appendix B.1)
  are the candidate senders, and the greedy of the communication plan
  (:func:`pivot.gps.greedy.assign`) spreads the shards over them by estimated latency;
* else (a sharded layout with one group: the lost host held the only copy) from a
  checkpoint the caller supplies (:class:`Checkpoint`: the full tensors of the version
  GPS holds);
* else it raises StateError naming the model, the slices and the fixes, before anything
  is installed.

The rebuilt store gets the same version number the surviving hosts hold, so a Read that
pins one version on every host it reads from (:meth:`GlobalParameterStorage._pin`) sees a
whole version. Shards held by a survivor go peer to peer: the rebuilt host pulls them
(``pull``, :func:`pull_shards`) straight into its staged arena, from the peer's shared-
memory arena when that file is visible on its machine (one memcpy), else over NIXL or
Monarch (:class:`PeerTransports`); nothing passes through the caller. Checkpoint shards
come from the caller, which holds the checkpoint. With ``verify`` (the default) every
slice's checksum is checked where it lands, so the rebuilt shards are bit-identical to the
senders' (or to the checkpoint).

A rebuild and a Write exclude each other: the rebuild takes every surviving host's lease
(:meth:`HostStore.lease`), which a host refuses while a Write is in progress on it (the
StateError names model and version), and a host refuses ``begin_write`` while its lease is
held; inside one client the two also share the client's lock, so there one waits for the
other instead.

Usage::

    lost = lost_hosts(gps)                                  # e.g. [3]
    new = ActorHost(3, spawn_host_service("gps3", GPSActor, 3, storage, models))
    report = rebuild_host(gps, 3, new, checkpoints={"policy": Checkpoint(v, state)})
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
import torch

from pivot.errors import ConfigError, StateError
from pivot.gps.greedy import assign
from pivot.gps.layout import ModelMeta, StorageLayout, torch_dtype
from pivot.gps.manifest import Manifest
from pivot.gps.plan import Link, Transfer
from pivot.gps.storage import HostStore
from pivot.gps.transport import MonarchTransport, ShmTransport, Transport

if TYPE_CHECKING:
    from pivot.gps.client import GlobalParameterStorage

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The full tensors (HF names) of one model as of GPS version ``version``."""

    version: int
    state: Mapping[str, torch.Tensor]


@dataclass(frozen=True, slots=True)
class HostShard:
    """One GPS shard a host holds: rows ``[r0, r1)`` of a parameter."""

    param: str
    shard: int
    r0: int
    r1: int
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


@dataclass
class RebuildReport:
    """What :func:`rebuild_host` installed."""

    host: int
    versions: dict[str, int] = field(default_factory=dict)
    """The version installed per model (the one the surviving hosts hold)."""
    senders: dict[str, dict[int, int]] = field(default_factory=dict)
    """Per model rebuilt from replicas: bytes each surviving host sent."""
    from_checkpoint: list[str] = field(default_factory=list)
    nbytes: int = 0
    seconds: float = 0.0


def host_shards(storage: StorageLayout, model: ModelMeta, host: int) -> list[HostShard]:
    """The shards ``host`` holds of ``model`` (slot ``host % k``), in arena order."""
    slot = host % storage.k
    meta = {p.name: p for p in model.params}
    out = []
    for name, sh in storage.param_shards(model.name).items():
        p = meta[name]
        row = p.nbytes // p.shape[0]
        for i, ((a, b), s) in enumerate(zip(sh.rows, sh.slots)):
            if s == slot:
                out.append(HostShard(name, i, a, b, (b - a, *p.shape[1:]), p.dtype,
                                     (b - a) * row))
    return out


def _probe(handle: Any, models: Mapping[str, ModelMeta]) -> dict[str, int | None] | None:
    """Latest version per model on a host, or None when the host does not answer."""
    try:
        return {m: handle.latest(m) for m in models}
    except Exception as e:  # noqa: BLE001 - a dead actor: any error from its endpoint
        logger.info("GPS host %s does not answer: %s", getattr(handle, "index", "?"), e)
        return None


def lost_hosts(gps: GlobalParameterStorage) -> list[int]:
    """Hosts whose store is gone: they do not answer, or hold no version of a model that
    another host holds (an actor restarted empty)."""
    state = {h: _probe(gps.hosts[h], gps.models) for h in range(len(gps.hosts))}
    held = {m for s in state.values() if s for m, v in s.items() if v is not None}
    return [h for h, s in state.items() if s is None or any(s[m] is None for m in held)]


def _full_box(shape: tuple[int, ...]) -> tuple[slice, ...]:
    return (slice(0, shape[0]),) + (slice(None),) * (len(shape) - 1)


def _transfer(s: HostShard) -> Transfer:
    box = _full_box(s.shape)
    return Transfer(s.param, s.shard, box, box, s.nbytes)


def _check_checkpoint(model: str, ck: Checkpoint, meta: ModelMeta, shards: list[HostShard],
                      want: int | None) -> None:
    if want is not None and ck.version != want:
        raise StateError(f"rebuild of {model}: the checkpoint is version {ck.version} but the "
                         f"surviving GPS hosts hold version {want}; a Read would mix the two. "
                         f"Pass the checkpoint of version {want}, or Write a new version of "
                         f"{model} to every host once the host is back")
    full = {p.name: p for p in meta.params}
    for s in shards:
        t = ck.state.get(s.param)
        p = full[s.param]
        if t is None:
            raise ConfigError(f"rebuild of {model}: the checkpoint lacks parameter {s.param} "
                              f"(shape {p.shape}); pass the model's full state dict")
        if tuple(t.shape) != p.shape or t.dtype != torch_dtype(p.dtype):
            raise ConfigError(f"rebuild of {model}: checkpoint[{s.param!r}] is "
                              f"{tuple(t.shape)} {t.dtype}, GPS holds {p.shape} {p.dtype}; "
                              f"pass the full (unsharded) tensors of that model")


@dataclass
class _Source:
    """Where one model's shards for the rebuilt host come from."""

    model: str
    version: int
    shards: list[HostShard]
    senders: dict[int, list[HostShard]] = field(default_factory=dict)
    checkpoint: Checkpoint | None = None


def _sources(gps: GlobalParameterStorage, host: int,
             checkpoints: Mapping[str, Checkpoint]) -> list[_Source]:
    """Decides, before anything is installed, where every model's shards come from."""
    st = gps.planner.storage
    others = {h: _probe(gps.hosts[h], gps.models) for h in range(st.hosts) if h != host}
    alive = {h: v for h, v in others.items() if v is not None}
    out = []
    for name, meta in gps.models.items():
        shards = host_shards(st, meta, host)
        held = [v[name] for v in alive.values() if v[name] is not None]
        want = max(held) if held else None
        holders = [h for h in st.holders(host % st.k) if h != host]
        senders = [h for h in holders if h in alive and alive[h][name] == want
                   and want is not None]
        ck = checkpoints.get(name)
        if want is None and ck is None:
            logger.info("rebuild of GPS host %d: no host holds %s, nothing to restore",
                        host, name)
            continue
        if not shards:
            out.append(_Source(name, want if want is not None else ck.version, shards))
            continue
        if senders:
            out.append(_Source(name, want, shards, _plan_senders(gps, host, shards, senders)))
            continue
        if ck is not None:
            _check_checkpoint(name, ck, meta, shards, want)
            out.append(_Source(name, ck.version, shards, checkpoint=ck))
            continue
        dead = [h for h in holders if h not in alive]
        stale = {h: alive[h][name] for h in holders if h in alive}
        names = ", ".join(f"{s.param}[{s.r0}:{s.r1}]" for s in shards[:4])
        more = f" and {len(shards) - 4} more" if len(shards) > 4 else ""
        raise StateError(
            f"cannot rebuild GPS host {host}: model {name!r} version {want} has "
            f"{len(shards)} slices ({names}{more}; {sum(s.nbytes for s in shards)} bytes) "
            f"that no surviving host holds (other holders of slot {host % st.k}: "
            f"{holders or 'none, the layout keeps one copy'}; dead {dead}, at other "
            f"versions {stale}) and no checkpoint was given. Pass checkpoints="
            f"{{{name!r}: Checkpoint({want}, full_state)}} from the last checkpoint of that "
            f"version, or re-load the model into GPS (load / a fresh Write to all hosts)")
    return out


def _plan_senders(gps: GlobalParameterStorage, host: int, shards: list[HostShard],
                  senders: list[int]) -> dict[int, list[HostShard]]:
    """The plan's greedy with the rebuilt host as the one receiver of every shard and the
    surviving holders as candidate senders (appendix B.2, step 2)."""
    n = len(shards)
    st = gps.planner.storage
    nbytes = np.array([s.nbytes for s in shards], dtype=np.int64)
    zeros = np.zeros(n, dtype=np.int64)
    sender, *_ = assign(nbytes, zeros, np.full(n, host, dtype=np.int64), zeros,
                        [np.array(senders, dtype=np.int64)], np.arange(st.hosts, dtype=np.int64),
                        st.hosts, gps.planner.links, True)
    out: dict[int, list[HostShard]] = {}
    for s, g in zip(shards, sender.tolist()):
        out.setdefault(g, []).append(s)
    return out


class PeerTransports:
    """How a rebuilt host reaches a peer: the peer's arena mapped from ``/dev/shm`` when the
    file is visible here (the same machine) and ``shm``, else ``remote`` (default NIXL, else
    Monarch)."""

    def __init__(self, remote: Transport | None = None, shm: bool = True) -> None:
        self.shm = ShmTransport(threads=1) if shm else None
        self.remote = remote

    def __call__(self, manifest: Manifest) -> Transport:
        if self.shm is not None and os.path.exists(manifest.path):
            return self.shm
        if self.remote is None:
            try:
                from pivot.gps.nixl import NixlTransport

                self.remote = NixlTransport()
            except Exception as e:  # noqa: BLE001 - no nixl wheel, or UCX cannot start
                logger.warning("NIXL unavailable (%s); the rebuild pulls over Monarch", e)
                self.remote = MonarchTransport()
        return self.remote


def pull_shards(store: HostStore, model: str, version: int,
                sources: list[tuple[Any, list[HostShard]]], transport, verify: bool) -> int:
    """Fills ``version`` of ``model`` in ``store`` from peers and installs it; runs on the
    rebuilt host. ``sources``: (peer handle, the shards it sends); ``transport(manifest)``
    picks the path to a peer. Returns the bytes pulled."""
    staged = store.begin_write(model, version, initial=True)
    views = staged.views(store.arena(model, version, staged=True)[1])
    nbytes = 0
    try:
        for peer, shards in sources:
            if len({s.param for s in shards}) != len(shards):
                raise StateError(f"rebuild of {model}: host {peer.index} sends two shards of "
                                 f"one parameter; the GPS layout gives a host one shard per "
                                 f"parameter")
            pinned = peer.acquire(model, version)
            try:
                dst = {s.param: views[(s.param, s.shard)] for s in shards}
                transport(pinned).read(peer, pinned, [_transfer(s) for s in shards], dst,
                                       verify)
            finally:
                peer.release(model, pinned.version)
            nbytes += sum(s.nbytes for s in shards)
        store.commit(model, version)
    except BaseException:
        store.abort(model, version)
        raise
    return nbytes


def _lease(gps: GlobalParameterStorage, host: int, holder: str) -> list[int]:
    """Takes the lease of every surviving host that answers; on a refusal (a Write in
    progress) gives the taken ones back and raises the host's StateError."""
    taken: list[int] = []
    alive = {h: s for h in range(len(gps.hosts)) if h != host
             and (s := _probe(gps.hosts[h], gps.models)) is not None}
    # what any survivor published: a dead writer's installed Write is resolved with it
    published = {m: max((s[m] for s in alive.values() if s[m] is not None), default=None)
                 for m in gps.models}
    for h in alive:
        try:
            gps.hosts[h].lease(holder, published=published)
        except Exception:
            _end_lease(gps, taken, holder)
            raise
        taken.append(h)
    return taken


def _end_lease(gps: GlobalParameterStorage, hosts: list[int], holder: str) -> None:
    for h in hosts:
        try:
            gps.hosts[h].end_lease(holder)
        except Exception as e:  # noqa: BLE001 - it died meanwhile; its lease went with it
            logger.warning("GPS host %d: end of lease %r failed: %s", h, holder, e)


def rebuild_host(gps: GlobalParameterStorage, host: int, replacement: Any, *,
                 checkpoints: Mapping[str, Checkpoint] | None = None, via_device: int = 0,
                 verify: bool = True) -> RebuildReport:
    """Rebuilds GPS host ``host`` into ``replacement`` and swaps it into the client.

    Args:
        gps: the client whose host ``host`` is lost.
        host: the lost host's index.
        replacement: a handle on a fresh, empty store for that host with the same GPS layout
            (:class:`~pivot.gps.actor.ActorHost` of a respawned ``GPSActor``; tests pass
            ``pivot.testing.gps.LocalHost`` of a new ``HostStore``).
        checkpoints: per model, the full tensors of the version GPS holds; used only for
            shards no surviving host holds.
        via_device: the pool device whose host stands for the caller's location (picks the
            transport that carries checkpoint shards to the replacement).
        verify: check every slice's checksum where it lands (default on).
    Raises:
        StateError: some shard has neither a surviving holder nor a checkpoint, or a
            checkpoint's version differs from the survivors'; nothing is installed. Also
            when a Write (of another client) is in progress on a surviving host: the
            message names its model and version; retry once it ends.
        ConfigError: the replacement is not for ``host`` or not empty, or a checkpoint
            lacks a parameter or has the wrong shape.
    """
    t0 = time.perf_counter()
    st = gps.planner.storage
    if not 0 <= host < st.hosts:
        raise ConfigError(f"rebuild: host {host} outside the GPS layout's {st.hosts} hosts")
    if getattr(replacement, "index", host) != host:
        raise ConfigError(f"rebuild: the replacement store is for host {replacement.index}, "
                          f"not {host}; create it with HostStore({host}, ...)")
    have = {m: v for m, v in (_probe(replacement, gps.models) or {}).items() if v is not None}
    if have:
        raise ConfigError(f"rebuild of GPS host {host}: the replacement store already holds "
                          f"{have}; pass a fresh, empty store")
    holder = f"the rebuild of GPS host {host}"
    with gps.lock:  # a Write of this client waits; other clients' Writes are refused
        leased = _lease(gps, host, holder)
        try:
            report = _rebuild(gps, host, replacement, dict(checkpoints or {}), via_device,
                              verify)
        finally:
            _end_lease(gps, leased, holder)
    report.seconds = time.perf_counter() - t0
    logger.info("rebuilt GPS host %d: %s (%.1f MB in %.3f s; from checkpoint: %s)", host,
                report.versions, report.nbytes / 1e6, report.seconds, report.from_checkpoint)
    return report


def _rebuild(gps: GlobalParameterStorage, host: int, replacement: Any,
             checkpoints: Mapping[str, Checkpoint], via_device: int,
             verify: bool) -> RebuildReport:
    sources = _sources(gps, host, checkpoints)
    report = RebuildReport(host)
    here = int(gps.planner.device_host[via_device])
    put = gps.transports[Link.LOCAL if replacement.index == here else Link.REMOTE]
    for src in sources:
        if src.senders:  # peer to peer: the rebuilt host pulls from the survivors
            replacement.pull(src.model, src.version,
                             [(gps.hosts[g], ss) for g, ss in src.senders.items()], verify)
            report.senders[src.model] = {g: sum(s.nbytes for s in ss)
                                         for g, ss in src.senders.items()}
        else:  # from the caller's checkpoint (or nothing to hold)
            staged = replacement.begin_write(src.model, src.version, initial=True)
            try:
                expected = []
                if src.checkpoint is not None:
                    rows = {s.param: src.checkpoint.state[s.param][s.r0:s.r1]
                            for s in src.shards}
                    expected = put.write(replacement, staged,
                                         [_transfer(s) for s in src.shards], rows, verify)
                    report.from_checkpoint.append(src.model)
            except BaseException:
                replacement.abort(src.model, src.version)
                raise
            replacement.commit(src.model, src.version, expected)
        report.versions[src.model] = src.version
        report.nbytes += sum(s.nbytes for s in src.shards)
    gps.hosts[host] = replacement
    for t in gps.transports.values():
        t.forget_host(host)
    return report
