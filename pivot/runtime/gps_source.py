"""The Global Parameter Storage (``pivot.gps``) as the slots' ``ParameterSource`` (sec. 5.1).

``GPSParameterSource`` is picklable: it carries the per-host ``GPSActor`` meshes and the GPS
layout, and each slot builds its own ``GlobalParameterStorage`` client on first use, so a
Read runs in the slot's proc (shared-memory copy from the host's store on the same host,
Monarch or NIXL across hosts). ``layout`` None means one replicated copy per device
(DP = number of devices, TP = PP = 1), which is every replica of the local driver.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pivot.errors import StateError
from pivot.gps.actor import ActorHost, GlobalParameterStorage
from pivot.gps.layout import ModelMeta, ParallelLayout, StorageLayout
from pivot.shifting.params import StateDict


class GPSParameterSource:
    """Read(M, G, P) / Write(M, G, P) through a per-process GPS client.

    Args:
        hosts: one single-actor ``GPSActor`` mesh per GPS host, in host order.
        models: the models GPS holds.
        storage: the GPS layout (``plan_storage``).
        device_host: host of every device of the pool.
    """

    def __init__(self, hosts: Sequence[Any], models: Mapping[str, ModelMeta],
                 storage: StorageLayout, device_host: Sequence[int]):
        self.hosts, self.models = list(hosts), dict(models)
        self.storage, self.device_host = storage, tuple(device_host)
        self._gps: GlobalParameterStorage | None = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_gps"] = None
        return state

    @property
    def gps(self) -> GlobalParameterStorage:
        if self._gps is None:
            self._gps = GlobalParameterStorage(
                [ActorHost(i, a) for i, a in enumerate(self.hosts)], self.models,
                self.storage, self.device_host)
        return self._gps

    def layout(self, model: str, devices: tuple[int, ...], layout: Any) -> ParallelLayout:
        if layout is not None:
            return layout
        meta = self.models.get(model)
        if meta is None:
            raise StateError(f"GPS holds no model {model!r}; it holds {sorted(self.models)}")
        return ParallelLayout.create(meta, dp=len(devices))

    def read(self, model: str, devices: tuple[int, ...], layout: Any = None) -> dict[int, StateDict]:
        devices = tuple(devices)
        return self.gps.read(model, devices, self.layout(model, devices, layout))

    def write(self, model: str, devices: tuple[int, ...], layout: Any,
              tensors: Mapping[int, StateDict]) -> None:
        devices = tuple(devices)
        self.gps.write(model, devices, self.layout(model, devices, layout), tensors)
