"""Started slot calls (one call, a replica's shift, a training Write), waited for blocking
(``get``) or on an event loop (``wait``). A role call's ``Pending`` comes from the
controller's typed handles (``MeshController.engine`` / ``trainer``), typed by the
endpoint's answer (``Pending[list[str | None]]`` for ``submit``).

A Monarch call to an actor whose process died never answers: it waits out its timeout
(15 minutes on the cluster driver's stack), although supervision reports the death in
seconds (about 8 s after a SIGKILL here; ``MeshController._on_fault``). A call that knows
its process (``died``) waits in short slices and raises ``SlotProcessDied`` as soon as
that process is reported dead (``pivot.cluster.faults`` acts on it); a call made after
Monarch knew raises Monarch's ``SupervisionError`` at once, turned into
``SlotProcessDied`` too. Monarch's ``Future.get(timeout)`` does not consume the future on
a timeout, so slicing loses no result.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pivot.compat.monarch import supervision_error
from pivot.errors import StateError
from pivot.types import MODEL_OF_ROLE, Role

if TYPE_CHECKING:
    from pivot.runtime.mesh import MeshController

T = TypeVar("T")

DEATH_POLL_S = 0.5
"""How often a waiting call looks at whether its process was reported dead."""


class SlotProcessDied(StateError):
    """The process a call was waiting on died (reported by Monarch's supervision)."""


class Pending(Generic[T]):
    """A started slot call whose answer is a ``T``.

    Args:
        fut: the Monarch future of the call.
        timeout: seconds to wait in all (None: no limit).
        died: whether the call's process was reported dead (None: not watched).
        what: the call's process, for the error.
    """

    def __init__(self, fut: Any, timeout: float | None,
                 died: Callable[[], bool] | None = None, what: str = "a slot"):
        self.fut, self.timeout, self.died, self.what = fut, timeout, died, what

    def _deadline(self) -> float:
        return time.monotonic() + self.timeout if self.timeout is not None else math.inf

    def _dead(self) -> SlotProcessDied:
        return SlotProcessDied(f"{self.what}: its process died (supervision); the call's "
                               f"answer will never come")

    def get(self, within: float | None = None) -> T:
        """The call's answer; ``within``: wait at most that long (less than the call's
        timeout; TimeoutError after it)."""
        if self.died is None:
            t = self.timeout if within is None else min(within, self.timeout or math.inf)
            return self.fut.get(timeout=t)
        deadline = self._deadline()
        if within is not None:
            deadline = min(deadline, time.monotonic() + within)
        while True:
            if self.died():
                raise self._dead()
            left = deadline - time.monotonic()
            try:
                return self.fut.get(timeout=max(0.0, min(DEATH_POLL_S, left)))
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise
            except supervision_error() as e:   # a call made after Monarch knew
                raise self._dead() from e

    async def wait(self) -> T:
        """``get`` for a caller on an asyncio loop (the loop keeps running)."""
        if self.died is None:
            return await asyncio.wait_for(awaitable(self.fut), self.timeout)
        task = asyncio.ensure_future(awaitable(self.fut))
        deadline = self._deadline()
        try:
            while True:
                left = deadline - time.monotonic()
                done, _ = await asyncio.wait({task}, timeout=max(0.0, min(DEATH_POLL_S,
                                                                          left)))
                if done:
                    try:
                        return task.result()
                    except supervision_error() as e:
                        raise self._dead() from e
                if self.died():
                    raise self._dead()
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{self.what}: no answer in {self.timeout} s")
        finally:
            if not task.done():
                task.cancel()


class PendingShift:
    """A started shift on a replica's slots (``start_shift_down`` / ``start_shift_up``):
    one ``Pending`` per slot, their results combined into the replica's."""

    def __init__(self, calls: list[Pending[Any]], combine: Callable[[list], Any]):
        self.calls, self.combine = calls, combine

    def get(self) -> Any:
        return self.combine([c.get() for c in self.calls])

    async def wait(self) -> Any:
        """``get`` for a caller on an asyncio loop (the loop keeps running)."""
        return self.combine([await c.wait() for c in self.calls])


class PendingWrite:
    """A training replica's Write (``MeshController.write_back_replica``): one Write fed
    by every rank, or rank 0's Write of gathered tensors. It keeps the controller's
    bookkeeping of Writes in flight (``_writing``: no shift of these devices meanwhile)."""

    def __init__(self, ctl: MeshController, devices: tuple[int, ...], layout: Any):
        self.ctl, self.devices, self.layout = ctl, devices, layout
        self.t0 = time.perf_counter()
        self.ticket = None
        ctl._check_not_writing("a second training Write", devices)
        # the training procs, fixed now: the Write's calls go to them however late its
        # thread runs, and the controller refuses shifts of these devices until it ends
        self.actors = [ctl.actor(d, Role.TRAINING) for d in devices]
        self.keys = [ctl._key(d, Role.TRAINING) for d in devices]
        ctl._writing.update(devices)
        if layout is None:   # every slot gathers (collective); rank 0 Writes
            self.futs = self._calls(lambda a: a.write_back.call_one())

    def _calls(self, call: Callable[[Any], Any]) -> list[Pending[Any]]:
        """``call(actor)`` started on each training proc of the replica."""
        return [self.ctl._pending(d, k, call(a))
                for d, k, a in zip(self.devices, self.keys, self.actors)]

    def _begin(self) -> list[Pending[Any]]:
        model = MODEL_OF_ROLE[Role.TRAINING]
        ticket = self.ctl.source.begin_write(model, self.devices, self.layout)
        self.ticket = ticket
        return self._calls(lambda a: a.write_part.call_one(ticket))

    def _done(self) -> None:
        self.ctl._writing.difference_update(self.devices)

    def _abort(self, e: BaseException) -> None:
        if self.ticket is not None:
            self.ctl.source.abort_write(self.ticket, e)

    def get(self) -> float:
        try:
            if self.layout is None:
                for p in self.futs:
                    p.get()
                return time.perf_counter() - self.t0
            futs = self._begin()
            try:
                parts = [f.get() for f in futs]
            except BaseException as e:
                self._abort(e)
                raise
            self.ctl.source.finish_write(self.ticket, parts)
            return time.perf_counter() - self.t0
        finally:
            self._done()

    async def wait(self) -> float:
        """``get`` for a caller on an asyncio loop (the loop keeps running)."""
        try:
            if self.layout is None:
                for p in self.futs:
                    await p.wait()
                return time.perf_counter() - self.t0
            futs = await asyncio.to_thread(self._begin)
            try:
                parts = [await f.wait() for f in futs]
            except BaseException as e:
                await asyncio.to_thread(self._abort, e)
                raise
            await asyncio.to_thread(self.ctl.source.finish_write, self.ticket, parts)
            return time.perf_counter() - self.t0
        finally:
            self._done()


async def awaitable(fut: Any) -> Any:
    return await fut
