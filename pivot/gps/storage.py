"""The host-memory store of one GPS host (paper sec. 5.1, appendix B.1).

Models -> versions -> the shards this host holds. Each version lives in one flat arena file
under ``/dev/shm`` so a reader on the same host maps it and copies a slice with a single
memcpy (the stand-in for the node-local PCIe copy); its layout (offset of every shard) is
the same for every version of a model.

Atomicity. One host's part of a Write goes through the phases the client drives across all
hosts (:meth:`GlobalParameterStorage.write`, a two-phase commit plus a publish):

1. ``begin_write`` -> ``put`` -> ``prepare``: the version is built aside and its checksums
   verified (the host's vote); ``discard`` drops it, nothing else saw it;
2. ``install``: the version is stored (a Read may pin it by number) but a Read of the
   latest still gets the previous one; ``discard`` still drops it (the rollback);
3. ``publish``: the latest-version number moves to it (one assignment under the lock).

``commit`` runs the three at once (one host alone: a rebuild, the tests). Readers pin a
version (``acquire``/``release``); a version is dropped once it is older than the published
one and not pinned. One Write per model is in progress at a time on a host, and none while
a rebuild holds the host's lease (``lease``/``end_lease``): the other is refused with a
StateError naming model and version. A Write holds a write lease (:mod:`pivot.gps.lease`)
that its steps renew; once it has expired the next Write discards (or, if another host
published it, rolls forward) the dead writer's version instead of being refused.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch

from pivot.errors import ConfigError, StateError
from pivot.gps.arena import _unlink, _unlink_all, map_arena, sweep_stale_arenas
from pivot.gps.layout import ModelMeta, StorageLayout
from pivot.gps.lease import (DEFAULT_TTL_S, Resolution, WriteLease, open_lease, remaining,
                             resolve, revoke)
from pivot.gps.lease import renew as renew_lease
from pivot.gps.manifest import Manifest, ShardKey, checksum
from pivot.types import GENRM

logger = logging.getLogger(__name__)

_ALIGN = 64


@dataclass
class _Version:
    manifest: Manifest
    arena: torch.Tensor
    tensors: dict[ShardKey, torch.Tensor]
    checksums: dict[ShardKey, int] = field(default_factory=dict)
    readers: int = 0
    doomed: bool = False
    """Discarded while pinned: dropped at the last release."""


@dataclass
class _Write:
    """The one Write of a model in progress on a host."""

    version: int
    lease: WriteLease
    stage: str = "staged"
    """"staged" (being filled), "prepared" (verified) or "installed" (stored, unpublished)."""

    def describe(self, model: str) -> str:
        now = time.monotonic()
        return (f"a Write of {model} v{self.version} is in progress ({self.stage}, by "
                f"{self.lease.holder!r}, started {now - self.lease.started:.1f} s ago, its "
                f"lease expires in {max(0.0, remaining(self.lease, now)):.1f} s)")


def _renewed(w: _Write) -> None:
    """A step of the Write reached the host: its lease starts again (implicit renewal)."""
    w.lease = renew_lease(w.lease, w.lease.holder, w.version, time.monotonic())


class HostStore:
    """The parameters one host holds, by model and version.

    Args:
        host: this host's index in the GPS layout.
        storage: the GPS layout; this host holds the shards of slot ``host % k``.
        models: the models' parameter lists, by name.
        shm_dir: where arena files go (``/dev/shm``: memory, shared with local readers).
        recycle: keep one dropped arena per model as the next Write's staging area, so a
            Write lands in memory already faulted in (measured 2-4x faster here) at the
            cost of one spare copy of each written model per host (the GenRM, never
            written, has none). The layout's budget must leave room for it.
    """

    def __init__(self, host: int, storage: StorageLayout, models: Mapping[str, ModelMeta],
                 shm_dir: str = "/dev/shm", recycle: bool = True) -> None:
        if not 0 <= host < storage.hosts:
            raise ConfigError(f"HostStore: host {host} outside the GPS layout's "
                              f"{storage.hosts} hosts")
        self.host = host
        self.storage = storage
        self.models = dict(models)
        self.shm_dir = shm_dir
        self._tag = uuid.uuid4().hex[:8]
        self._paths: set[str] = set()
        self._count = 0
        self.recycle = recycle
        self._spare: dict[str, tuple[str, torch.Tensor]] = {}
        self._lock = threading.Lock()
        self._latest: dict[str, int] = {}
        self._versions: dict[str, dict[int, _Version]] = {m: {} for m in self.models}
        self._staged: dict[tuple[str, int], _Version] = {}
        self._writing: dict[str, _Write] = {}
        self._lease: tuple[str, float, float] | None = None
        """(holder, start, deadline) of a rebuild that excludes Writes on this host."""
        self._layouts = {m: self._arena_layout(m) for m in self.models}
        sweep_stale_arenas(shm_dir)
        # Arena files outlive a process that dies without close(): remove them at exit.
        self._finalizer = weakref.finalize(self, _unlink_all, self._paths)

    def _arena_layout(self, model: str) -> tuple[tuple[tuple[ShardKey, int, tuple[int, ...],
                                                             str], ...], int]:
        slot = self.host % self.storage.k
        meta = {p.name: p for p in self.models[model].params}
        entries, off = [], 0
        for name, sh in self.storage.param_shards(model).items():
            p = meta[name]
            for i, ((a, b), s) in enumerate(zip(sh.rows, sh.slots)):
                if s != slot:
                    continue
                shape = (b - a, *p.shape[1:])
                entries.append(((name, i), off, shape, p.dtype))
                off += -(-((b - a) * (p.nbytes // p.shape[0])) // _ALIGN) * _ALIGN
        return tuple(entries), max(off, _ALIGN)

    def _model(self, model: str) -> None:
        if model not in self.models:
            raise ConfigError(f"GPS host {self.host}: unknown model {model!r} (it holds: "
                              f"{', '.join(self.models)}); fix the name or add the model")

    # --- Write ---------------------------------------------------------------------------
    def begin_write(self, model: str, version: int, *, initial: bool = False,
                    holder: str = "", ttl_s: float = DEFAULT_TTL_S,
                    published: int | None = None) -> Manifest:
        """Allocates version ``version`` aside; fill it, then :meth:`commit` it.

        ``initial`` marks the first install of a model (a checkpoint load); the GenRM is
        frozen, so only that first install is allowed for it (sec. 5.1). The Write holds a
        lease for ``holder`` of ``ttl_s`` seconds, renewed by each later step of it; a
        Write in progress whose lease expired is resolved first (:func:`resolve`, with
        ``published`` the highest version the writer saw published on any host).
        """
        self._model(model)
        with self._lock:
            self._resolve_dead(model, published, holder)
            latest = self._latest.get(model)
            if model == GENRM and not (initial and latest is None):
                raise StateError(f"Write(M={GENRM!r}) is not allowed: the GenRM is frozen "
                                 f"(sec. 5.1) and GPS already holds it (version {latest}); "
                                 f"only the initial load may install it")
            lease = self._live_lease()
            if lease is not None:
                raise StateError(f"GPS host {self.host}: Write of {model} v{version} refused: "
                                 f"{lease[0]} is in progress (started "
                                 f"{time.monotonic() - lease[1]:.1f} s ago; this host holds "
                                 f"{model} v{latest}); retry once it ends")
            w = self._writing.get(model)
            if w is not None:
                raise StateError(f"GPS host {self.host}: Write of {model} v{version} refused: "
                                 f"{w.describe(model)}; one Write per model at a time: retry "
                                 f"once it ends or its lease expires (if its writer is known "
                                 f"dead: GlobalParameterStorage.writer_lost("
                                 f"{w.lease.holder!r}))")
            stored = max([*self._versions[model], -1 if latest is None else latest])
            if version <= stored:
                raise StateError(f"GPS host {self.host}: {model} version {version} is not "
                                 f"newer than the stored version {stored}; versions increase")
            self._writing[model] = _Write(version, open_lease(holder, version, ttl_s,
                                                              time.monotonic()))
        try:
            return self._stage(model, version)
        except BaseException:
            with self._lock:
                self._writing.pop(model, None)
            raise

    def _stage(self, model: str, version: int) -> Manifest:
        entries, nbytes = self._layouts[model]
        with self._lock:
            spare = self._spare.pop(model, None)
        if spare is not None:  # a dropped version's arena: its pages are already in memory
            path, arena = spare
        else:
            self._count += 1
            path = os.path.join(self.shm_dir, f"pivot-gps-p{os.getpid()}-{self._tag}-"
                                              f"h{self.host}-{model}-a{self._count}")
            self._paths.add(path)
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                os.ftruncate(fd, nbytes)
            finally:
                os.close(fd)
            arena = map_arena(path, nbytes)
        man = Manifest(self.host, model, version, path, nbytes, entries)
        with self._lock:
            self._staged[(model, version)] = _Version(man, arena, man.views(arena))
        return man

    def _resolve_dead(self, model: str, published: int | None, holder: str = "") -> None:
        """Discards or rolls forward the Write of ``model`` whose lease expired, or whose
        holder is writing again (lock held)."""
        w = self._writing.get(model)
        if w is None:
            return
        res = resolve(w.lease, w.stage, time.monotonic(), published, holder)
        if res in (Resolution.NONE, Resolution.REFUSE):
            return
        logger.warning("GPS host %d: %s's Write of %s v%d is dead (%s, %s): %s",
                       self.host, w.lease.holder, model, w.version, w.stage,
                       "its holder writes again" if holder == w.lease.holder else
                       "lease expired",
                       "rolled forward (published elsewhere)" if res is Resolution.ROLL_FORWARD
                       else "discarded")
        del self._writing[model]
        if res is Resolution.ROLL_FORWARD:
            self._latest[model] = w.version
            self._gc(model)
        elif w.stage == "installed":  # its writer wrote nothing after prepare: recyclable
            self._versions[model][w.version].doomed = True
            self._gc(model)
        else:
            # A writer taken for dead may only be slow and still copying into the arena
            # (shared memory, NIXL): unlink it rather than recycle it into the next Write.
            st = self._staged.pop((model, w.version), None)
            if st is not None:
                _unlink(st.manifest.path)
                self._paths.discard(st.manifest.path)

    def _touch(self, model: str, version: int) -> None:
        """Renews the lease of the Write of ``model`` v``version`` (implicit renewal)."""
        with self._lock:
            w = self._writing.get(model)
            if w is not None and w.version == version:
                _renewed(w)

    def renew(self, model: str, version: int, holder: str) -> None:
        """Renews ``holder``'s lease on its Write of ``version``; StateError if it lost it."""
        with self._lock:
            w = self._writing.get(model)
            if w is None or w.version != version:
                raise StateError(f"GPS host {self.host}: {holder!r} renewing the lease of its "
                                 f"Write of {model} v{version}, which is no longer in progress "
                                 f"(its lease expired and it was discarded); write again")
            w.lease = renew_lease(w.lease, holder, version, time.monotonic())

    def writer_lost(self, holder: str) -> list[tuple[str, int]]:
        """Ends every Write lease ``holder`` holds here (its process is known dead: the fast
        path of :mod:`pivot.gps.lease`); staged or prepared versions are discarded now,
        installed ones by the next Write (which knows whether another host published it).
        Returns the (model, version) pairs whose lease ended."""
        now, ended = time.monotonic(), []
        with self._lock:
            for model, w in list(self._writing.items()):
                if w.lease.holder == holder:
                    w.lease = revoke(w.lease, holder, now)
                    ended.append((model, w.version))
                    if w.stage != "installed":
                        self._resolve_dead(model, None)
        return ended

    def put(self, model: str, version: int,
            items: Sequence[tuple[str, int, tuple[slice, ...], torch.Tensor]]) -> None:
        """Copies slices into a staged version: (param, shard, box in shard, tensor)."""
        st = self._staged_version(model, version)
        self._touch(model, version)
        for name, shard, box, t in items:
            st.tensors[(name, shard)][box].copy_(t)

    def prepare(self, model: str, version: int,
                expected: Sequence[tuple[str, int, tuple[slice, ...], int]] = ()) -> None:
        """Phase 1 (the vote): verifies the staged slices against ``expected`` (param, shard,
        box, checksum). On a mismatch the staged version is discarded and StateError raised."""
        st = self._staged_version(model, version)
        for name, shard, box, want in expected:
            got = checksum(st.tensors[(name, shard)][box])
            if got != want:
                self.abort(model, version)
                raise StateError(f"GPS host {self.host}: checksum mismatch writing {model} "
                                 f"v{version} {name} shard {shard} {box}: got {got}, sent "
                                 f"{want}; the write was discarded, retry it")
        with self._lock:
            w = self._writing[model]
            w.stage = "prepared"
            _renewed(w)

    def install(self, model: str, version: int) -> None:
        """Phase 2: stores a prepared version; Reads of the latest do not see it yet."""
        with self._lock:
            w = self._write_in(model, version, "prepared", "install")
            self._versions[model][version] = self._staged.pop((model, version))
            w.stage = "installed"
            _renewed(w)

    def publish(self, model: str, version: int) -> None:
        """Phase 3: makes an installed version the latest; older unpinned ones are dropped."""
        with self._lock:
            self._write_in(model, version, "installed", "publish")
            del self._writing[model]
            self._latest[model] = version
            self._gc(model)

    def _write_in(self, model: str, version: int, stage: str, op: str):
        """The Write of ``model`` v``version`` in progress at ``stage`` (lock held), or a
        StateError naming ``op`` and what is in progress instead."""
        w = self._writing.get(model)
        if w is None or w.version != version or w.stage != stage:
            raise StateError(f"GPS host {self.host}: {op} of {model} v{version} without "
                             f"{'an' if stage[0] in 'aeiou' else 'a'} {stage} Write of it "
                             f"({w.describe(model) if w else 'none in progress'})")
        return w

    def commit(self, model: str, version: int,
               expected: Sequence[tuple[str, int, tuple[slice, ...], int]] = ()) -> None:
        """Verifies, installs and publishes at once (one host on its own). On a checksum
        mismatch nothing is installed."""
        self.prepare(model, version, expected)
        self.install(model, version)
        self.publish(model, version)

    def discard(self, model: str, version: int) -> None:
        """Undoes a Write of ``version`` that is not published (staged, prepared or
        installed: the rollback); no-op if there is none. A pinned installed version is
        dropped at its last release."""
        with self._lock:
            w = self._writing.get(model)
            if w is None or w.version != version:
                if self._latest.get(model) == version:
                    raise StateError(f"GPS host {self.host}: {model} v{version} is published; "
                                     f"only an unpublished Write can be discarded")
                return
            installed = w.stage == "installed"
            if installed:
                del self._writing[model]
                v = self._versions[model][version]
                v.doomed = True
                self._gc(model)
        if not installed:
            self.abort(model, version)

    def abort(self, model: str, version: int) -> None:
        """Discards a staged (or prepared) version; stored versions are untouched."""
        with self._lock:
            st = self._staged.pop((model, version), None)
            w = self._writing.get(model)
            if w is not None and w.version == version and w.stage != "installed":
                del self._writing[model]
            if st is not None and self.recycle and model not in self._spare:
                self._spare[model] = (st.manifest.path, st.arena)
                st = None
        if st is not None:
            _unlink(st.manifest.path)
            self._paths.discard(st.manifest.path)

    # --- Exclusion with a rebuild --------------------------------------------------------
    def _live_lease(self) -> tuple[str, float, float] | None:
        if self._lease is not None and time.monotonic() > self._lease[2]:
            logger.warning("GPS host %d: lease of %r expired", self.host, self._lease[0])
            self._lease = None
        return self._lease

    def lease(self, holder: str, ttl_s: float = 600.0,
              published: Mapping[str, int | None] | None = None) -> None:
        """Takes this host's rebuild lease: Writes are refused until :meth:`end_lease` (or
        ``ttl_s``, if the holder died). Refused while a Write is in progress here, unless
        its write lease expired: then it is resolved first (an installed one only with
        ``published``, per model the highest version any host published)."""
        with self._lock:
            other = self._live_lease()
            if other is not None and other[0] != holder:
                raise StateError(f"GPS host {self.host}: {holder} refused: {other[0]} is in "
                                 f"progress; retry once it ends")
            for m in [m for m, w in self._writing.items()
                      if published is not None or w.stage != "installed"]:
                self._resolve_dead(m, None if published is None else published.get(m))
            for m, w in self._writing.items():
                raise StateError(f"GPS host {self.host}: {holder} refused: {w.describe(m)}; "
                                 f"retry once it ends or its lease expires (or, if its "
                                 f"writer died, GlobalParameterStorage.writer_lost("
                                 f"{w.lease.holder!r}))")
            now = time.monotonic()
            self._lease = (holder, now, now + ttl_s)

    def end_lease(self, holder: str) -> None:
        with self._lock:
            if self._lease is not None and self._lease[0] == holder:
                self._lease = None

    def writing(self, model: str) -> int | None:
        """The version of ``model`` a Write in progress here is writing, if any."""
        with self._lock:
            w = self._writing.get(model)
            return None if w is None else w.version

    def _staged_version(self, model: str, version: int) -> _Version:
        with self._lock:
            st = self._staged.get((model, version))
        if st is None:
            raise StateError(f"GPS host {self.host}: no write of {model} version {version} "
                             f"in progress; call begin_write first")
        return st

    # --- Read ----------------------------------------------------------------------------
    def latest(self, model: str) -> int | None:
        self._model(model)
        with self._lock:
            return self._latest.get(model)

    def acquire(self, model: str, version: int | None = None) -> Manifest:
        """Pins a version (default: the latest) until :meth:`release`; returns its manifest."""
        self._model(model)
        with self._lock:
            if version is None:
                version = self._latest.get(model)
                if version is None:
                    raise StateError(f"GPS host {self.host}: model {model!r} has no version "
                                     f"yet; Write (or load) it before reading")
            v = self._versions[model].get(version)
            if v is None or v.doomed:
                have = sorted(n for n, x in self._versions[model].items() if not x.doomed)
                raise StateError(f"GPS host {self.host}: {model} has no version {version} "
                                 f"(stored: {have}); read the latest or a stored version")
            v.readers += 1
            return v.manifest

    def release(self, model: str, version: int) -> None:
        with self._lock:
            v = self._versions.get(model, {}).get(version)
            if v is None or v.readers == 0:
                raise StateError(f"GPS host {self.host}: release of {model} v{version} "
                                 f"that is not acquired")
            v.readers -= 1
            self._gc(model)

    def get(self, model: str, version: int,
            items: Sequence[tuple[str, int, tuple[slice, ...]]]
            ) -> list[tuple[torch.Tensor, int]]:
        """Copies of slices of a pinned version, each with its checksum (remote path)."""
        with self._lock:
            v = self._versions[model].get(version)
        if v is None or v.readers == 0:
            raise StateError(f"GPS host {self.host}: {model} v{version} is not acquired")
        out = []
        for name, shard, box in items:
            t = v.tensors[(name, shard)][box].clone()
            out.append((t, checksum(t)))
        return out

    def arena(self, model: str, version: int, staged: bool = False
              ) -> tuple[Manifest, torch.Tensor, set[str]]:
        """A version's manifest and flat arena (staged: a Write in progress), and the paths
        of every arena still live (for transports that register memory)."""
        with self._lock:
            v = (self._staged.get((model, version)) if staged
                 else self._versions.get(model, {}).get(version))
            live = {x.manifest.path for d in self._versions.values() for x in d.values()}
            live |= {x.manifest.path for x in self._staged.values()}
            live |= {p for p, _ in self._spare.values()}
        if v is None:
            raise StateError(f"GPS host {self.host}: {model} v{version} is not "
                             f"{'being written' if staged else 'stored'}")
        return v.manifest, v.arena, live

    def checksums(self, model: str, version: int,
                  items: Sequence[tuple[str, int, tuple[slice, ...]]]) -> list[int]:
        """Checksums of slices of a stored version (to verify a one-sided transfer)."""
        with self._lock:
            v = self._versions[model].get(version)
        if v is None:
            raise StateError(f"GPS host {self.host}: {model} v{version} is not stored")
        return [checksum(v.tensors[(n, sh)][box]) for n, sh, box in items]

    def tensors(self, model: str, version: int) -> dict[ShardKey, torch.Tensor]:
        """The stored shards of a version (in-process access; do not modify)."""
        with self._lock:
            return dict(self._versions[model][version].tensors)

    def versions(self, model: str) -> list[int]:
        """Stored versions (published and installed), not counting discarded ones."""
        with self._lock:
            return sorted(n for n, v in self._versions[model].items() if not v.doomed)

    def _gc(self, model: str) -> None:
        """Drops unpinned versions older than the published one, and discarded ones."""
        latest = self._latest.get(model)
        for n in [n for n, v in self._versions[model].items() if v.readers == 0
                  and (v.doomed or (latest is not None and n < latest))]:
            v = self._versions[model].pop(n)
            if self.recycle and model not in self._spare:
                self._spare[model] = (v.manifest.path, v.arena)
            else:
                _unlink(v.manifest.path)
                self._paths.discard(v.manifest.path)

    def close(self) -> None:
        """Removes every arena file of this store."""
        with self._lock:
            vs = [v for d in self._versions.values() for v in d.values()]
            vs += list(self._staged.values())
            self._versions = {m: {} for m in self.models}
            self._staged.clear()
            self._writing.clear()
            self._latest.clear()
            self._spare.clear()
        for v in vs:
            _unlink(v.manifest.path)
        _unlink_all(self._paths)
        self._paths.clear()
