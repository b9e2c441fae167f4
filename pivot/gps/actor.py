"""GPS as actors: one :class:`GPSActor` per host, one client (paper sec. 5.1, app. B).

The client :class:`GlobalParameterStorage` exposes exactly Read(M, G, P) and
Write(M, G, P). It computes (and caches) the plan with :class:`pivot.gps.plan.Planner`,
pins one version on every host it reads from, and drives each (host, device) pair of the
plan through the transport of its link type: host-local links through
:class:`~pivot.gps.transport.ShmTransport` (one memcpy out of the host's ``/dev/shm``
arena: the fastest path here), remote links through the transport given for
``Link.REMOTE`` (default :class:`~pivot.gps.transport.MonarchTransport`; NIXL plugs in the
same way, see :mod:`pivot.gps.nixl`).

The receiving (Read) or sending (Write) process is the caller of the client: in the local
driver each device slot, or the controller on its behalf.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import Any, Mapping, Sequence

import torch
from monarch.actor import Actor, endpoint

from pivot.errors import ConfigError, StateError
from pivot.gps.layout import ModelMeta, ParallelLayout, StorageLayout, torch_dtype
from pivot.gps.plan import Link, LinkProfile, Plan, Planner
from pivot.gps.recovery import RebuildReport, rebuild_host
from pivot.gps.storage import HostStore, Manifest
from pivot.gps.transport import LazyTransport, MonarchTransport, ShmTransport, Transport
from pivot.types import GENRM

logger = logging.getLogger(__name__)

StateDicts = Mapping[int, Mapping[str, torch.Tensor]]
"""Per device id: parameter name -> the shard of it that device holds under ``P``."""


class GPSActor(Actor):
    """The GPS store of one host; every endpoint unpacks and calls :class:`HostStore`."""

    def __init__(self, host: int, storage: StorageLayout, models: Mapping[str, ModelMeta],
                 shm_dir: str = "/dev/shm") -> None:
        self.store = HostStore(host, storage, models, shm_dir)
        self._nixl = None

    @endpoint
    def nixl_expose(self, model: str, version: int, staged: bool = False) -> tuple[bytes, int]:
        self._nixl = nixl_expose(self.store, self._nixl, model, version, staged)
        return self._nixl[1]

    @endpoint
    def checksums(self, model: str, version: int, items: list) -> list[int]:
        return self.store.checksums(model, version, items)

    @endpoint
    def begin_write(self, model: str, version: int, initial: bool = False) -> Manifest:
        return self.store.begin_write(model, version, initial=initial)

    @endpoint
    def put(self, model: str, version: int, items: list) -> None:
        self.store.put(model, version, items)

    @endpoint
    def commit(self, model: str, version: int, expected: list) -> None:
        self.store.commit(model, version, expected)

    @endpoint
    def abort(self, model: str, version: int) -> None:
        self.store.abort(model, version)

    @endpoint
    def latest(self, model: str) -> int | None:
        return self.store.latest(model)

    @endpoint
    def acquire(self, model: str, version: int | None = None) -> Manifest:
        return self.store.acquire(model, version)

    @endpoint
    def release(self, model: str, version: int) -> None:
        self.store.release(model, version)

    @endpoint
    def get(self, model: str, version: int, items: list) -> list:
        return self.store.get(model, version, items)

    @endpoint
    def versions(self, model: str) -> list[int]:
        return self.store.versions(model)

    @endpoint
    def close(self) -> None:
        self.store.close()


_HOST_OPS = ("begin_write", "put", "commit", "abort", "latest", "acquire", "release", "get",
             "versions", "close", "nixl_expose", "checksums")


def nixl_expose(store: HostStore, endpoint, model: str, version: int, staged: bool):
    """Registers a version's arena with the host's NIXL agent (created on first use).
    Returns ``(endpoint, (agent metadata, arena base address))``."""
    from pivot.gps.nixl import NixlHostEndpoint

    if endpoint is None:
        endpoint = NixlHostEndpoint(store.host)
    else:
        endpoint = endpoint[0]
    man, arena, live = store.arena(model, version, staged)
    return endpoint, endpoint.expose(man.path, arena, live)


class ActorHost:
    """A blocking handle on one host's :class:`GPSActor` (a single-rank actor mesh)."""

    def __init__(self, index: int, actor: Any) -> None:
        self.index, self._actor = index, actor

    def __getattr__(self, op: str):
        if op not in _HOST_OPS:
            raise AttributeError(op)
        ep = getattr(self._actor, op)

        def call(*args, **kwargs):
            try:
                return ep.call_one(*args, **kwargs).get()
            except Exception as e:
                # Monarch wraps the actor's error (ActorError.exception): re-raise its type
                # and message so callers see the same errors as in-process.
                inner = getattr(e, "exception", None)
                if isinstance(inner, (StateError, ConfigError)):
                    raise type(inner)(str(inner)) from e
                raise StateError(f"GPS host {self.index}: {op} failed: {e}") from e
        return call


