"""The trainer's process is SIGKILLed in the middle of a step; the run resumes from its last
checkpoint (policy, data position, policy version, replay buffer, allocation) and trains
every batch exactly once: the resumed policy hash chain equals an uninterrupted run's.

Uses the in-memory ports of ``pivot.testing.rl`` (the policy is a hash chain of the batches
trained, so a batch trained twice or skipped changes it); the killed child builds the same
loop from the installed package."""

import json
import os
import signal
import subprocess
import sys
import time

from pivot.rl import checkpoint
from pivot.testing.rl import fake_loop

STEPS, KILL_AT = 6, 3

CHILD = """
import json, time
from pathlib import Path
from pivot.testing.rl import fake_loop
d = Path({run_dir!r})
wf, tr, loop = fake_loop({steps}, run_dir=d)
orig = tr.train
def train(groups, version):
    if groups[0].step == {kill_at}:
        (d / "in_step").write_text(str(groups[0].step))
        time.sleep(120)  # killed here, mid-step
    out = orig(groups, version)
    with open(d / "trained.jsonl", "a") as f:
        f.write(json.dumps(tr.batches[-1]) + "\\n")
    return out
tr.train = train
loop.run()
"""


def test_a_trainer_killed_mid_step_resumes_without_training_a_batch_twice(tmp_path):
    _, full, loop = fake_loop(STEPS)
    loop.run()

    code = CHILD.format(run_dir=str(tmp_path), steps=STEPS, kill_at=KILL_AT)
    # cwd outside the clone: the child imports only the installed package
    child = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "in_step").exists():
            assert child.poll() is None, "the child run ended before the kill"
            assert time.monotonic() < deadline, "the child never reached the kill step"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)  # the process this test started
    finally:
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL

    before = [json.loads(x) for x in (tmp_path / "trained.jsonl").read_text().splitlines()]
    assert [b["step"] for b in before] == list(range(KILL_AT))
    t0 = time.perf_counter()
    state = checkpoint.load(checkpoint.latest(tmp_path))
    assert state["workflow"]["version"] == KILL_AT
    assert state["allocation"] == {"rollout": 2, "reward": 1, "training": 1}
    _, rest, loop2 = fake_loop(STEPS, run_dir=tmp_path)
    loop2.resume(state)
    resume_s = time.perf_counter() - t0
    loop2.run()
    assert [b["step"] for b in rest.batches] == list(range(KILL_AT, STEPS))
    assert ([b["prompts"] for b in before + rest.batches]
            == [b["prompts"] for b in full.batches])
    assert rest.policy == full.policy, "a batch was trained twice, skipped or changed"
    assert all(max(b["lags"]) <= 2 for b in rest.batches)
    print(f"\ntrainer kill: resumed from version {KILL_AT} in {resume_s:.3f} s")
