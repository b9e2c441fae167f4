"""A parameter store served by a Monarch actor, for slots in other procs (sec. 5.1).

Stands in for GPS (``pivot.gps``) until the driver wires that in: the store actor holds an
``InMemoryParameterSource``; ``ActorParameterSource`` is the picklable client a slot uses,
so every Read is a real cross-process transfer of real tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from monarch.actor import Actor, endpoint

from pivot.shifting.params import InMemoryParameterSource, StateDict


class ParameterStoreActor(Actor):
    """Holds every model's tensors; one per host."""

    def __init__(self, models: Mapping[str, StateDict]):
        self.source = InMemoryParameterSource(models)

    @endpoint
    def read(self, model: str, devices: tuple[int, ...], layout: Any = None) -> dict[int, StateDict]:
        return self.source.read(model, devices, layout)

    @endpoint
    def write(self, model: str, devices: tuple[int, ...], layout: Any,
              tensors: Mapping[int, StateDict]) -> None:
        self.source.write(model, devices, layout, tensors)


class ActorParameterSource:
    """``ParameterSource`` over a ``ParameterStoreActor`` mesh of one actor."""

    def __init__(self, store):
        self.store = store

    def read(self, model: str, devices: tuple[int, ...], layout: Any = None) -> dict[int, StateDict]:
        return self.store.read.call_one(model, tuple(devices), layout).get()

    def write(self, model: str, devices: tuple[int, ...], layout: Any,
              tensors: Mapping[int, StateDict]) -> None:
        self.store.write.call_one(model, tuple(devices), layout, dict(tensors)).get()