class LocalHost:
    """The same handle on an in-process :class:`HostStore` (no actor)."""

    def __init__(self, store: HostStore) -> None:
        self.index, self.store = store.host, store
        self._nixl = None

    def nixl_expose(self, model: str, version: int, staged: bool = False):
        self._nixl = nixl_expose(self.store, self._nixl, model, version, staged)
        return self._nixl[1]

    def __getattr__(self, op: str):
        if op not in _HOST_OPS:
            raise AttributeError(op)
        return getattr(self.store, op)


def default_transports() -> dict[Link, Transport]:
    """Shared memory for host-local links; NIXL for remote links (measured here 0.35-0.4
    GB/s inside Monarch actors on a busy machine, against 0.08-0.1 GB/s for Monarch
    endpoint arguments), falling back to Monarch if a NIXL agent cannot start. The NIXL
    agent starts on the first remote transfer only."""
    return {Link.LOCAL: ShmTransport(), Link.REMOTE: LazyTransport(_remote_transport)}


def _remote_transport() -> Transport:
    try:
        from pivot.gps.nixl import NixlTransport

        return NixlTransport()
    except Exception as e:  # no nixl wheel, or UCX cannot start
        logger.warning("NIXL unavailable (%s); remote GPS links use Monarch", e)
        return MonarchTransport()


