"""What the RL loop needs from a driver: four small ports (docs/design.md, "One control
plane, two drivers, two backends"). The cluster driver implements them over vLLM engines
in Monarch device slots and the torchtitan trainer; tests implement them in memory.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pivot.errors import PivotError
from pivot.rl.trajectory import PromptGroup, Trajectory


@dataclass(frozen=True, slots=True)
class Response:
    """A finished policy response."""

    traj_id: int
    tokens: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    tokens_processed: int
    """Prompt + generated tokens (end-to-end throughput counts these, sec. 8.3)."""


@dataclass(frozen=True, slots=True)
class Judgement:
    """A finished GenRM judgement of one response."""

    traj_id: int
    text: str
    tokens_processed: int
    generated: int = 0
    """Tokens the GenRM wrote (the judgement's length)."""


@dataclass(frozen=True, slots=True)
class LoopStatus:
    """What the control plane is told at each tick."""

    version: int
    batch_ready: bool
    rollout_pending: int
    reward_pending: int
    oldest_rollout_done: bool


class RolloutPort(Protocol):
    def submit(self, trajs: Sequence[Trajectory]) -> None: ...
    def poll(self) -> list[Response]: ...


class RewardPort(Protocol):
    def submit(self, trajs: Sequence[Trajectory]) -> None: ...
    def poll(self) -> list[Judgement]: ...


class TrainingLost(PivotError):
    """The training replica died during a step, before the step changed anything the run
    keeps (the published policy, the kept optimizer state): the batch stays in place and
    trains again once training is back on other devices (``TrainerPort.train``)."""


class TrainerPort(Protocol):
    def ready(self) -> bool:
        """Training holds its devices and may start a step."""
        ...

    def train(self, groups: Sequence[PromptGroup], version: int) -> dict[str, float]:
        """One policy update on the batch (blocking); metrics. Raises ``TrainingLost`` if
        its devices died mid-step (the loop trains the batch again)."""
        ...

    def publish(self, version: int, on_written: Callable[[], object]) -> dict[str, float]:
        """GPS Write of the new policy; rollout replicas Read it (sec. 5.1). Calls
        ``on_written`` once the Write committed, before the Read (the loop's version
        advances there). Raises ``TrainingLost`` if its devices died before the Write
        committed, having gone back to its state before the step (the loop trains the
        batch again)."""
        ...

    def state(self) -> dict[str, Any]:
        """Policy weights and optimizer state, for a checkpoint."""
        ...

    def load_state(self, state: dict[str, Any]) -> None: ...


class ControlPort(Protocol):
    def tick(self, status: LoopStatus) -> Awaitable[None] | None:
        """Monitor -> planner -> executor, once (sec. 4 workflow). May be a coroutine:
        the loop awaits it, and its other coroutines run while a shift is awaited."""
        ...

    def set_busy(self, busy: bool) -> None:
        """Training started or ended a step."""
        ...

    def allocation(self) -> dict[str, Any]:
        """Devices per role now (checkpointed, traced)."""
        ...
