"""The slots' CPU shares (pivot.cluster.cpu.cgroups): the cap and the per-slot CPU accounting."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pivot.cluster.cpu.cgroups import ROOT, SlotCpuShares


def _hierarchies(tmp_path: Path, co_mounted: bool) -> tuple[Path, Path]:
    cpu, acct = tmp_path / "cpu", tmp_path / "cpuacct"
    cpu.mkdir()
    acct.mkdir()
    (cpu if co_mounted else acct).joinpath("cpuacct.usage").write_text("0")
    return cpu, acct


def test_usage_comes_from_a_twin_group_where_cpuacct_is_mounted_apart(tmp_path):
    cpu, acct = _hierarchies(tmp_path, co_mounted=False)
    shares = SlotCpuShares(0.5, name="pivot1", root=cpu, acct_root=acct)
    assert shares.separate_acct
    assert shares.assign(2, 4242)
    assert (cpu / "pivot1_slot2" / "cpu.cfs_quota_us").read_text() == "50000"
    assert (cpu / "pivot1_slot2" / "cgroup.procs").read_text() == "4242"
    assert (acct / "pivot1_slot2" / "cgroup.procs").read_text() == "4242"
    (acct / "pivot1_slot2" / "cpuacct.usage").write_text("1500000000")
    assert shares.usage_s() == {2: 1.5}


def test_usage_comes_from_the_cpu_group_where_the_controllers_are_co_mounted(tmp_path):
    cpu, acct = _hierarchies(tmp_path, co_mounted=True)
    shares = SlotCpuShares(0.5, name="pivot1", root=cpu, acct_root=acct)
    assert not shares.separate_acct
    assert shares.assign(0, 7)
    assert not (acct / "pivot1_slot0").exists()
    (cpu / "pivot1_slot0" / "cpuacct.usage").write_text("250000000")
    assert shares.usage_s() == {0: 0.25}


@pytest.mark.skipif(not (ROOT.is_dir() and os.access(ROOT, os.W_OK)),
                    reason="no writable cgroup v1 cpu controller on this host")
def test_a_busy_process_is_held_to_its_share_and_its_cpu_is_counted():
    """On this host's real hierarchy: a spinning process capped at a quarter of a core
    uses about a quarter of the wall time, and the slot's usage says so."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    shares = SlotCpuShares(0.25, name=f"pivot{os.getpid()}test")
    try:
        assert shares.assign(0, proc.pid)
        start = shares.usage_s()[0]
        time.sleep(2.0)
        used = shares.usage_s()[0] - start
        assert 0.2 < used < 0.8, f"{used:.2f} CPU s in 2 s at a 0.25-core quota"
    finally:
        proc.kill()
        proc.wait()
        shares.close()
    assert not (ROOT / f"pivot{os.getpid()}test_slot0").exists()
