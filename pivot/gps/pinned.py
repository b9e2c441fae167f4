"""GPS arenas as pinned host memory for host-device copies (sec. 5.1, appendix B.2).

A Read on a GPU copies slices of a host's arena (a ``/dev/shm`` file the reader maps)
into the device's parameters over PCIe. From pageable memory the CUDA driver stages every
copy through a bounce buffer, synchronously; from page-locked memory it is one DMA that
runs asynchronously on the stream. Allocating the arena pinned is not possible (it is a
shared file that other processes map too), so the reader *registers* its mapping with the
driver (``cudaHostRegister``): once per mapping, since registering pins every page and
costs about as much as copying them, and unregistered only when the mapping is dropped.

``PinnedArenas`` keeps that bookkeeping for one process; ``ShmTransport`` uses it for
every copy whose other end is on a CUDA device and never otherwise, so a CPU run never
touches it. The register/unregister calls are injectable so the bookkeeping is tested
on machines without a GPU; ``launchers/gpu_check_gps.py`` runs the real ones.
"""

from __future__ import annotations

from typing import Callable

import torch

from pivot.errors import StateError


def _cuda_register(ptr: int, nbytes: int) -> None:
    # cudaHostRegisterPortable (1): the pages are pinned for every CUDA context of this
    # process, not only the current device's (a slot proc may drive more than one).
    err = int(torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 1))
    if err:
        raise StateError(f"cudaHostRegister of a {nbytes}-byte GPS arena failed (cudaError "
                         f"{err}); raise the locked-memory limit (ulimit -l) or lower "
                         f"Backend.gps_host_gb")


def _cuda_unregister(ptr: int) -> None:
    err = int(torch.cuda.cudart().cudaHostUnregister(ptr))
    if err:
        raise StateError(f"cudaHostUnregister of a GPS arena failed (cudaError {err})")


class PinnedArenas:
    """The arena mappings this process registered with the CUDA driver, by address.

    Args:
        register / unregister: the driver calls (default: CUDA's ``cudaHostRegister`` /
            ``cudaHostUnregister``).
    """

    def __init__(self, register: Callable[[int, int], None] = _cuda_register,
                 unregister: Callable[[int], None] = _cuda_unregister) -> None:
        self._register, self._unregister = register, unregister
        self._live: set[int] = set()
        """data_ptr of every registered mapping."""
        self.registered_bytes = 0
        """Bytes registered over this object's life (a measure of the one-off cost)."""

    def ensure(self, arena: torch.Tensor) -> bool:
        """Registers ``arena``'s memory unless it is already; True if it registered now."""
        ptr = arena.data_ptr()
        if ptr in self._live:
            return False
        nbytes = arena.numel() * arena.element_size()
        self._register(ptr, nbytes)
        self._live.add(ptr)
        self.registered_bytes += nbytes
        return True

    def drop(self, arena: torch.Tensor) -> None:
        """Unregisters ``arena`` (before its mapping goes away); no-op if it never was."""
        ptr = arena.data_ptr()
        if ptr in self._live:
            self._live.discard(ptr)
            self._unregister(ptr)

    def close(self) -> None:
        while self._live:
            self._unregister(self._live.pop())

    def __contains__(self, arena: torch.Tensor) -> bool:
        return arena.data_ptr() in self._live

    def __len__(self) -> int:
        return len(self._live)


def on_device(tensors) -> torch.device | None:
    """The first non-CPU device among ``tensors``, or None when all are on the CPU."""
    for t in tensors:
        if t.device.type != "cpu":
            return t.device
    return None
