"""Data staleness (app. E, footnote 4): the policy version that generated a trajectory lags
the version being trained on it by at most ``staleness`` (2 in every experiment).

Rollout of step s may start only when the policy version is >= s - staleness; step s is
trained on version s. Both checks raise ``StateError``: the bound is asserted, never
repaired.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pivot.errors import ConfigError, StateError


@dataclass(frozen=True, slots=True)
class StalenessBound:
    """Attributes:
        staleness: max version lag; 0 is synchronous (colocated). No default: the
            deployment's (``Deployment.staleness``).
    """

    staleness: int

    def __post_init__(self) -> None:
        if self.staleness < 0:
            raise ConfigError(f"staleness must be >= 0, got {self.staleness}")

    def may_start(self, step: int, version: int) -> bool:
        """Rollout of ``step`` may start on policy ``version``."""
        return version >= step - self.staleness

    def check_start(self, step: int, version: int) -> None:
        if not self.may_start(step, version):
            raise StateError(f"rollout of step {step} started on policy version {version}: "
                             f"lag {step - version} > staleness {self.staleness}")

    def check_batch(self, step: int, version: int, start_versions: Iterable[int]) -> int:
        """Asserts the bound for a batch about to train at ``version``; returns the max lag."""
        if version != step:
            raise StateError(f"batch of step {step} trains on version {version}; step s "
                             f"must train on version s")
        lag = max((version - v for v in start_versions), default=0)
        if lag > self.staleness:
            raise StateError(f"step {step}: a trajectory started on version {version - lag},"
                             f" lag {lag} > staleness {self.staleness}")
        return lag
