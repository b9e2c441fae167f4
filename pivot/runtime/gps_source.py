"""The Global Parameter Storage (``pivot.gps``) as the slots' ``ParameterSource`` (sec. 5.1).

``GPSParameterSource`` is picklable: it carries the per-host ``GPSActor`` meshes and the GPS
layout, and each slot builds its own ``GlobalParameterStorage`` client on first use, so a
Read runs in the slot's proc (shared-memory copy from the host's store on the same host,
Monarch or NIXL across hosts). ``layout`` None means one replicated copy per device
(DP = number of devices, TP = PP = 1), which is every replica of the cluster driver.

A multi-device replica passes its layout P (:class:`TensorParallelReplicas`: TP = the
replica's size) and each of its slots Reads ``only`` itself: it receives its own TP shard,
about 1/k of the model, never a full copy (sec. 5.1, Read(M, G, P)).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ContextManager

from pivot.errors import ConfigError, StateError
from pivot.gps.actor import ActorHost
from pivot.gps.client import GlobalParameterStorage
from pivot.gps.layout import ModelMeta, ParallelLayout, StorageLayout, qwen3_split_dim
from pivot.shifting.params import StateDict
from pivot.types import INFERENCE_ROLES, MODEL_OF_ROLE, Role


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
                self.storage, self.device_host, holder=writer_id())
        return self._gps

    def layout(self, model: str, devices: tuple[int, ...], layout: Any) -> ParallelLayout:
        if layout is not None:
            return layout
        meta = self.models.get(model)
        if meta is None:
            raise StateError(f"GPS holds no model {model!r}; it holds {sorted(self.models)}")
        return ParallelLayout.create(meta, dp=len(devices))

    def read(self, model: str, devices: tuple[int, ...], layout: Any = None,
             only: Sequence[int] | None = None,
             version: int | None = None) -> dict[int, StateDict]:
        """Read(M, G, P); ``only``: the devices of G to read for (a slot: itself);
        ``version``: that version (default: the latest)."""
        devices = tuple(devices)
        return self.gps.read(model, devices, self.layout(model, devices, layout), only=only,
                             version=version)

    def latest(self, model: str) -> int | None:
        """The newest published version of ``model``."""
        return self.gps.latest(model)

    def pinned(self, model: str, version: int | None = None) -> ContextManager[int]:
        """``GlobalParameterStorage.pinned``: one version held on every host for a block."""
        return self.gps.pinned(model, version)

    def begin_write(self, model: str, devices: tuple[int, ...], layout: Any) -> Any:
        """A Write that several processes stage a part of (``GlobalParameterStorage``'s
        ``begin_write``; the ticket is picklable)."""
        return self.gps.begin_write(model, devices, self.layout(model, devices, layout))

    def write_part(self, ticket: Any, states: Mapping[int, StateDict],
                   only: tuple[int, ...]) -> Any:
        return self.gps.write_part(ticket, states, only=only)

    def finish_write(self, ticket: Any, parts: Sequence[Any]) -> int:
        return self.gps.finish_write(ticket, parts)

    def abort_write(self, ticket: Any, why: Any) -> None:
        self.gps.abort(ticket, why)

    def write(self, model: str, devices: tuple[int, ...], layout: Any,
              tensors: Mapping[int, StateDict]) -> None:
        devices = tuple(devices)
        self.gps.write(model, devices, self.layout(model, devices, layout), tensors)


@dataclass(frozen=True)
class TensorParallelReplicas:
    """The layout of each replica: an inference replica of k > 1 devices runs TP = k
    (sec. 5.1); one-device replicas and training get None (a full copy per device).

    Args:
        models: the models GPS holds, by name.
        split_dim: the TP split dim of a parameter (default: Qwen3's, Megatron-style).
        roles: the roles that run tensor parallel.
    """

    models: Mapping[str, ModelMeta]
    split_dim: Callable[[str, Sequence[int]], int | None] = qwen3_split_dim
    roles: tuple[Role, ...] = INFERENCE_ROLES

    def __call__(self, role: Role, devices: Sequence[int]) -> ParallelLayout | None:
        k = len(devices)
        if k < 2 or role not in self.roles:
            return None
        model = MODEL_OF_ROLE[role]
        meta = self.models.get(model)
        if meta is None:
            raise ConfigError(f"TensorParallelReplicas: no model {model!r} for {role.value} "
                              f"replicas (it has {sorted(self.models)}); add its ModelMeta")
        layout = ParallelLayout.create(meta, tp=k, split_dim=self.split_dim)
        for name, d in layout.split_dims:
            shape = next(p.shape for p in meta.params if p.name == name)
            if d is not None and shape[d] % k:
                raise ConfigError(f"{model}: a {role.value} replica of {k} devices needs "
                                  f"TP={k}, which does not divide dim {d} (size {shape[d]}) "
                                  f"of parameter {name}; use replicas of a size dividing "
                                  f"it, or mark the parameter replicated")
        return layout


@dataclass(frozen=True)
class FsdpShardLayouts:
    """The layout of each replica when training replicas Read only their FSDP shards: a
    training replica of k > 1 devices Reads under TP = k along dim 0 of every parameter,
    so rank r receives rows ``chunk_bounds(rows, k)[r:r + 2]`` of each HF tensor, about
    1/k of the model (sec. 5.1), which ``ChunkRows`` maps onto its FSDP2
    shards. That holds when the chunks line up with FSDP2's: k divides dim 0 of every
    parameter and the model's KV heads (torchtitan fuses q/k/v rows per KV group); other
    k get None (full copies, as before). Inference replicas get ``inference``'s layout.

    Args:
        models: the models GPS holds, by name.
        kv_heads: the KV heads of each trained model (its config.json).
        inference: the inference replicas' layout function (None: full copies).
    """

    models: Mapping[str, ModelMeta]
    kv_heads: Mapping[str, int]
    inference: Callable[[Role, Sequence[int]], ParallelLayout | None] | None = None

    def aligned(self, model: str, k: int) -> bool:
        meta = self.models.get(model)
        if meta is None or model not in self.kv_heads:
            return False
        return self.kv_heads[model] % k == 0 and all(
            p.shape and p.shape[0] % k == 0 for p in meta.params)

    def __call__(self, role: Role, devices: Sequence[int]) -> ParallelLayout | None:
        if role is not Role.TRAINING:
            return self.inference(role, devices) if self.inference is not None else None
        model, k = MODEL_OF_ROLE[role], len(devices)
        if k < 2 or not self.aligned(model, k):
            return None
        return ParallelLayout.create(self.models[model], tp=k, split_dim=_rows)


def _rows(name: str, shape: Sequence[int]) -> int:
    """Every parameter split along dim 0 (FSDP2's ``Shard(0)``)."""
    return 0


def writer_id(device: int | None = None) -> str:
    """The GPS Write lease holder of a device slot (``slot<d>``; the client's own process
    outside a slot): a slot restarted after a fault supersedes its own dead Write at once,
    and ``MeshController.poll_faults`` ends a dead slot's leases by this id (sec. 5.1)."""
    import os
    if device is None:
        dev = os.environ.get("PIVOT_SLOT_DEVICE")
        return f"slot{dev}" if dev is not None else f"client{os.getpid()}"
    return f"slot{device}"
