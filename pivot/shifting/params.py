"""Where a shift up Reads parameters from: the ``ParameterSource`` port (sec. 5.1).

The Global Parameter Storage implements it (``pivot.runtime.gps_source`` adapts
``pivot.gps``); tests use ``pivot.testing.shifting.InMemoryParameterSource`` (real CPU
tensors in one process).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import torch

StateDict = dict[str, torch.Tensor]


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes held by ``tensors`` (e.g. a state dict's values)."""
    return sum(t.numel() * t.element_size() for t in tensors)


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
