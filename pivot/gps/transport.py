"""How atomic slices move between a GPS host and the caller (paper appendix B.2).

A :class:`Transport` executes the transfers of one (GPS host, device) pair of a plan. Which
one runs per link type is the client's choice (:class:`pivot.gps.client.GlobalParameterStorage`):

* :class:`ShmTransport` (host-local links): the host's arena lives in ``/dev/shm``; the
  caller maps it and copies each slice with one memcpy, the honest stand-in for the
  node-local PCIe copy. The fastest path here (memcpy speed).
* :class:`MonarchTransport` (remote links, and the fallback for everything): slices travel
  as Monarch endpoint arguments and results (see docs/stack.md: 110-210 MB/s). It works between
  any two processes the actor mesh reaches.
* NIXL (the paper's path over UCX/RDMA) lives in :mod:`pivot.gps.nixl` behind this same
  interface.

Every slice carries its size and checksum. Sizes are always checked (a slice whose shape or
byte count differs from the plan's raises StateError before it is copied: a broadcasting
copy would otherwise pass a truncated slice silently); checksums with ``verify`` (about
three passes over the bytes instead of one, so opt-in; a rebuild always verifies).
"""

from __future__ import annotations

import abc
import concurrent.futures
import logging
from typing import Any, Callable, Sequence

import numpy as np
import torch

from pivot.errors import StateError
from pivot.gps.arena import map_arena
from pivot.gps.manifest import Manifest, checksum
from pivot.gps.pinned import PinnedArenas, on_device
from pivot.gps.plan import Transfer

logger = logging.getLogger(__name__)

Expected = tuple[str, int, tuple[slice, ...], int]
"""(param, shard, box in shard, checksum) that a host verifies on commit."""


def _mismatch(what: str, t: Transfer, got: int, want: int) -> StateError:
    return StateError(f"checksum mismatch on {what} of {t.param} shard {t.shard} "
                      f"{t.shard_box} ({t.nbytes} bytes): received {got}, sent {want}; "
                      f"the data is corrupt, retry the operation")


def _wrong_size(what: str, host: int, model: str, t: Transfer, got: tuple[int, ...],
                got_bytes: int, want: tuple[int, ...]) -> StateError:
    return StateError(f"size mismatch on {what} of {model} {t.param} shard {t.shard} "
                      f"{t.shard_box} with GPS host {host}: got shape {got} ({got_bytes} "
                      f"bytes), the plan expects {want} ({t.nbytes} bytes); the host's "
                      f"store does not match the GPS layout (stale or rebuilt with another "
                      f"layout): rebuild the host with this layout and retry")


def check_sizes(what: str, manifest: Manifest, transfers: Sequence[Transfer],
                pairs: Sequence[tuple[Sequence[int], torch.Tensor]]) -> None:
    """Raises StateError unless every (expected shape, received tensor) pair agrees and
    the tensor has its transfer's byte count."""
    for t, (want, got) in zip(transfers, pairs):
        n = got.numel() * got.element_size()
        if tuple(got.shape) != tuple(want) or n != t.nbytes:
            raise _wrong_size(what, manifest.host, manifest.model, t, tuple(got.shape), n,
                              tuple(want))


def _box_shapes(manifest: Manifest, transfers: Sequence[Transfer]) -> list[tuple[int, ...]]:
    """The shape of every transfer's box inside its shard of ``manifest``."""
    shapes = {key: shape for key, _, shape, _ in manifest.entries}
    out = []
    for t in transfers:
        shape = shapes[(t.param, t.shard)]
        box = tuple(len(range(*b.indices(n))) for b, n in zip(t.shard_box, shape))
        out.append(box + tuple(shape[len(box):]))
    return out


class Transport(abc.ABC):
    """Moves the slices of one (host, device) pair."""

    name: str = "transport"

    @abc.abstractmethod
    def read(self, host: Any, manifest: Manifest, transfers: Sequence[Transfer],
             dst: dict[str, torch.Tensor], verify: bool = False) -> None:
        """Copies every transfer's slice from the host's version into ``dst[param]``."""

    @abc.abstractmethod
    def write(self, host: Any, manifest: Manifest, transfers: Sequence[Transfer],
              src: dict[str, torch.Tensor], verify: bool = False) -> list[Expected]:
        """Copies every slice of ``src`` into the host's staged version; returns the
        checksums the host must find on commit (empty without ``verify``)."""

    def forget_host(self, host: int) -> None:
        """Drops whatever is cached about ``host`` (its store was replaced)."""

    def close(self) -> None:
        """Releases what the transport holds of the hosts (mappings, registrations); it
        stays usable and takes them again on its next transfer."""


