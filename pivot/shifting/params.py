"""Where a shift up Reads parameters from: the ``ParameterSource`` port (sec. 5.1).

The Global Parameter Storage implements it (``pivot.runtime.gps_source`` adapts
``pivot.gps``); ``InMemoryParameterSource`` holds real CPU tensors in one process, for pure
tests and the simulator.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import torch

from pivot.errors import StateError

StateDict = dict[str, torch.Tensor]


class ParameterSource(Protocol):
    """Read(M, G, P) and Write(M, G, P) of sec. 5.1.

    ``read`` returns, for every device in ``devices``, its part of model ``model`` under
    ``layout`` (None: the full model on every device), as Hugging Face name -> tensor.
    A source that takes a layout also takes ``only=`` (the devices to read for; a slot of a
    multi-device replica reads itself only, see ``pivot.runtime.gps_source``).
    """

    def read(self, model: str, devices: tuple[int, ...],
             layout: Any = None) -> dict[int, StateDict]:
        ...

    def write(self, model: str, devices: tuple[int, ...], layout: Any,
              tensors: Mapping[int, StateDict]) -> None:
        ...


class InMemoryParameterSource:
    """Every model fully replicated in this process's memory (layout None only)."""

    def __init__(self, models: Mapping[str, StateDict]):
        self._models = {m: {k: v.detach().clone() for k, v in sd.items()}
                        for m, sd in models.items()}

    def models(self) -> tuple[str, ...]:
        return tuple(self._models)

    def read(self, model: str, devices: tuple[int, ...],
             layout: Any = None) -> dict[int, StateDict]:
        sd = self._model(model, layout, "read")
        return {d: {k: v.clone() for k, v in sd.items()} for d in devices}

    def write(self, model: str, devices: tuple[int, ...], layout: Any,
              tensors: Mapping[int, StateDict]) -> None:
        sd = self._model(model, layout, "write")
        if not devices:
            raise StateError(f"write of {model}: no devices given")
        new = tensors[devices[0]]
        if set(new) != set(sd):
            raise StateError(f"write of {model}: names differ from the stored model; missing "
                             f"{sorted(set(sd) - set(new))[:5]}, extra "
                             f"{sorted(set(new) - set(sd))[:5]}")
        for k, v in new.items():
            if v.shape != sd[k].shape or v.dtype != sd[k].dtype:
                raise StateError(f"write of {model}: {k} is {tuple(v.shape)} {v.dtype}, "
                                 f"stored {tuple(sd[k].shape)} {sd[k].dtype}")
        self._models[model] = {k: v.detach().clone() for k, v in new.items()}

    def _model(self, model: str, layout: Any, op: str) -> StateDict:
        if layout is not None:
            raise StateError(f"{op} of {model}: InMemoryParameterSource holds replicated "
                             f"models only; pass layout=None or use pivot.gps")
        try:
            return self._models[model]
        except KeyError:
            raise StateError(f"{op}: unknown model {model!r}; the source holds "
                             f"{sorted(self._models)}") from None
