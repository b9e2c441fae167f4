"""What one version of a model is on one GPS host (paper sec. 5.1, app. B.1): the
``Manifest`` of its arena (where each shard lies) and the ``checksum`` a Write verifies
each shard with before it commits. Both are picklable and cross process boundaries."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pivot.gps.layout import torch_dtype

__all__ = ["Manifest", "ShardKey", "checksum"]

ShardKey = tuple[str, int]
"""(parameter name, GPS shard index)."""

_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def checksum(t: torch.Tensor) -> int:
    """A cheap checksum of a (possibly strided) tensor's bytes: the sum of its words as
    unsigned integers, mod 2**64 (numpy, single-threaded: about memory speed; torch's
    integer sum was 10x slower here).

    Catches corrupted, truncated or stale bytes; not order-sensitive, not cryptographic.
    """
    words = t.view(_INT[t.element_size()]).numpy().view(_UINT[t.element_size()])
    return int(words.sum(dtype=np.uint64))


@dataclass(frozen=True, slots=True)
class Manifest:
    """Where one version of one model lies in one host's arena (picklable)."""

    host: int
    model: str
    version: int
    path: str
    nbytes: int
    entries: tuple[tuple[ShardKey, int, tuple[int, ...], str], ...]
    """(shard key, byte offset, shape, dtype) per shard this host holds."""

    def views(self, arena: torch.Tensor) -> dict[ShardKey, torch.Tensor]:
        """The shard tensors inside a mapped ``arena`` (uint8, ``nbytes`` long)."""
        out = {}
        for key, off, shape, dtype in self.entries:
            dt = torch_dtype(dtype)
            n = dt.itemsize
            for s in shape:
                n *= s
            out[key] = arena[off:off + n].view(dt).view(shape)
        return out
