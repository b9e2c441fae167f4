"""Remote calls started together and waited for together, written once for both callers.

Code that talks to device slots (the generator port, the fleet, the executor's
migrations) is written as a generator that *yields* the calls it has started, a
``{key: pending call}`` dict, and is sent back ``{key: result or the exception raised}``.
Two runners drive it: ``run_blocking`` waits with ``.get()`` (provisioning, tests, a
thread), ``run_async`` awaits (the RL loop's event loop, which keeps serving its other
coroutines meanwhile; a blocking ``.get()`` there would stall them, and Monarch warns
about it). The state changes between two waits run on the caller's thread either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator, Mapping
from typing import Any, TypeVar

R = TypeVar("R")
Calls = Mapping[Any, Any]
"""Started calls: each has ``get()`` and, if it can be awaited, ``async wait()``."""
Steps = Generator[Calls, dict, R]


class Done:
    """A call that already finished (a handle without ``start``, or one that raised)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def get(self) -> Any:
        if isinstance(self.value, BaseException):
            raise self.value
        return self.value

    async def wait(self) -> Any:
        return self.get()


def wait_all(calls: Calls) -> dict:
    """Every call's result, or the exception it raised (each call is waited for, so one
    failure never leaves another's result unread)."""
    out = {}
    for k, p in calls.items():
        try:
            out[k] = p.get()
        except Exception as e:  # noqa: BLE001 - handed back to the steps
            out[k] = e
    return out


async def wait_all_async(calls: Calls) -> dict:
    """``wait_all`` on an event loop: awaits calls that can be awaited."""
    out = {}
    for k, p in calls.items():
        try:
            out[k] = await p.wait() if hasattr(p, "wait") else p.get()
        except Exception as e:  # noqa: BLE001 - handed back to the steps
            out[k] = e
    return out


def run_blocking(steps: Steps[R]) -> R:
    """Drives ``steps`` to its return value, blocking on each round of calls."""
    try:
        calls = next(steps)
        while True:
            calls = steps.send(wait_all(calls))
    except StopIteration as stop:
        return stop.value


async def run_async(steps: Steps[R]) -> R:
    """Drives ``steps`` to its return value, awaiting each round of calls."""
    try:
        calls = next(steps)
        while True:
            calls = steps.send(await wait_all_async(calls))
    except StopIteration as stop:
        return stop.value


async def settle(value: Any) -> Any:
    """``value``, awaited first if it is awaitable: ports may be plain or async."""
    if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future) \
            or hasattr(value, "__await__"):
        return await value
    return value
