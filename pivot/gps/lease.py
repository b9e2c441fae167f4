"""Write leases: a dead writer's half-written version does not block GPS (sec. 5.1).

A Write of model ``M`` opens with a lease on every host (:meth:`HostStore.begin_write`,
``holder`` = the writing client's id, ``ttl_s`` from :class:`WriteLeaseConfig`). Every step
of the Write that reaches a host renews it (a Monarch ``put``, ``prepare``, ``install``);
transfers that bypass the host (the shared-memory memcpy, a one-sided NIXL WRITE) are
followed by an explicit ``renew`` whenever a quarter of the lease has passed. A writer
that dies stops renewing; once the lease has expired, the next Write on that host
resolves the dead one first (:func:`resolve`):

* staged or prepared: no host can have published it (the client publishes only after
  every host installed), so it is discarded; its arena is unlinked, not recycled, so a
  writer that was only slow cannot scribble into the next Write's staging area;
* installed: if some host already published it (the new writer passes the highest
  published version it saw), it is rolled forward (published here too); otherwise no
  host published it and it is discarded.

A writer that restarts under the same holder id (``GlobalParameterStorage(holder=)``, e.g.
one per trainer slot) resolves its own dead Write at once. The last committed version
stays readable throughout: a Read pins a published version and
never sees a staged one. The fast path: Monarch supervision reports a dead proc to the
*owner* of its mesh, never to an actor the dead process only called (torchmonarch 0.7.0,
``Actor.__supervise__``: "a failure in a resource that it owns"), so a GPS actor cannot
learn of its writer's death by itself; the owner that does learn of it calls
:meth:`GlobalParameterStorage.writer_lost`, which ends the writer's leases at once
(:func:`revoke`). The lease is the fallback when nobody relays the death.

Everything here is pure: the lease is a frozen dataclass, time is an argument.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

import gin

from pivot.config.validation import check_range
from pivot.errors import StateError

DEFAULT_TTL_S = 60.0
"""Default lease (s). Measured here (``bench_gps.py``): a whole 0.67 GB Write takes 0.37 s
over shared memory (1.83 GB/s) and 0.8-1.2 s over NIXL (0.56-0.80 GB/s); the slowest
single step between renewals is one (host, device) transfer over the Monarch fallback,
~0.1 GB/s, i.e. ~7 s for that whole model. 60 s leaves 8x margin over that worst step on
a loaded 2-core machine and is short against a trainer restart (minutes), which is when
the next Write comes after a writer died."""


@gin.configurable
@dataclass(frozen=True, slots=True)
class WriteLeaseConfig:
    """Attributes:
        ttl_s: how long a Write's lease lasts without renewal; a writer silent that long
            is taken for dead and its unpublished version is discarded by the next Write.
    """

    ttl_s: float = DEFAULT_TTL_S

    def __post_init__(self) -> None:
        check_range("WriteLeaseConfig.ttl_s", self.ttl_s, 0, open_lo=True,
                    why="seconds a Write may go without renewal before GPS discards it")


@dataclass(frozen=True, slots=True)
class WriteLease:
    """The lease of one Write of one model on one host (times: ``time.monotonic``)."""

    holder: str
    """The writing client's id (:attr:`GlobalParameterStorage.holder`)."""
    version: int
    ttl_s: float
    started: float
    renewed: float

    @property
    def deadline(self) -> float:
        return self.renewed + self.ttl_s


def open_lease(holder: str, version: int, ttl_s: float, now: float) -> WriteLease:
    """A new lease for ``holder``'s Write of ``version``, starting ``now``."""
    check_range("write lease ttl_s", ttl_s, 0, open_lo=True,
                why="seconds a Write may go without renewal")
    return WriteLease(holder, version, float(ttl_s), now, now)


def renew(lease: WriteLease, holder: str, version: int, now: float) -> WriteLease:
    """The lease extended from ``now``. A renewal by another holder or for another version
    is a fencing error: that writer's lease was lost (expired, taken over)."""
    if holder != lease.holder or version != lease.version:
        raise StateError(f"write lease of v{lease.version} is held by {lease.holder!r}; "
                         f"{holder!r} renewing v{version} lost its lease (expired and "
                         f"discarded, or never held); start a new Write")
    return replace(lease, renewed=max(now, lease.renewed))


def expired(lease: WriteLease, now: float) -> bool:
    """Whether the lease ran out (no renewal for ``ttl_s``)."""
    return now > lease.deadline


def remaining(lease: WriteLease, now: float) -> float:
    """Seconds until the lease expires (negative once it has)."""
    return lease.deadline - now


def revoke(lease: WriteLease, holder: str, now: float) -> WriteLease:
    """The lease ended now if ``holder`` holds it (its writer is known dead); else as is."""
    if lease.holder != holder or expired(lease, now):
        return lease
    return replace(lease, renewed=now - lease.ttl_s - 1e-9)


def due(last_renewed: float, ttl_s: float, now: float) -> bool:
    """Whether a writer should renew now: a quarter of the lease has passed since it last
    renewed (the writer's side; keeps renewals to a few per lease)."""
    return now - last_renewed >= ttl_s / 4


class Resolution(enum.Enum):
    """What a host does with a Write in progress when another Write begins."""

    NONE = "none"
    """No Write in progress: go ahead."""
    REFUSE = "refuse"
    """Its lease is live: refuse the new Write (its writer may still finish)."""
    DISCARD = "discard"
    """Expired and published nowhere: drop it, then go ahead."""
    ROLL_FORWARD = "roll_forward"
    """Expired, installed here and published on another host: publish it here too."""


STAGES = ("staged", "prepared", "installed")


def resolve(lease: WriteLease | None, stage: str | None, now: float,
            published: int | None, holder: str = "") -> Resolution:
    """The fate of the Write in progress (``lease``, at ``stage``) when a new one begins.

    Args:
        published: the highest version of the model any host has published, as the new
            writer saw it (None: it knows of none).
        holder: the new writer's id. The same non-empty id as the lease's is a writer that
            restarted (one client runs one Write at a time): its earlier Write is dead and
            is resolved at once, as if its lease had expired.
    """
    if lease is None:
        return Resolution.NONE
    if stage not in STAGES:
        raise StateError(f"write of v{lease.version} at unknown stage {stage!r}; "
                         f"expected one of {STAGES}")
    if not expired(lease, now) and not (holder and holder == lease.holder):
        return Resolution.REFUSE
    if stage == "installed" and published == lease.version:
        return Resolution.ROLL_FORWARD
    return Resolution.DISCARD
