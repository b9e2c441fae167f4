"""Runs ``test_lease_monarch.py`` (a GPS writer SIGKILLed mid-Write) in a pytest process of
its own, so it is part of every full run.

In the suite's process the killed writer's Monarch link times out ~30 s later and the
pytest process then died silently a few modules on; a process of its own ends with that
module, and its exit status and summary line are what this test checks."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.monarch, pytest.mark.slow]

MODULE = Path(__file__).with_name("test_lease_monarch.py")


@pytest.mark.skipif(os.environ.get("PIVOT_KILL_TESTS") == "1",
                    reason="the kill tests run in this process already")
def test_kill_tests_pass_in_a_process_of_their_own(tmp_path):
    env = {**os.environ, "PIVOT_KILL_TESTS": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "--basetemp", str(tmp_path / "t"), str(MODULE)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900,
                       cwd=Path(__file__).parents[2])
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}:\n{out[-6000:]}"
    assert "2 passed" in r.stdout, out[-6000:]
