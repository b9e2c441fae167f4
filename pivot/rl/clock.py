"""The RL loop's injectable clock: wall time (tests use ``pivot.testing.rl.ManualClock``,
whose time advances only when a coroutine sleeps)."""

from __future__ import annotations

import asyncio
import time


class WallClock:
    """Monotonic wall time; ``sleep`` yields to the other coroutines."""

    def __call__(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
