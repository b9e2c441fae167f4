"""A replica of several devices kept in lockstep by mirroring its engine calls
(sec. 5.2).

Every rank of a tensor-parallel replica holds a full ``VllmEngine`` built with vLLM's
``external_launcher`` executor; each forward all-reduces across the ranks, so the ranks
must run the same engine calls in the same order. Only rank 0 is driven (the scheduler's
requests, the shift steps): ``MirroredEngine`` broadcasts each call that changes the
engine (requests, steps, weight loads, KV and weight release and reallocation) to the
other ranks before running it, and each other rank's ``FollowerLoop`` applies that one
stream in order. A shift sent to every device of the replica then does its work on
rank 0 only; the followers' contexts do nothing themselves (``is_follower``), so a
follower can never release its weights while rank 0 is inside a step's all-reduce: its
release comes after that step in the stream.

The broadcast is ``torch.distributed.broadcast_object_list`` over a gloo group of the
replica's ranks with a long timeout (a replica can sit idle for a long time between
steps). A weight load crosses the group as a reference, not as tensors:
``MirroredEngine.load_weights_at`` sends the GPS version rank 0 Read, and each follower
Reads that same version from its own host's GPS (``FollowerLoop.reader``) and loads it;
each rank's vLLM weight loaders keep their shard of the full tensors. (``load_weights``
itself, mirrored with its tensors, stays for engines without a GPS.) Reading only the
rank's own shard is not built: vLLM's loaders take full tensors.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from pivot.errors import PivotError, StateError
from pivot.roles.engine.tp import broadcast_from

log = logging.getLogger(__name__)
R = TypeVar("R")

MIRRORED = ("submit", "abort", "step", "fail_running", "load_weights", "release_kv",
            "reallocate_kv", "release_weights", "release")
"""The ``VllmEngine`` calls that change engine state, in the order rank 0 ran them."""
_STOP = "__stop__"
_LOAD_AT = "__load_weights_at__"
GROUP_TIMEOUT = datetime.timedelta(days=7)


def replica_group():
    """A gloo group of every rank of this process's replica (its ``external_launcher``
    world), with ``GROUP_TIMEOUT``; a collective: every rank calls it once, after its
    engine is built."""
    import torch.distributed as dist

    return dist.new_group(backend="gloo", timeout=GROUP_TIMEOUT)


def _gather(obj: Any, group: Any) -> list:
    """Every rank's ``obj`` (picklable), in rank order, on every rank."""
    import torch.distributed as dist

    out: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


class MirroredEngine:
    """Rank 0's engine: the calls in ``MIRRORED`` go to every rank first; the rest
    (``live``, ``stats``, ``memory`` ...) read rank 0's engine."""

    def __init__(self, engine: Any, group: Any):
        self.engine, self.group = engine, group
        self.sent = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.engine, name)
        if name in MIRRORED:
            def call(*args: Any) -> Any:
                broadcast_from((name, args), self.group)
                self.sent += 1
                return attr(*args)
            return call
        return attr

    def load_weights_at(self, state: Any, ref: Any) -> float:
        """Loads ``state``, rank 0's Read of the parameters ``ref`` names (e.g. a model
        and its GPS version); every follower Reads ``ref`` itself (``FollowerLoop.reader``)
        and loads it, so no tensor crosses the replica's group. Every rank then reports
        how its load went: a follower's failure raises here, before the replica runs a
        step on ranks that hold different weights (it would fail or hang in a
        collective). Returns rank 0's seconds."""
        broadcast_from((_LOAD_AT, (ref,)), self.group)
        self.sent += 1
        err: BaseException | None = None
        try:
            secs = self.engine.load_weights(state)
        except BaseException as e:  # noqa: BLE001 - report to the ranks, then raise
            err = e
        failed = [f for f in _gather(None if err is None else repr(err), self.group) if f]
        if err is not None:
            raise err
        if failed:
            raise StateError(f"TP replica: loading {ref!r} failed on {failed}; its ranks hold "
                             f"different weights: shift the replica down and up again")
        return secs

    def close(self) -> None:
        """Ends the followers' loops."""
        broadcast_from((_STOP, ()), self.group)


class FollowerLoop:
    """A rank above 0: applies rank 0's engine calls in order, on a thread of its own.

    Answers ``call`` (reads for ``describe``) between two applied calls; refuses the
    request calls, which go to rank 0 only."""

    is_follower = True

    def __init__(self, engine: Any, group: Any):
        self.engine, self.group = engine, group
        self.reader: Callable[[Any], Any] | None = None
        """Reads the parameters a ``load_weights_at`` reference names, for this rank (set
        by the context that owns the rank's parameter source)."""
        self.lock = threading.Lock()
        self.applied = 0
        self.failed: list[str] = []
        self._thread = threading.Thread(target=self._run, name="tp-follower", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                op, args = broadcast_from(None, self.group)
            except RuntimeError as e:
                # rank 0's process is gone (its replica stopped, or it died): nothing
                # will be broadcast again, so this rank stops following
                log.warning("follower: the replica's group closed (%s); stopping",
                            str(e).splitlines()[0][:200])
                self.failed.append(f"group closed: {e}")
                return
            if op == _STOP:
                return
            with self.lock:
                try:
                    if op == _LOAD_AT:
                        self._load_at(*args)
                    else:
                        getattr(self.engine, op)(*args)
                except PivotError as e:
                    # rank 0 raised the same for the same call (its caller sees it there)
                    log.debug("follower: %s refused as on rank 0: %s", op, e)
                except BaseException as e:  # noqa: BLE001 - keep following; say why
                    log.exception("follower: %s failed", op)
                    self.failed.append(f"{op}: {type(e).__name__}: {e}")
                self.applied += 1

    def _load_at(self, ref: Any) -> None:
        # rank 0 Read this already: a failure here is this rank's alone, and rank 0
        # learns of it in the gather below (its load_weights_at raises)
        err = None
        try:
            if self.reader is None:
                raise StateError(f"rank 0 loaded {ref!r} but this rank has no reader to "
                                 f"Read it with (FollowerLoop.reader)")
            self.engine.load_weights(self.reader(ref))
        except BaseException as e:  # noqa: BLE001 - keep following; say why
            log.exception("follower: loading %r failed", ref)
            err = f"{type(e).__name__}: {e}"
            self.failed.append(f"{_LOAD_AT} {ref!r}: {err}")
        import torch.distributed as dist
        _gather(None if err is None else f"rank {dist.get_rank(self.group)}: {err}",
                self.group)

    def call(self, fn: Callable[[Any], R]) -> R:
        with self.lock:
            return fn(self.engine)

    def __getattr__(self, name: str) -> Any:
        if name in ("submit", "abort", "collect", "poll", "first_tokens", "wait"):
            raise StateError(f"{name}: this process is a follower rank of a tensor-parallel "
                             f"replica; requests go to the replica's first device (rank 0)")
        raise AttributeError(name)

    def close(self) -> None:
        self._thread.join(timeout=10)
