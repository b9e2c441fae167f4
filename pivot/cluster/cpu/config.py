"""The ``cpu`` backend's setting: the fixed CPU share of a device slot (sec. 8.1's devices,
on this machine's cores; ``pivot.cluster.cpu.cgroups`` applies it)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import gin

from pivot.config.validation import check_range


@gin.configurable
@dataclass(frozen=True)
class CpuConfig:
    """Attributes:
        share: fraction of one core per slot (a cgroup v1 CFS quota, so an idle slot's
            time is lost as an idle GPU's is); 0: no quota (on GPUs a slot is a GPU:
            ``gin/backends/cuda.gin``). 0.5: the default group's 4 slots on 2 cores.
    """

    share: float = 0.5

    def __post_init__(self) -> None:
        cores = os.cpu_count() or 1
        check_range("CpuConfig.share", self.share, 0, cores,
                    why=f"fraction of one core per slot; 0: no cap; {cores} cores here")
