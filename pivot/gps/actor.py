"""GPS as actors: one :class:`GPSActor` per host and its blocking handle
:class:`ActorHost` (paper sec. 5.1, app. B). The client that drives them, Read(M, G, P)
and Write(M, G, P), is :class:`pivot.gps.client.GlobalParameterStorage`.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

from monarch.actor import Actor, endpoint

from pivot.errors import ConfigError, StateError
from pivot.gps.layout import ModelMeta, StorageLayout
from pivot.gps.lease import DEFAULT_TTL_S
from pivot.gps.manifest import Manifest
from pivot.gps.recovery import PeerTransports, pull_shards
from pivot.gps.storage import HostStore

logger = logging.getLogger(__name__)



class GPSActor(Actor):
    """The GPS store of one host; every endpoint unpacks and calls :class:`HostStore`."""

    def __init__(self, host: int, storage: StorageLayout, models: Mapping[str, ModelMeta],
                 shm_dir: str = "/dev/shm") -> None:
        self.store = HostStore(host, storage, models, shm_dir)
        self._nixl = None
        self._peers: PeerTransports | None = None

    @endpoint
    def nixl_expose(self, model: str, version: int, staged: bool = False) -> tuple[bytes, int]:
        self._nixl = nixl_expose(self.store, self._nixl, model, version, staged)
        return self._nixl[1]

    @endpoint
    def free_ports(self, n: int) -> tuple[int, ...]:
        """``n`` distinct TCP ports free on this host now: the one actor on every host
        also answers for the rendezvous of the TP blocks the host holds
        (``pivot.roles.engine.slot_context.rendezvous_ports``)."""
        from pivot.ports import free_ports
        return free_ports(n)

    @endpoint
    def checksums(self, model: str, version: int, items: list) -> list[int]:
        return self.store.checksums(model, version, items)

    @endpoint
    def begin_write(self, model: str, version: int, initial: bool = False, holder: str = "",
                    ttl_s: float = DEFAULT_TTL_S, published: int | None = None) -> Manifest:
        return self.store.begin_write(model, version, initial=initial, holder=holder,
                                      ttl_s=ttl_s, published=published)

    @endpoint
    def renew(self, model: str, version: int, holder: str) -> None:
        self.store.renew(model, version, holder)

    @endpoint
    def writer_lost(self, holder: str) -> list[tuple[str, int]]:
        return self.store.writer_lost(holder)

    @endpoint
    def load_shards(self, model: str, version: int, folder: str) -> int:
        """Fills a staged version with this host's shards read from a HF checkpoint folder
        (:func:`pivot.gps.checkpoint.fill_host`); returns the bytes read."""
        from pivot.gps.checkpoint import fill_host

        return fill_host(self.store, model, version, folder)

    @endpoint
    def put(self, model: str, version: int, items: list) -> None:
        self.store.put(model, version, items)

    @endpoint
    def commit(self, model: str, version: int, expected: list) -> None:
        self.store.commit(model, version, expected)

    @endpoint
    def prepare(self, model: str, version: int, expected: list) -> None:
        self.store.prepare(model, version, expected)

    @endpoint
    def install(self, model: str, version: int) -> None:
        self.store.install(model, version)

    @endpoint
    def publish(self, model: str, version: int) -> None:
        self.store.publish(model, version)

    @endpoint
    def discard(self, model: str, version: int) -> None:
        self.store.discard(model, version)

    @endpoint
    def abort(self, model: str, version: int) -> None:
        self.store.abort(model, version)

    @endpoint
    def lease(self, holder: str, ttl_s: float = 600.0,
              published: dict[str, int | None] | None = None) -> None:
        self.store.lease(holder, ttl_s, published)

    @endpoint
    def end_lease(self, holder: str) -> None:
        self.store.end_lease(holder)

    @endpoint
    def writing(self, model: str) -> int | None:
        return self.store.writing(model)

    @endpoint
    def pull(self, model: str, version: int, sources: list, verify: bool = True) -> int:
        """Rebuild: fills ``version`` of ``model`` from the surviving peers directly."""
        if self._peers is None:
            self._peers = PeerTransports()
        return pull_shards(self.store, model, version, sources, self._peers, verify)

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


HOST_OPS = ("begin_write", "put", "commit", "prepare", "install", "publish", "discard",
            "abort", "latest", "acquire", "release", "get", "versions", "close",
            "nixl_expose", "checksums", "lease", "end_lease", "writing", "pull", "renew",
            "writer_lost", "load_shards")
"""The operations a host handle forwards (:class:`ActorHost`; the in-process stand-in
``pivot.testing.gps.LocalHost`` for tests and benchmarks)."""


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
        if op not in HOST_OPS:
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
