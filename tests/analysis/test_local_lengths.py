"""analysis/local_lengths.py: the range over runs of each window's length quantiles."""

import json
import subprocess
import sys
from pathlib import Path

from pivot.rl.lengths import length_report

ROOT = Path(__file__).resolve().parents[2]


def _steps(lens: list[list[int]]) -> list[dict]:
    return [{"rollout/response_lens": x, "reward/judge_lens": [2 * v for v in x]} for x in lens]


def test_ranges_over_runs_of_the_first_and_last_windows(tmp_path):
    short = length_report(_steps([[10] * 9 + [50]] * 4), window=2)
    long = length_report(_steps([[10] * 9 + [90]] * 2 + [[20] * 10] * 2), window=2)
    summary = tmp_path / "throughput.json"
    summary.write_text(json.dumps({"what": "throughput", "runs": [
        {"deployment": "pivotrl", "seed": 0, "lengths": short},
        {"deployment": "colocated", "seed": 0, "lengths": long}]}))
    out = tmp_path / "lengths.json"
    r = subprocess.run([sys.executable, "analysis/local_lengths.py", str(summary),
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(out.read_text())["range_over_runs"]
    assert got["response"]["start"]["max"] == [50, 90]
    assert got["response"]["end"]["max"] == [20, 50]   # the second run's tail went away
    assert got["judgement"]["start"]["p50"] == [20, 20]
    assert got["response"]["start"]["runs"] == 2
    assert "response  start" in r.stdout
