"""The RL workflow state: which steps are released, which responses are rewarded, which
batch trains next (sec. 8.1, app. E). Pure; the loop (``pivot.rl.loop``) drives it.

Step s has ``prompts_per_step`` prompts with ``n`` responses each. Rollout of step s is
released once the policy version is >= s - staleness. A finished response gets one GenRM
judgement; R = R_verifiable + R_GenRM. The batch of step s trains on version s once every
one of its prompts has exactly n rewarded responses. Trajectories that finished but were
not trained yet are the replay buffer a checkpoint keeps.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pivot.errors import StateError
from pivot.rewards.combine import Reward, trajectory_reward
from pivot.rl.data import PromptStream, record_fields
from pivot.rl.staleness import StalenessBound
from pivot.rl.trajectory import PromptGroup, Trajectory

log = logging.getLogger(__name__)

RewardFn = Callable[[Trajectory], Reward]


def default_reward(t: Trajectory) -> Reward:
    """R = R_verifiable + R_GenRM of one judged trajectory (sec. 8.1)."""
    return trajectory_reward(t.response_text or "", t.ground_truth, t.judge_text)


@dataclass
class RLWorkflow:
    """Attributes:
        stream: the deterministic prompt stream.
        n: responses per prompt (GRPO group size).
        steps: RL steps of the whole run.
        bound: the staleness bound.
        encode: text -> token ids (the policy's tokenizer).
        reward_fn: R of a judged trajectory.
    """

    stream: PromptStream
    n: int
    steps: int
    bound: StalenessBound
    encode: Callable[[str], list[int]]
    reward_fn: RewardFn = default_reward
    version: int = 0
    released: int = 0
    trajs: dict[int, Trajectory] = field(default_factory=dict)
    max_lag_seen: int = 0

    def __post_init__(self) -> None:
        if self.n <= 0 or self.steps <= 0:
            raise StateError(f"RLWorkflow: n and steps must be > 0, got {self.n}, {self.steps}")

    @property
    def m(self) -> int:
        return self.stream.prompts_per_step

    # ------------------------------------------------------------------ rollout side
    def release(self) -> list[Trajectory]:
        """New trajectories of every step the staleness bound now allows, in id order."""
        out: list[Trajectory] = []
        while self.released < self.steps and self.bound.may_start(self.released, self.version):
            s = self.released
            self.bound.check_start(s, self.version)
            for p, rec in enumerate(self.stream.batch(s)):
                text, question, truth = record_fields(rec)
                tokens = self.encode(text)
                for j in range(self.n):
                    tid = (s * self.m + p) * self.n + j
                    t = Trajectory(tid, s, p, j, list(tokens), truth, question, self.version,
                                   extra={"index": rec.get("extra_info", {}).get("index")})
                    self.trajs[tid] = t
                    out.append(t)
            self.released += 1
        return out

    def responded(self, traj_id: int, tokens: list[int], logprobs: list[float], text: str,
                  finish_reason: str) -> Trajectory:
        t = self._get(traj_id)
        if t.responded:
            raise StateError(f"trajectory {traj_id} responded twice")
        if len(logprobs) != len(tokens):
            raise StateError(f"trajectory {traj_id}: {len(tokens)} tokens but "
                             f"{len(logprobs)} log-probs")
        t.response_tokens, t.response_logprobs = list(tokens), list(logprobs)
        t.response_text, t.finish_reason = text, finish_reason
        return t

    def judged(self, traj_id: int, judge_text: str) -> Trajectory:
        """Records the GenRM's judgement and the trajectory's reward."""
        t = self._get(traj_id)
        if not t.responded:
            raise StateError(f"trajectory {traj_id} judged before its response finished")
        if t.rewarded:
            raise StateError(f"trajectory {traj_id} rewarded twice")
        t.judge_text = judge_text
        r = self.reward_fn(t)
        t.reward, t.verifiable, t.genrm, t.genrm_ok = r.total, r.verifiable, r.genrm, r.genrm_ok
        return t

    # ------------------------------------------------------------------ training side
    def groups(self, step: int) -> list[PromptGroup]:
        by_prompt: dict[int, list[Trajectory]] = {}
        for t in self.trajs.values():
            if t.step == step:
                by_prompt.setdefault(t.prompt_index, []).append(t)
        return [PromptGroup(step, p, sorted(ts, key=lambda t: t.sample))
                for p, ts in sorted(by_prompt.items())]

    def batch_ready(self) -> bool:
        """Every prompt of step ``version`` has its n rewarded responses."""
        s = self.version
        if s >= self.steps or s >= self.released:
            return False
        gs = self.groups(s)
        return len(gs) == self.m and all(g.complete for g in gs)

    def take_batch(self) -> list[PromptGroup]:
        """The batch of step ``version``; asserts n rewarded per prompt and the bound."""
        if not self.batch_ready():
            raise StateError(f"take_batch: the batch of step {self.version} is not ready")
        gs = self.groups(self.version)
        for g in gs:
            if len(g.trajectories) != self.n or not g.complete:
                raise StateError(f"step {g.step} prompt {g.prompt_index}: "
                                 f"{sum(t.rewarded for t in g.trajectories)} rewarded "
                                 f"responses, expected exactly n={self.n}")
        lag = self.bound.check_batch(self.version, self.version,
                                     (t.start_version for g in gs for t in g.trajectories))
        self.max_lag_seen = max(self.max_lag_seen, lag)
        return gs

    def trained(self) -> int:
        """The batch of step ``version`` was trained: drop it, advance the version."""
        s = self.version
        for tid in [i for i, t in self.trajs.items() if t.step == s]:
            del self.trajs[tid]
        self.version += 1
        return self.version

    @property
    def done(self) -> bool:
        return self.version >= self.steps

    # ------------------------------------------------------------------ checkpoint
    def state(self) -> dict[str, Any]:
        """Data position, version and the replay buffer (every released, untrained
        trajectory with whatever it finished: response, judgement, reward)."""
        return {"version": self.version, "released": self.released,
                "max_lag_seen": self.max_lag_seen,
                "trajectories": [t.to_dict() for t in self.trajs.values()]}

    def load_state(self, state: dict[str, Any]) -> None:
        self.version, self.released = int(state["version"]), int(state["released"])
        self.max_lag_seen = int(state.get("max_lag_seen", 0))
        self.trajs = {d["traj_id"]: Trajectory.from_dict(d) for d in state["trajectories"]}

    def pending(self) -> tuple[list[Trajectory], list[Trajectory]]:
        """After a resume: (trajectories to roll out again, responses to judge again)."""
        todo = sorted(self.trajs.values(), key=lambda t: t.traj_id)
        return ([t for t in todo if not t.responded],
                [t for t in todo if t.responded and not t.rewarded])

    def _get(self, traj_id: int) -> Trajectory:
        if traj_id not in self.trajs:
            raise StateError(f"unknown trajectory {traj_id}")
        return self.trajs[traj_id]