class GlobalParameterStorage:
    """The GPS client: Read(M, G, P) and Write(M, G, P) (sec. 5.1).

    Args:
        hosts: one handle per GPS host, in host order (:class:`ActorHost` or
            :class:`LocalHost`).
        models: the models GPS holds, by name.
        storage: the GPS layout.
        device_host: host index of every device of the pool.
        links: link costs for planning.
        transports: the transport per link type (default: :func:`default_transports`).
    """

    def __init__(self, hosts: Sequence[Any], models: Mapping[str, ModelMeta],
                 storage: StorageLayout, device_host: Sequence[int],
                 links: LinkProfile = LinkProfile(),
                 transports: Mapping[Link, Transport] | None = None) -> None:
        if len(hosts) != storage.hosts:
            raise ConfigError(f"GlobalParameterStorage: {len(hosts)} host handles for a GPS "
                              f"layout of {storage.hosts} hosts; pass one per host")
        self.hosts = list(hosts)
        self.models = dict(models)
        self.planner = Planner(models, storage, device_host, links)
        self._dtypes = {n: {p.name: torch_dtype(p.dtype) for p in m.params}
                        for n, m in self.models.items()}
        self.transports = dict(transports or default_transports())
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gps-write")

    # --- Read ----------------------------------------------------------------------------
    def read(self, model: str, devices: Sequence[int], layout: ParallelLayout, *,
             version: int | None = None, verify: bool = False,
             out: StateDicts | None = None) -> dict[int, dict[str, torch.Tensor]]:
        """Read(M, G, P): the shard of every parameter each device holds under ``P``.

        Args:
            version: the version to read (default: the latest).
            verify: check every slice's checksum after it lands.
            out: optional preallocated per-device buffers to fill instead of new tensors.
        Returns:
            ``{device: {param name: tensor}}``, one entry per device of ``devices``.
        """
        plan = self.planner.read(model, devices, layout)
        groups = plan.transfers()
        dst = self._buffers(plan, out)
        hosts = sorted({h for h, _ in groups})
        pinned = self._pin(model, hosts, version)
        try:
            for (h, r), ts in groups.items():
                link = Link.LOCAL if self.planner.device_host[plan.devices[r]] == h \
                    else Link.REMOTE
                self.transports[link].read(self.hosts[h], pinned[h], ts, dst[r], verify)
        finally:
            for h, man in pinned.items():
                self.hosts[h].release(model, man.version)
        return {plan.devices[r]: d for r, d in dst.items()}

    def _buffers(self, plan: Plan, out: StateDicts | None) -> dict[int, dict[str, torch.Tensor]]:
        dtypes = self._dtypes[plan.model.name]
        dst = {}
        for r, dev in enumerate(plan.devices):
            shapes = plan.target_shapes(r)
            if out is not None:
                self._check_state(plan, r, out, "out")
                dst[r] = {k: out[dev][k] for k in shapes}
            else:
                dst[r] = {k: torch.empty(s, dtype=dtypes[k]) for k, s in shapes.items()}
        return dst

    def _pin(self, model: str, hosts: Sequence[int], version: int | None,
             tries: int = 50) -> dict[int, Manifest]:
        """Pins one common version on every host (a commit may be half-way across hosts)."""
        for _ in range(tries):
            pinned: dict[int, Manifest] = {}
            try:
                for h in hosts:
                    pinned[h] = self.hosts[h].acquire(model, version)
            except Exception:
                for h, man in pinned.items():
                    self.hosts[h].release(model, man.version)
                raise
            if version is not None or len({m.version for m in pinned.values()}) <= 1:
                return pinned
            for h, man in pinned.items():
                self.hosts[h].release(model, man.version)
            time.sleep(0.001)
        raise StateError(f"GPS: hosts {list(hosts)} did not agree on a version of {model} "
                         f"after {tries} tries; is a Write stuck half-way?")

    # --- Write ---------------------------------------------------------------------------
    def write(self, model: str, devices: Sequence[int], layout: ParallelLayout,
              states: StateDicts, *, verify: bool = False, _initial: bool = False) -> int:
        """Write(M, G, P): installs the devices' shards as the next version of ``model``.

        Args:
            states: ``{device: {param name: shard}}`` for every device of ``devices``.
            verify: the hosts check every slice's checksum before installing.
        Returns:
            the new version number (monotonically increasing per model).
        """
        if model == GENRM and not _initial:
            raise StateError(f"Write(M={GENRM!r}) is not allowed: the GenRM is frozen "
                             f"(sec. 5.1); load it once with load()")
        plan = self.planner.write(model, devices, layout)
        for r in range(len(plan.devices)):
            self._check_state(plan, r, states, "states")
        groups = plan.transfers()
        latest = [self.hosts[h].latest(model) for h in range(len(self.hosts))]
        version = 0 if all(v is None for v in latest) else max(
            v for v in latest if v is not None) + 1
        staged: dict[int, Manifest] = {}
        try:
            for h in range(len(self.hosts)):
                staged[h] = self.hosts[h].begin_write(model, version, initial=_initial)
            expected: dict[int, list] = {h: [] for h in staged}
            for (h, r), ts in groups.items():
                link = Link.LOCAL if self.planner.device_host[plan.devices[r]] == h \
                    else Link.REMOTE
                src = states[plan.devices[r]]
                expected[h] += self.transports[link].write(self.hosts[h], staged[h], ts, src,
                                                           verify)
        except Exception:
            for h in staged:
                self.hosts[h].abort(model, version)
            raise
        for h in staged:
            self.hosts[h].commit(model, version, expected[h])
        return version

    def write_async(self, model: str, devices: Sequence[int], layout: ParallelLayout,
                    states: StateDicts, *, verify: bool = False
                    ) -> concurrent.futures.Future[int]:
        """Write in the background so it overlaps the next training step (sec. 5.1).

        The caller must not modify ``states`` in place (e.g. by an optimizer step) before
        the future resolves. Input errors are raised here, before anything runs.
        """
        if model == GENRM:
            raise StateError(f"Write(M={GENRM!r}) is not allowed: the GenRM is frozen")
        plan = self.planner.write(model, devices, layout)
        for r in range(len(plan.devices)):
            self._check_state(plan, r, states, "states")
        return self._pool.submit(self.write, model, devices, layout, states, verify=verify)

    def load(self, model: str, state: Mapping[str, torch.Tensor], device: int = 0) -> int:
        """Installs full tensors (a checkpoint) as the first version; the GenRM's only way
        in. ``device`` is the pool device whose host stands for the caller's location."""
        meta = self.models.get(model)
        if meta is None:
            raise ConfigError(f"GPS holds no model {model!r}")
        layout = ParallelLayout.create(meta, dp=1, tp=1, pp=1)
        return self.write(model, (device,), layout, {device: state}, _initial=True)

    def rebuild(self, host: int, replacement: Any, **kwargs: Any) -> RebuildReport:
        """Rebuilds lost host ``host`` into ``replacement`` from its surviving replicas or a
        checkpoint, same version (:func:`pivot.gps.recovery.rebuild_host`)."""
        return rebuild_host(self, host, replacement, **kwargs)

    def latest(self, model: str) -> int | None:
        vs = {self.hosts[h].latest(model) for h in range(len(self.hosts))}
        return min((v for v in vs if v is not None), default=None)

    def _check_state(self, plan: Plan, r: int, states: StateDicts, what: str) -> None:
        dev = plan.devices[r]
        if dev not in states:
            raise ConfigError(f"{plan.model.name}: {what} has no entry for device {dev}; "
                              f"pass one state dict per device of G")
        sd = states[dev]
        for name, shape in plan.target_shapes(r).items():
            t = sd.get(name)
            if t is None:
                raise ConfigError(f"{plan.model.name}: {what}[{dev}] lacks parameter {name} "
                                  f"(shape {shape} under P)")
            dtype = self._dtypes[plan.model.name][name]
            if tuple(t.shape) != shape or t.dtype != dtype:
                raise ConfigError(f"{plan.model.name}: {what}[{dev}][{name}] is "
                                  f"{tuple(t.shape)} {t.dtype}, expected {shape} "
                                  f"{dtype} under DP={plan.layout.dp} "
                                  f"TP={plan.layout.tp} PP={plan.layout.pp}")

    def close(self) -> None:
        self._pool.shutdown(wait=True)
