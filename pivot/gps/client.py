"""The GPS client (paper sec. 5.1, app. B), over one :class:`~pivot.gps.actor.GPSActor`
per host.

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
import contextlib
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence

import torch

from pivot.errors import ConfigError, StateError
from pivot.gps.layout import ModelMeta, ParallelLayout, StorageLayout, torch_dtype
from pivot.gps.lease import WriteLeaseConfig, due
from pivot.gps.manifest import Manifest
from pivot.gps.plan import Link, LinkProfile, Plan, Planner
from pivot.gps.recovery import RebuildReport, rebuild_host
from pivot.gps.transport import LazyTransport, MonarchTransport, ShmTransport, Transport
from pivot.types import GENRM

logger = logging.getLogger(__name__)

StateDicts = Mapping[int, Mapping[str, torch.Tensor]]
"""Per device id: parameter name -> the shard of it that device holds under ``P``."""


@dataclass(frozen=True)
class WriteTicket:
    """A Write begun on every host (:meth:`GlobalParameterStorage.begin_write`), picklable:
    what another process needs to stage its devices' part of it (``write_part``) under
    the beginning client's lease, before that client finishes it (``finish_write``).

    Attributes:
        staged: host -> where the version is staged on it.
        published: the highest version published when the Write began.
    """

    model: str
    version: int
    published: int | None
    holder: str
    devices: tuple[int, ...]
    layout: ParallelLayout
    staged: Mapping[int, Manifest]
    verify: bool = False


@dataclass(frozen=True)
class WritePart:
    """What one writer staged of a Write (``write_part``): its devices of G, and per host
    the checksums the host must find (empty unless the ticket verifies)."""

    devices: tuple[int, ...]
    expected: Mapping[int, list]


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
    except Exception as e:  # noqa: BLE001 - no nixl wheel, or UCX cannot start
        logger.warning("NIXL unavailable (%s); remote GPS links use Monarch", e)
        return MonarchTransport()


class GlobalParameterStorage:
    """The GPS client: Read(M, G, P) and Write(M, G, P) (sec. 5.1).

    Args:
        hosts: one handle per GPS host, in host order (:class:`ActorHost`; tests and
            benchmarks pass ``pivot.testing.gps.LocalHost`` over in-process stores).
        models: the models GPS holds, by name.
        storage: the GPS layout.
        device_host: host index of every device of the pool.
        links: link costs for planning.
        transports: the transport per link type (default: :func:`default_transports`).
        lease: the write lease of this client's Writes (default: gin's
            :class:`~pivot.gps.lease.WriteLeaseConfig`).
        holder: this client's id on the leases (default: unique per client). A stable id
            (e.g. per trainer slot) lets a restarted writer supersede its own dead Write at
            once; two live clients must never share one.
    """

    def __init__(self, hosts: Sequence[Any], models: Mapping[str, ModelMeta],
                 storage: StorageLayout, device_host: Sequence[int],
                 links: LinkProfile = LinkProfile(),
                 transports: Mapping[Link, Transport] | None = None,
                 lease: WriteLeaseConfig | None = None, holder: str | None = None) -> None:
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
        self.lock = threading.RLock()
        """Held by a Write and a rebuild of this client: one waits for the other (other
        clients are excluded by the hosts themselves, see :meth:`HostStore.lease`)."""
        self.lease = lease if lease is not None else WriteLeaseConfig()
        self.holder = holder or (f"gps-writer-{os.uname().nodename}-{os.getpid()}-"
                                 f"{uuid.uuid4().hex[:6]}")
        """This client's id on the hosts' write leases (see :meth:`writer_lost`)."""

    # --- Read ----------------------------------------------------------------------------
    def read(self, model: str, devices: Sequence[int], layout: ParallelLayout, *,
             version: int | None = None, verify: bool = False,
             out: StateDicts | None = None,
             only: Sequence[int] | None = None) -> dict[int, dict[str, torch.Tensor]]:
        """Read(M, G, P): the shard of every parameter each device holds under ``P``.

        Args:
            version: the version to read (default: the latest).
            verify: check every slice's checksum after it lands.
            out: optional preallocated per-device buffers to fill instead of new tensors.
            only: the devices of ``devices`` to read for (default: all of them). A device
                slot of a multi-device replica passes itself: it receives its own shard
                only, from the replica's cached plan (sec. 5.1).
        Returns:
            ``{device: {param name: tensor}}``, one entry per device read for, all of one
            version (the same on every host read from).
        """
        plan = self.planner.read(model, devices, layout)
        ranks = self._ranks(plan, only)
        groups = {k: ts for k, ts in plan.transfers().items() if k[1] in ranks}
        dst = self._buffers(plan, out, ranks)
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

    @contextlib.contextmanager
    def pinned(self, model: str, version: int | None = None) -> Iterator[int]:
        """Pins one version of ``model`` (default: the latest) on every host until the
        block ends and yields its number: a Write that publishes meanwhile cannot drop it,
        so Reads of that version inside the block, by any process, find it.

        A multi-device replica's rank 0 holds its pin from its own Read until every other
        rank has Read the version it names (sec. 5.1); without it a Write between the
        two Reads leaves the later ones nothing to read."""
        pins = self._pin(model, range(len(self.hosts)), version)
        try:
            yield next(iter(pins.values())).version
        finally:
            self._release(model, pins)

    @staticmethod
    def _ranks(plan: Plan, only: Sequence[int] | None) -> list[int]:
        if only is None:
            return list(range(len(plan.devices)))
        rank = {d: r for r, d in enumerate(plan.devices)}
        bad = [d for d in only if d not in rank]
        if bad:
            raise ConfigError(f"{plan.model.name}: Read only={list(only)} names devices {bad} "
                              f"outside G={list(plan.devices)}; pass devices of the layout")
        return [rank[d] for d in only]

    def _buffers(self, plan: Plan, out: StateDicts | None,
                 ranks: Sequence[int]) -> dict[int, dict[str, torch.Tensor]]:
        dtypes = self._dtypes[plan.model.name]
        dst = {}
        for r in ranks:
            dev = plan.devices[r]
            shapes = plan.target_shapes(r)
            if out is not None:
                self._check_state(plan, r, out, "out")
                dst[r] = {k: out[dev][k] for k in shapes}
            else:
                dst[r] = {k: torch.empty(s, dtype=dtypes[k]) for k, s in shapes.items()}
        return dst

    def _pin(self, model: str, hosts: Sequence[int], version: int | None,
             tries: int = 20) -> dict[int, Manifest]:
        """Pins one version on every host in ``hosts``.

        With ``version`` None each host's latest is pinned; hosts disagree only while a
        Write publishes (phase 3), when every host has already installed the new version,
        so the hosts still on the old one pin the new one by number instead.
        """
        for _ in range(tries):
            pinned: dict[int, Manifest] = {}
            try:
                for h in hosts:
                    pinned[h] = self.hosts[h].acquire(model, version)
            except Exception:
                self._release(model, pinned)
                raise
            new = max((m.version for m in pinned.values()), default=None)
            if version is not None or all(m.version == new for m in pinned.values()):
                return pinned
            try:
                for h, man in list(pinned.items()):
                    if man.version != new:
                        pinned[h] = self.hosts[h].acquire(model, new)
                        self.hosts[h].release(model, man.version)
                return pinned
            except StateError:  # a later Write published meanwhile and dropped it: again
                self._release(model, pinned)
        raise StateError(f"GPS: hosts {list(hosts)} did not agree on a version of {model} "
                         f"after {tries} tries; is a Write stuck half-way?")

    def _release(self, model: str, pinned: Mapping[int, Manifest]) -> None:
        for h, man in pinned.items():
            try:
                self.hosts[h].release(model, man.version)
            except Exception as e:  # noqa: BLE001 - a dead host: nothing left to release
                logger.warning("GPS host %d: release of %s v%d failed: %s", h, model,
                               man.version, e)

    # --- Write ---------------------------------------------------------------------------
    def write(self, model: str, devices: Sequence[int], layout: ParallelLayout,
              states: StateDicts, *, verify: bool = False, _initial: bool = False) -> int:
        """Write(M, G, P): installs the devices' shards as the next version of ``model``,
        as one commit across every GPS host.

        Phase 1 stages the version on every host and each host verifies it; phase 2
        installs it everywhere (a Read of the latest still gets the old one); any failure
        up to here discards it on every host, which all keep the old version. Phase 3
        publishes it host by host; a Read spanning hosts pins one version throughout.

        Args:
            states: ``{device: {param name: shard}}`` for every device of ``devices``.
            verify: the hosts check every slice's checksum before installing.
        Returns:
            the new version number (monotonically increasing per model).
        Raises:
            StateError: a host refused or failed; no host installed the version (except
                when publishing failed, which the message says).
        """
        plan = self._checked_plan(model, devices, layout, states, _initial)
        return self._write(plan, states, verify, _initial)

    def _checked_plan(self, model: str, devices: Sequence[int], layout: ParallelLayout,
                      states: StateDicts, initial: bool) -> Plan:
        """The Write's plan, after refusing a frozen model and states that do not match it
        (before anything is staged)."""
        self._check_writable(model, initial)
        plan = self.planner.write(model, devices, layout)
        for r in range(len(plan.devices)):
            self._check_state(plan, r, states, "states")
        return plan

    @staticmethod
    def _check_writable(model: str, initial: bool) -> None:
        if model == GENRM and not initial:
            raise StateError(f"Write(M={GENRM!r}) is not allowed: the GenRM is frozen "
                             f"(sec. 5.1); load it once with load()")

    def _write(self, plan: Plan, states: StateDicts, verify: bool, initial: bool) -> int:
        """The three calls below in this process, on a checked plan."""
        with self.lock:
            ticket = self.begin_write(plan.model.name, plan.devices, plan.layout,
                                      verify=verify, _initial=initial)
            try:
                part = self._stage(ticket, plan, states, range(len(plan.devices)))
            except BaseException as e:
                self.abort(ticket, e)
                raise
            return self.finish_write(ticket, [part])

    # A Write in three calls, so that several processes (the ranks of a training replica)
    # each stage their own devices' part of one version: the client that begins it
    # finishes it with every part's checksums (sec. 5.1).
    def begin_write(self, model: str, devices: Sequence[int], layout: ParallelLayout, *,
                    verify: bool = False, _initial: bool = False) -> WriteTicket:
        """Phase 1 begins: the next version of ``model`` is staged on every host under
        this client's lease. Pass the ticket to ``write_part`` (any process) and then to
        ``finish_write`` (this client), or to ``abort``."""
        self._check_writable(model, _initial)
        self.planner.write(model, devices, layout)   # refuses a bad G or P before staging
        latest = [self.hosts[h].latest(model) for h in range(len(self.hosts))]
        old = max((v for v in latest if v is not None), default=None)
        version = 0 if old is None else old + 1
        staged: dict[int, Manifest] = {}
        try:
            for h in range(len(self.hosts)):
                staged[h] = self.hosts[h].begin_write(model, version, initial=_initial,
                                                      holder=self.holder,
                                                      ttl_s=self.lease.ttl_s, published=old)
        except BaseException:
            self._discard(model, version, staged)
            raise
        return WriteTicket(model, version, old, self.holder, tuple(devices), layout, staged,
                           verify)

    def write_part(self, ticket: WriteTicket, states: StateDicts,
                   only: Sequence[int] | None = None) -> WritePart:
        """Stages the shards of the devices ``only`` (default: all of G) of a begun Write;
        ``states`` holds those devices' shards. Returns what it staged, for
        ``finish_write``. Renews the ticket's lease as it goes."""
        plan = self.planner.write(ticket.model, ticket.devices, ticket.layout)
        ranks = self._ranks(plan, only)
        for r in ranks:
            self._check_state(plan, r, states, "states")
        return self._stage(ticket, plan, states, ranks)

    def _stage(self, ticket: WriteTicket, plan: Plan, states: StateDicts,
               ranks: Iterable[int]) -> WritePart:
        """Copies the checked shards of G's ranks ``ranks`` into the staged version."""
        ranks = set(ranks)
        ttl = self.lease.ttl_s
        renewed = {h: time.monotonic() for h in ticket.staged}
        expected: dict[int, list] = {h: [] for h in ticket.staged}
        for (h, r), ts in plan.transfers().items():
            if r not in ranks:
                continue
            link = Link.LOCAL if self.planner.device_host[plan.devices[r]] == h \
                else Link.REMOTE
            expected[h] += self.transports[link].write(self.hosts[h], ticket.staged[h], ts,
                                                       states[plan.devices[r]],
                                                       ticket.verify)
            now = time.monotonic()
            for x in [x for x, t in renewed.items() if due(t, ttl, now)]:
                # shm and NIXL copies bypass the host: renew the lease explicitly
                self.hosts[x].renew(ticket.model, ticket.version, ticket.holder)
                renewed[x] = time.monotonic()
        return WritePart(tuple(plan.devices[r] for r in sorted(ranks)), expected)

    def finish_write(self, ticket: WriteTicket, parts: Sequence[WritePart]) -> int:
        """Checks that the parts staged every device of G exactly once, then every host
        verifies them (prepare) and installs the version (phase 2), and it is published
        (phase 3). A failure before publishing discards the version on every host.
        Returns the version."""
        model, version = ticket.model, ticket.version
        try:
            staged = sorted(d for part in parts for d in part.devices)
            if staged != sorted(ticket.devices):
                raise StateError(f"Write of {model} v{version}: the parts staged devices "
                                 f"{staged}, G is {sorted(ticket.devices)}; every device's "
                                 f"shards must be staged exactly once")
            for h in ticket.staged:
                self.hosts[h].prepare(model, version, [e for part in parts
                                                       for e in part.expected.get(h, [])])
            for h in ticket.staged:
                self.hosts[h].install(model, version)
        except BaseException as e:
            self.abort(ticket, e)
            raise
        self._publish(model, version)
        return version

    def abort(self, ticket: WriteTicket, why: BaseException | str = "aborted") -> None:
        """Discards a begun Write on every host; each keeps its previous version."""
        self._discard(ticket.model, ticket.version, ticket.staged)
        logger.warning("Write of %s v%d failed (%s); discarded on hosts %s, every host "
                       "keeps v%s", ticket.model, ticket.version, why, sorted(ticket.staged),
                       ticket.published)

    def _discard(self, model: str, version: int, hosts: Sequence[int]) -> None:
        for h in hosts:
            try:
                self.hosts[h].discard(model, version)
            except Exception as e:  # noqa: BLE001 - a dead host: its store is gone with it
                logger.warning("GPS host %d: discard of %s v%d failed: %s", h, model,
                               version, e)

    def _publish(self, model: str, version: int) -> None:
        failed: dict[int, str] = {}
        for h in range(len(self.hosts)):
            try:
                self.hosts[h].publish(model, version)
            except Exception as e:  # noqa: BLE001 - the host died after installing: roll forward
                failed[h] = str(e)
        if failed:
            raise StateError(f"Write of {model} v{version}: installed on every GPS host, but "
                             f"publishing it failed on hosts {sorted(failed)} "
                             f"({next(iter(failed.values()))}); the other hosts serve "
                             f"v{version} and Reads pin it everywhere; rebuild the failed "
                             f"hosts if they are lost (gps.rebuild)")

    def abort_write(self, model: str, version: int) -> None:
        """Discards an unpublished Write of ``version`` on every host at once (a dead
        writer's is also discarded by the next Write once its lease expires)."""
        with self.lock:
            self._discard(model, version, range(len(self.hosts)))

    def writer_lost(self, holder: str) -> list[tuple[int, str, int]]:
        """Ends the write leases of ``holder`` (another client's :attr:`holder`) on every
        host: its process is known dead, e.g. from Monarch supervision at the owner of its
        proc, so the next Write need not wait for the lease to expire (:mod:`pivot.gps.
        lease`). Returns the (host, model, version) Writes whose lease ended."""
        out = []
        for h in range(len(self.hosts)):
            try:
                out += [(h, m, v) for m, v in self.hosts[h].writer_lost(holder)]
            except Exception as e:  # noqa: BLE001 - a dead host: nothing of it to end
                logger.warning("GPS host %d: writer_lost(%s) failed: %s", h, holder, e)
        return out

    def write_async(self, model: str, devices: Sequence[int], layout: ParallelLayout,
                    states: StateDicts, *, verify: bool = False
                    ) -> concurrent.futures.Future[int]:
        """Write in the background so it overlaps the next training step (sec. 5.1).

        The caller must not modify ``states`` in place (e.g. by an optimizer step) before
        the future resolves. Input errors are raised here, before anything runs.
        """
        plan = self._checked_plan(model, devices, layout, states, False)
        return self._pool.submit(self._write, plan, states, verify, False)

    def load(self, model: str, state: Mapping[str, torch.Tensor], device: int = 0) -> int:
        """Installs full tensors (a checkpoint) as the first version; the GenRM's only way
        in. ``device`` is the pool device whose host stands for the caller's location."""
        meta = self.models.get(model)
        if meta is None:
            raise ConfigError(f"GPS holds no model {model!r}")
        layout = ParallelLayout.create(meta, dp=1, tp=1, pp=1)
        return self.write(model, (device,), layout, {device: state}, _initial=True)

    def load_checkpoint(self, model: str, folder: str) -> int:
        """Installs a HF checkpoint folder as the next version of ``model``, each host
        reading only its own shards (:func:`pivot.gps.checkpoint.load_checkpoint`)."""
        from pivot.gps.checkpoint import load_checkpoint

        return load_checkpoint(self, model, folder)[0]

    def rebuild(self, host: int, replacement: Any, **kwargs: Any) -> RebuildReport:
        """Rebuilds lost host ``host`` into ``replacement`` from its surviving replicas or a
        checkpoint, same version (:func:`pivot.gps.recovery.rebuild_host`). Waits for a
        Write of this client; a Write of another client makes it fail (and vice versa)."""
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
        for t in self.transports.values():
            t.close()
