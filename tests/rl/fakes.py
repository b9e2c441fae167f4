"""In-memory ports for the RL loop's unit tests.

What is faked and why: the rollout engine, the GenRM engine and the trainer are real
elsewhere (tests/roles, tests/local); here the thing under test is the loop itself
(release order, staleness, grouping, checkpoint and resume), so the ports return
deterministic responses, judgements and a 'policy' that is a running hash of the batches.
"""

from __future__ import annotations

import hashlib

from pivot.rl.ports import Judgement, Response


def encode(text: str) -> list[int]:
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

    def publish(self, version):
        return {"gps/write_s": 0.0}

    def state(self):
        return {"policy": self.policy}

    def load_state(self, state):
        self.policy = state["policy"]


class FakeControl:
    def __init__(self):
        self.ticks = 0

    def tick(self, status):
        self.ticks += 1

    def set_busy(self, busy):
        pass

    def allocation(self):
        return {"rollout": 2, "reward": 1, "training": 1}
