"""A ``LiveSource`` for the incremental checker without a journal (tests only; see
``pivot.testing``). The sim driver's source is ``pivot.reliability.sim_state.SimSource``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pivot.reliability.incremental import Touched
from pivot.reliability.invariants import ControlState, EngineReplica
from pivot.scheduler.scheduler import ShiftAwareScheduler
from pivot.shifting.device_map import DeviceMap
from pivot.types import Role


@dataclass
class StaticSource:
    """A ``LiveSource`` over a ``ControlState`` whose parts are mutated in place (a test
    mutates it and records each change in ``touched`` itself)."""

    state: ControlState
    touched: Touched = field(default_factory=Touched)

    @property
    def schedulers(self) -> Mapping[Role, ShiftAwareScheduler]:
        return self.state.schedulers

    @property
    def device_map(self) -> DeviceMap:
        return self.state.device_map

    def engine(self, rid: str) -> EngineReplica | None:
        return None if self.state.engines is None else self.state.engines.get(rid)

    def engine_count(self) -> int | None:
        return None if self.state.engines is None else len(self.state.engines)

    def training_devices(self) -> tuple[int, ...]:
        return self.state.training_devices

    def counters(self) -> tuple[int, int, int]:
        return self.state.version, self.state.released, self.state.staleness

    def expected(self) -> Mapping[Role, set[int]] | None:
        return self.state.expected_live

    def full_state(self) -> ControlState:
        return self.state
