"""A fixed CPU share per device slot, so an idle slot's compute is really lost, as an idle
GPU's is (docs/stack.md, "Giving a device slot a fixed CPU share").

Choice: cgroup v1 CFS quota, one group ``/sys/fs/cgroup/cpu/pivot_<run>_slot<d>`` per slot
proc with ``cpu.cfs_quota_us = share * cfs_period_us`` (2 cores / 4 slots = 50% each), and
the slot's engine bound to core ``d % 2``. A slot may not borrow an idle slot's time. The
groups are removed at close (processes are moved back to the root group first).

A slot's CPU seconds come from ``cpuacct.usage``: in the ``cpu`` group itself where the two
controllers are co-mounted (``cpu,cpuacct``), else from a twin group under
``/sys/fs/cgroup/cpuacct`` (some hosts mount them apart; without the twin, every step's
``cpu_s`` was empty there).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

ROOT = Path("/sys/fs/cgroup/cpu")
ACCT_ROOT = Path("/sys/fs/cgroup/cpuacct")


@dataclass
class SlotCpuShares:
    """Attributes:
        share: fraction of one core per slot (0.5 = 50%); None or <= 0 disables (no
            default: ``CpuConfig.share``'s, or a launcher's flag).
        name: prefix of the cgroup folders.
        period_us: CFS period.
        root / acct_root: the ``cpu`` and ``cpuacct`` hierarchies (tests point them
            elsewhere).
    """

    share: float | None
    name: str = "pivot"
    period_us: int = 100_000
    root: Path = ROOT
    acct_root: Path = ACCT_ROOT
    groups: dict[int, Path] = field(default_factory=dict)
    acct_groups: dict[int, Path] = field(default_factory=dict)

    @property
    def available(self) -> bool:
        return bool(self.share and self.share > 0 and self.root.is_dir()
                    and os.access(self.root, os.W_OK))

    @property
    def separate_acct(self) -> bool:
        """Whether cpuacct is mounted apart from cpu (its usage then needs a twin group)."""
        return (not (self.root / "cpuacct.usage").is_file()
                and (self.acct_root / "cpuacct.usage").is_file()
                and os.access(self.acct_root, os.W_OK))

    def assign(self, device: int, pid: int) -> bool:
        """Moves ``pid`` (the slot's proc, all its threads) into the slot's group."""
        if not self.available:
            log.warning("no writable cgroup v1 cpu controller: slot %d runs without a CPU "
                        "cap", device)
            return False
        if not self.groups:
            sweep_stale(self.root)
            if self.separate_acct:
                sweep_stale(self.acct_root)
        g = self.root / f"{self.name}_slot{device}"
        g.mkdir(exist_ok=True)
        (g / "cpu.cfs_period_us").write_text(str(self.period_us))
        (g / "cpu.cfs_quota_us").write_text(str(int(self.share * self.period_us)))
        (g / "cgroup.procs").write_text(str(pid))
        self.groups[device] = g
        if self.separate_acct:
            a = self.acct_root / g.name
            a.mkdir(exist_ok=True)
            (a / "cgroup.procs").write_text(str(pid))
            self.acct_groups[device] = a
        return True

    def usage_s(self) -> dict[int, float]:
        """CPU seconds each slot has used since its group was made."""
        out = {}
        for d, g in self.groups.items():
            f = self.acct_groups.get(d, g) / "cpuacct.usage"
            if f.is_file():
                out[d] = int(f.read_text()) / 1e9
        return out

    def close(self) -> None:
        for groups, root in ((self.groups, self.root), (self.acct_groups, self.acct_root)):
            for d, g in list(groups.items()):
                try:
                    for pid in (g / "cgroup.procs").read_text().split():
                        try:
                            (root / "cgroup.procs").write_text(pid)
                        except OSError:
                            pass
                    g.rmdir()
                except OSError as e:
                    log.warning("could not remove cgroup %s: %s", g, e)
                groups.pop(d, None)


def sweep_stale(root: Path = ROOT) -> list[Path]:
    """Removes empty slot groups left by a killed run (``pivot<pid>_slot<d>`` whose pid is
    gone); returns the folders removed."""
    removed = []
    for g in root.glob("pivot*_slot*"):
        digits = g.name[len("pivot"):].split("_", 1)[0]
        if not digits.isdigit() or Path(f"/proc/{digits}").exists():
            continue
        try:
            if not (g / "cgroup.procs").read_text().split():
                g.rmdir()
                removed.append(g)
        except OSError:
            pass
    return removed
