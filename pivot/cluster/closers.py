"""Closing a run's resources in reverse order, without letting one failure stop the rest."""

from __future__ import annotations

import logging
from typing import Callable

log = logging.getLogger(__name__)


def run_closers(closers: list[Callable[[], object]]) -> None:
    """Calls every close function, last registered first, logging (not raising) failures,
    and empties the list."""
    for fn in reversed(closers):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - keep closing the rest
            log.warning("close: %s", e)
    closers.clear()
