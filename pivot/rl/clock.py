"""Injectable clocks for the RL loop: wall time, or a manual clock for tests."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass


class WallClock:
    """Monotonic wall time; ``sleep`` yields to the other coroutines."""

    def __call__(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@dataclass
class ManualClock:
    """Time advances only when a coroutine sleeps (deterministic under asyncio's FIFO
    order): ``sleep(dt)`` adds dt and yields once."""

    t: float = 0.0

    def __call__(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds
        await asyncio.sleep(0)
