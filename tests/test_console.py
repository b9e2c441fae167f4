"""The console of a launcher: a few lines, a progress bar and a summary; every library's
output, including what child processes write, in the run folder's run.log."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from pivot import console
from pivot.paths import REPO_ROOT

CONSOLE_LINES_SIM = 12
"""Lines a sim run of a model group prints (driver, config, run folder, bar, 9-row
summary); a test fails past it."""


def test_session_sends_library_and_child_output_to_run_log(tmp_path, capfd):
    with console.session(tmp_path, verbose=False) as con:
        con.line("a line that matters")
        logging.getLogger("somelib.engine").info("engine start-up chatter")
        logging.getLogger("pivot.cluster.stack").info("4 device slots up")
        logging.getLogger("pivot.shifting.executor").info("shift to reward: 0.4 s")
        os.write(1, b"raw stdout of a library\n")
        os.write(2, b"raw stderr of a library\n")
        subprocess.run([sys.executable, "-c", "print('a child process')"], check=True)
        print("python print")
    shown = capfd.readouterr()
    log_text = (tmp_path / "run.log").read_text()
    for text in ("engine start-up chatter", "raw stdout of a library",
                 "raw stderr of a library", "a child process", "python print",
                 "shift to reward"):
        assert text in log_text, text
        assert text not in shown.out + shown.err, text
    assert "a line that matters" in shown.out
    assert "4 device slots up" in shown.out + shown.err
    os.write(1, b"after the session\n")   # both descriptors are back
    assert "after the session" in capfd.readouterr().out


def test_verbose_session_redirects_nothing(tmp_path, capfd):
    with console.session(tmp_path, verbose=True):
        os.write(1, b"raw stdout\n")
    assert "raw stdout" in capfd.readouterr().out


def test_session_restores_descriptors_after_an_error(tmp_path, capfd):
    with pytest.raises(RuntimeError):
        with console.session(tmp_path):
            raise RuntimeError("boom")
    os.write(2, b"traceback reaches the terminal\n")
    assert "traceback reaches the terminal" in capfd.readouterr().err


def test_sim_run_console_is_short_and_agrees_with_result(tmp_path):
    run_dir = tmp_path / "run"
    r = subprocess.run([sys.executable, "launchers/run.py", "--gin", "gin/qwen7b_30b.gin",
                        "--gin_param", "SimDriver.steps = 2", "--run_dir", str(run_dir)],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, WANDB_MODE="disabled"))
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [s for s in (r.stdout + r.stderr).replace("\r", "\n").splitlines()
             if s.strip() and not s.startswith("RL steps")]
    assert len(lines) <= CONSOLE_LINES_SIM, "\n".join(lines)
    out = json.loads((run_dir / "result.json").read_text())
    shown = f"{out['throughput']:,.0f}"
    assert any("throughput" in s and shown in s for s in lines), (shown, lines)
    assert (run_dir / "run.log").stat().st_size > 0


def test_summary_rows_of_a_local_result(tmp_path):
    steps = [{"reward/mean": 0.5, "time_s": 10.0, "trained_tokens": 100},
             {"reward/mean": 0.75, "time_s": 20.0, "trained_tokens": 300,
              "val/accuracy_at_1": 0.25}]
    out = {"group": "tiny_cpu", "deployment": "pivotrl", "steps": steps, "throughput": 20.0,
           "throughput_run": 15.0, "shifts": 3, "startup_s": 50.0, "wall_s": 70.0}
    text = console.table(console.summary_rows(out, tmp_path))
    assert "0.500 -> 0.750" in text and "0.250" in text and str(tmp_path) in text
    assert "died" not in text and "failed shifts" not in text   # only when a run met them
    out["slot_deaths"] = [{"devices": [2], "requeued": 4}, {"devices": [2], "requeued": 0}]
    out["failed_shifts"] = [{"lost": [1, 3], "restored": [1]}]
    text = console.table(console.summary_rows(out, tmp_path))
    assert "2 (slots [2], 4 sequences requeued)" in text and "1 ([3])" in text
