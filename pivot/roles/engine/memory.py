"""Releasing an engine's KV cache and weights on a shift down, without sleep mode.

vLLM's sleep mode is not supported on CPU (``CPUWorker.sleep`` logs and frees nothing;
``discard`` raises). Both are released here by shrinking the underlying storages to zero
bytes (``UntypedStorage.resize_(0)``), the trick FSDP uses for unsharded parameters: the
tensor objects (and every view the attention layers and the model runner hold) survive,
so a shift up only resizes the storages back; the KV contents are garbage after that, so
the prefix cache must be reset. On the CPU backend linear weights are repacked into
oneDNN / sgl handles that live inside each layer's ``cpu_linear`` closure; releasing the
weights drops those closures (``reload_weights`` rebuilds them).

Sec. 5.2: KV cache is temporary context (discard / reallocate), weights are parameters
(discard / Read from GPS).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
from torch import nn

from pivot.errors import StateError


def _released_linear(*args, **kwargs):
    raise StateError("generator weights are released (shifted down); load parameters first")


@dataclass
class StorageSet:
    """Storages to release, with their original sizes (deduplicated by storage)."""

    storages: list[tuple[torch.UntypedStorage, int]] = field(default_factory=list)
    released: bool = False

    @classmethod
    def of(cls, tensors) -> "StorageSet":
        seen: dict[int, tuple[torch.UntypedStorage, int]] = {}
        for t in tensors:
            s = t.untyped_storage()
            if s.nbytes() > 0:
                seen.setdefault(s.data_ptr(), (s, s.nbytes()))
        return cls(list(seen.values()))

    @property
    def nbytes(self) -> int:
        return sum(n for _, n in self.storages)

    def release(self) -> int:
        """Frees every storage; returns the bytes released (0 if already released)."""
        if self.released:
            return 0
        for s, _ in self.storages:
            s.resize_(0)
        self.released = True
        return self.nbytes

    def restore(self) -> None:
        """Reallocates every storage at its old size (contents undefined)."""
        if not self.released:
            return
        for s, n in self.storages:
            s.resize_(n)
        self.released = False


def kv_storages(model_runner) -> StorageSet:
    """The KV cache tensors of a vLLM CPU model runner."""
    return StorageSet.of(model_runner.kv_caches)


def weight_storages(model: nn.Module) -> StorageSet:
    """Every parameter storage with data (embedding, norms, unpacked weights)."""
    return StorageSet.of(p for _, p in model.named_parameters())


def drop_packed_linears(model: nn.Module) -> int:
    """Replaces each layer's ``cpu_linear`` closure (it holds the packed weight) with one
    that raises; returns how many were dropped."""
    n = 0
    for m in model.modules():
        if callable(getattr(m, "cpu_linear", None)) and m.cpu_linear is not _released_linear:
            m.cpu_linear = _released_linear
            n += 1
    return n


def process_rss(pid: int | str = "self") -> int:
    """Resident bytes of one process (``/proc/<pid>/statm``)."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def tree_pids(root: int) -> list[int]:
    """``root`` and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def tree_rss(root: int) -> tuple[int, dict[int, int]]:
    """Total resident bytes of ``root`` and its descendants, and the per-pid split."""
    per: dict[int, int] = {}
    for p in tree_pids(root):
        try:
            per[p] = process_rss(p)
        except OSError:
            continue
    return sum(per.values()), per