class LazyTransport(Transport):
    """Builds its transport on first use: a client whose links are all host-local (every
    device slot of the cluster driver) never starts a remote agent and its threads."""

    def __init__(self, build: Callable[[], Transport]) -> None:
        self._build = build
        self._inner: Transport | None = None

    @property
    def inner(self) -> Transport:
        if self._inner is None:
            self._inner = self._build()
            self.name = self._inner.name
        return self._inner

    @property
    def started(self) -> bool:
        return self._inner is not None

    def read(self, host: Any, manifest: Manifest, transfers: Sequence[Transfer],
             dst: dict[str, torch.Tensor], verify: bool = False) -> None:
        self.inner.read(host, manifest, transfers, dst, verify)

    def write(self, host: Any, manifest: Manifest, transfers: Sequence[Transfer],
              src: dict[str, torch.Tensor], verify: bool = False) -> list[Expected]:
        return self.inner.write(host, manifest, transfers, src, verify)

    def forget_host(self, host: int) -> None:
        if self._inner is not None:
            self._inner.forget_host(host)

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()


def _np(t: torch.Tensor) -> np.ndarray:
    """A numpy view of ``t``'s bytes as same-size integers (numpy has no bfloat16)."""
    return t.view(_INT[t.element_size()]).numpy()


_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class ShmTransport(Transport):
    """Host-local path: map the host's shared-memory arena and memcpy (one copy).

    Copies run as single-threaded numpy copies spread over ``threads`` Python threads
    (numpy releases the GIL), balanced by bytes, largest first. Torch's own intra-op
    parallel copy pays an OpenMP barrier per tensor, which on a busy 2-core machine made
    a 91-tensor copy 4x slower than one flat copy; one long copy per thread does not.

    When the other end of a copy is on a GPU (a Read into a slot's device parameters, a
    Write from its shards) the mapping is registered with the CUDA driver once
    (``pivot.gps.pinned``) and every slice is one asynchronous DMA on the current stream,
    synchronised once per call.

    Args:
        threads: copy threads for host-to-host copies.
        pinned: the process's registered mappings (default: a new ``PinnedArenas``).
    """

    name = "shm"

    def __init__(self, threads: int = 2, pinned: PinnedArenas | None = None) -> None:
        # Up to two mappings per (host, model): the arenas read last (a host alternates
        # between two when it recycles). A mapping keeps an unlinked arena's memory alive,
        # so older ones are dropped (and unregistered if they were registered).
        self._arenas: dict[tuple[int, str], dict[str, tuple[torch.Tensor, dict]]] = {}
        self.pinned = pinned if pinned is not None else PinnedArenas()
        self.threads = max(1, threads)
        self._pool = (concurrent.futures.ThreadPoolExecutor(self.threads,
                                                            thread_name_prefix="gps-shm")
                      if self.threads > 1 else None)

    def _views(self, manifest: Manifest) -> tuple[torch.Tensor, dict]:
        """The host's arena of ``manifest``, mapped (cached), and its shards' views."""
        key = (manifest.host, manifest.model)
        cached = self._arenas.setdefault(key, {})
        hit = cached.get(manifest.path)
        if hit is not None:
            return hit
        try:
            arena = map_arena(manifest.path, manifest.nbytes)
        except RuntimeError as e:
            raise StateError(f"cannot map GPS arena {manifest.path} of host "
                             f"{manifest.host}: {e}; the host must be on this machine "
                             f"for the shared-memory path") from e
        hit = cached[manifest.path] = (arena, manifest.views(arena))
        while len(cached) > 2:
            self.pinned.drop(cached.pop(next(iter(cached)))[0])
        return hit

    @staticmethod
    def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
        np.copyto(_np(dst), _np(src), casting="no")

    def _copy_all(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        if self._pool is None or len(pairs) < 2:
            for d, s in pairs:
                self._copy(d, s)
            return
        bins: list[list] = [[] for _ in range(self.threads)]
        load = [0] * self.threads
        for d, s in sorted(pairs, key=lambda p: -p[1].nbytes):
            i = load.index(min(load))
            bins[i].append((d, s))
            load[i] += s.nbytes

        def run(b):
            for d, s in b:
                self._copy(d, s)
        for f in [self._pool.submit(run, b) for b in bins if b]:
            f.result()

    def _transfer(self, arena: torch.Tensor, pairs: list[tuple[torch.Tensor, torch.Tensor]],
                  device: torch.device | None) -> None:
        """Copies (destination, source) pairs between ``arena`` and the caller's tensors:
        host copies when ``device`` (the caller's side) is None, else one async DMA per
        slice from or to the arena, registered with the driver first."""
        if device is None:
            self._copy_all(pairs)
            return
        self.pinned.ensure(arena)
        for d, s in pairs:
            d.copy_(s, non_blocking=True)
        torch.cuda.current_stream(device).synchronize()

    def forget_host(self, host: int) -> None:
        for key in [k for k in self._arenas if k[0] == host]:
            for arena, _ in self._arenas.pop(key).values():
                self.pinned.drop(arena)

    def close(self) -> None:
        for host in {h for h, _ in self._arenas}:
            self.forget_host(host)

    @staticmethod
    def _shard(views: dict, manifest: Manifest, t: Transfer) -> torch.Tensor:
        v = views.get((t.param, t.shard))
        if v is None:
            raise StateError(f"GPS host {manifest.host} holds no shard {t.shard} of "
                             f"{manifest.model} {t.param}; its store does not match the GPS "
                             f"layout: rebuild the host with this layout and retry")
        return v

    def read(self, host, manifest, transfers, dst, verify=False):
        arena, views = self._views(manifest)
        pairs = [(dst[t.param][t.target_box], self._shard(views, manifest, t)[t.shard_box])
                 for t in transfers]
        check_sizes("read", manifest, transfers, [(d.shape, s) for d, s in pairs])
        self._transfer(arena, pairs, on_device(d for d, _ in pairs))
        if verify:
            for t, (d, s) in zip(transfers, pairs):
                want, got = checksum(s), checksum(d.cpu())
                if got != want:
                    raise _mismatch("read", t, got, want)

    def write(self, host, manifest, transfers, src, verify=False):
        arena, views = self._views(manifest)
        pairs = [(self._shard(views, manifest, t)[t.shard_box], src[t.param][t.target_box])
                 for t in transfers]
        check_sizes("write", manifest, transfers, [(d.shape, s) for d, s in pairs])
        self._transfer(arena, pairs, on_device(s for _, s in pairs))
        if not verify:
            return []
        return [(t.param, t.shard, t.shard_box, checksum(s.cpu()))
                for t, (_, s) in zip(transfers, pairs)]


class MonarchTransport(Transport):
    """Fallback path: slices as endpoint arguments and results of the host's actor."""

    name = "monarch"

    def read(self, host, manifest, transfers, dst, verify=False):
        got = host.get(manifest.model, manifest.version,
                       [(t.param, t.shard, t.shard_box) for t in transfers])
        if len(got) != len(transfers):
            raise StateError(f"GPS host {manifest.host} returned {len(got)} slices of "
                             f"{manifest.model} for {len(transfers)} asked; retry the Read")
        pairs = [(dst[t.param][t.target_box], tensor) for t, (tensor, _) in zip(transfers, got)]
        check_sizes("read", manifest, transfers, [(d.shape, x) for d, x in pairs])
        for t, (d, tensor), (_, sent) in zip(transfers, pairs, got):
            if verify and checksum(tensor) != sent:
                raise _mismatch("read", t, checksum(tensor), sent)
            d.copy_(tensor)

    def write(self, host, manifest, transfers, src, verify=False):
        items, expected = [], []
        check_sizes("write", manifest, transfers,
                    list(zip(_box_shapes(manifest, transfers),
                             (src[t.param][t.target_box] for t in transfers))))
        for t in transfers:
            s = src[t.param][t.target_box]
            items.append((t.param, t.shard, t.shard_box, s.contiguous()))
            if verify:
                expected.append((t.param, t.shard, t.shard_box, checksum(s)))
        host.put(manifest.model, manifest.version, items)
        return expected
