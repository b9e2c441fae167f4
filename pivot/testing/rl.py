"""In-memory ports and a manual clock for the RL loop (tests and benchmarks only; see
``pivot.testing``).

What is faked and why: the rollout engine, the GenRM engine and the trainer are real
elsewhere (tests/roles, tests/local); with these the thing under test is the loop itself
(release order, staleness, grouping, checkpoint and resume), so the ports return
deterministic responses, judgements and a 'policy' that is a running hash of the batches.
``fake_loop`` builds an ``RLLoop`` over them; a subprocess a test starts (and kills) can
build the same loop, as this module is part of the installed package.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from pathlib import Path

from pivot.rl.data import PromptStream
from pivot.rl.loop import LoopConfig, RLLoop
from pivot.rl.ports import Judgement, Response
from pivot.rl.staleness import StalenessBound
from pivot.rl.workflow import RLWorkflow


@dataclass
class ManualClock:
    """Time advances only when a coroutine sleeps (deterministic under asyncio's FIFO
    order): ``sleep(dt)`` adds dt and yields once."""

    t: float = 0.0

    def __call__(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds
        await asyncio.sleep(0)


def encode(text: str) -> list[int]:
    """A deterministic stand-in tokenizer: the last 24 characters as ids 3 to 99."""
    return [ord(c) % 97 + 3 for c in text[-24:]]


class FakeRollout:
    """Finishes up to ``per_poll`` responses per poll, in submission order."""

    def __init__(self, per_poll: int = 3):
        self.queue, self.per_poll, self.submitted = [], per_poll, []

    def submit(self, trajs):
        self.queue += list(trajs)
        self.submitted += [t.traj_id for t in trajs]

    def poll(self):
        out, self.queue = self.queue[:self.per_poll], self.queue[self.per_poll:]
        res = []
        for t in out:
            right = (t.traj_id * 7 + t.sample) % 3 == 0
            ans = t.ground_truth if right else "-1"
            text = f" x = {ans}\nAnswer: {ans}"
            toks = [5 + t.sample, 6, 7]
            res.append(Response(t.traj_id, toks, [-0.5] * len(toks), text, "stop",
                                len(t.prompt_tokens) + len(toks)))
        return res


class FakeReward:
    def __init__(self, per_poll: int = 2):
        self.queue, self.per_poll = [], per_poll

    def submit(self, trajs):
        self.queue += list(trajs)

    def poll(self):
        out, self.queue = self.queue[:self.per_poll], self.queue[self.per_poll:]
        return [Judgement(t.traj_id, f"ok\nScore: {t.traj_id % 11}", 10) for t in out]


class FakeTrainer:
    """Records each batch; its 'policy' is a hash chain of the batches it trained on."""

    def __init__(self, wf):
        self.wf = wf
        self.policy = "init"
        self.batches: list[dict] = []

    def ready(self):
        return True

    def train(self, groups, version):
        rows = [t for g in groups for t in g.trajectories]
        self.batches.append({
            "step": groups[0].step, "version": version,
            "released": self.wf.released,
            "sizes": [sum(t.rewarded for t in g.trajectories) for g in groups],
            "lags": [version - t.start_version for t in rows],
            "prompts": [g.trajectories[0].question for g in groups],
            "prompt_lens": [len(t.prompt_tokens) for t in rows]})
        blob = self.policy + repr([(t.traj_id, t.reward) for t in rows])
        self.policy = hashlib.sha256(blob.encode()).hexdigest()
        return {"trainer/loss": 0.0}

    def publish(self, version, on_written=lambda: None):
        on_written()
        return {"gps/write_s": 0.0}

    def state(self):
        return {"policy": self.policy}

    def load_state(self, state):
        self.policy = state["policy"]


class FakeControl:
    def __init__(self):
        self.ticks = 0
        self.busy = False

    def tick(self, status):
        self.ticks += 1

    def set_busy(self, busy):
        self.busy = busy

    def allocation(self):
        return {"rollout": 2, "reward": 1, "training": 1}


def fake_loop(steps: int, staleness: int = 2, run_dir: str | Path | None = None,
              stop_after: int | None = None, seed: int = 0, prompts_per_step: int = 3,
              responses: int = 4) -> tuple[RLWorkflow, FakeTrainer, RLLoop]:
    """An ``RLLoop`` of ``steps`` steps over the fake ports and a ``ManualClock``.

    Args:
        staleness: the data staleness bound.
        run_dir: where checkpoints go, one per step (None: no checkpoints).
        stop_after: stop after this many steps (``LoopConfig.stop_after``).
        seed: the prompt stream's seed.
        prompts_per_step / responses: prompts per batch and responses per prompt.
    Returns:
        (workflow, trainer, loop): the ``FakeTrainer`` records every batch it trained on.
    """
    wf = RLWorkflow(PromptStream(prompts_per_step=prompts_per_step, seed=seed, num_val=8),
                    responses, steps, StalenessBound(staleness), encode)
    tr = FakeTrainer(wf)
    loop = RLLoop(wf, FakeRollout(), FakeReward(), tr, FakeControl(),
                  LoopConfig(poll_s=0.01, tick_s=0.05, stop_after=stop_after,
                             checkpoint_every=1 if run_dir else 0),
                  run_dir=run_dir, clock=ManualClock())
    return wf, tr, loop
