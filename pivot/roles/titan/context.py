"""Role context of the trainer: offload, reload and release (sec. 5.2).

The paper sorts a role's context into four categories: temporary (activations, buffers:
discard), parameters (discard, Read back from GPS), offloadable (optimizer state,
gradients: offload to host memory, reload) and preserved (process groups, definitions:
keep). Training shifts as a whole, so these helpers act on every tensor of the role.

The tensors are freed *in place*: a tensor's storage is resized to 0 bytes and later
resized back and refilled. The tensor objects survive, so the optimizer's state dict,
FSDP's sharded parameters and the DTensor wrappers stay valid and nothing is rebuilt.
On CPU the "host buffer" is a separate CPU tensor (a ``clone``); on a GPU the same code
copies to pinned host memory, so both copies run by DMA at full speed
(``launchers/gpu_check.py`` checks the round trip and the device memory returned).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch.distributed.tensor import DTensor

__all__ = [
    "CATEGORIES",
    "HostStash",
    "local_tensor",
    "storage_bytes",
    "free_storage",
    "restore_storage",
]

CATEGORIES = ("temporary", "parameters", "offloadable", "preserved")
"""The four context categories of sec. 5.2, in the words of the paper."""


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The rank-local tensor behind ``t`` (its shard when ``t`` is a DTensor)."""
    return t.to_local() if isinstance(t, DTensor) else t


def storage_bytes(tensors) -> int:
    """Bytes held by the distinct storages behind ``tensors`` (rank-local)."""
    seen: dict[int, int] = {}
    for t in tensors:
        s = local_tensor(t).untyped_storage()
        seen[s.data_ptr()] = max(seen.get(s.data_ptr(), 0), s.nbytes())
    return sum(seen.values())


def free_storage(t: torch.Tensor) -> int:
    """Frees the storage behind ``t`` in place; returns the bytes it held (0 if freed)."""
    s = local_tensor(t).untyped_storage()
    n = s.nbytes()
    if n:
        s.resize_(0)
    return n


def restore_storage(t: torch.Tensor, nbytes: int) -> None:
    """Gives ``t`` back a storage of ``nbytes`` (contents undefined until written)."""
    s = local_tensor(t).untyped_storage()
    if s.nbytes() != nbytes:
        s.resize_(nbytes)


@dataclass
class HostStash:
    """Host copies of device tensors that were freed in place, to be put back later.

    ``offload`` copies every tensor to a separate host buffer and frees the original's
    storage; ``reload`` restores the storage and copies the bytes back: the round trip is
    bit-exact. Tensors sharing a storage (views) are handled once per storage.
    """

    entries: list[tuple[torch.Tensor, torch.Tensor, int]] = field(default_factory=list)
    """(original tensor, host copy of its whole storage, storage bytes)."""

    @property
    def nbytes(self) -> int:
        return sum(n for _, _, n in self.entries)

    def __bool__(self) -> bool:
        return bool(self.entries)

    def offload(self, tensors, host: torch.device = torch.device("cpu")) -> tuple[int, float]:
        """Moves ``tensors`` to host buffers; returns (bytes, seconds)."""
        if self.entries:
            raise RuntimeError("HostStash.offload: already holds offloaded tensors; reload "
                               "them before offloading again")
        t0 = time.perf_counter()
        seen: set[int] = set()
        for t in tensors:
            loc = local_tensor(t)
            s = loc.untyped_storage()
            if s.nbytes() == 0 or s.data_ptr() in seen:
                continue
            seen.add(s.data_ptr())
            whole = torch.empty(0, dtype=torch.uint8, device=loc.device).set_(s)
            copy = torch.empty(s.nbytes(), dtype=torch.uint8, device=host,
                               pin_memory=loc.device.type == "cuda" and host.type == "cpu")
            copy.copy_(whole)
            n = s.nbytes()
            s.resize_(0)
            self.entries.append((loc, copy, n))
        return self.nbytes, time.perf_counter() - t0

    def reload(self) -> tuple[int, float]:
        """Restores every offloaded storage from its host copy; returns (bytes, seconds)."""
        t0 = time.perf_counter()
        n_total = self.nbytes
        for loc, copy, n in self.entries:
            s = loc.untyped_storage()
            s.resize_(n)
            torch.empty(0, dtype=torch.uint8, device=loc.device).set_(s).copy_(copy)
        self.entries.clear()
        return n_total, time.perf_counter() - t0
