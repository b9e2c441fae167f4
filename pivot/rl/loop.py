"""The asynchronous RL loop with data staleness 2 (sec. 8.1, app. E).

Four named coroutines share one ``RLWorkflow``::

      PromptStream --release (version >= s - 2)--> rollout_loop --Response--+
                                                     |  RolloutPort         |
                                                     v                      v
      control_loop: monitor -> planner -> executor   reward_loop <--submit--+
           (ControlPort.tick every tick_s)           |  RewardPort: GenRM judgement,
                                                     |  R = R_verifiable + R_GenRM
                                                     v
      train_loop: batch of step `version` has n rewarded responses per prompt
           -> TrainerPort.train -> version += 1 -> TrainerPort.publish (GPS Write,
              rollout replicas Read) -> checkpoint -> metrics

The staleness bound is asserted at every release and every batch. A port method may be
plain or a coroutine: the cluster driver's ports await their slot calls, so the event loop
never blocks on one; the training step, which blocks for seconds, runs in a worker thread
so the other loops keep polling meanwhile. Time comes from an injectable clock
(``pivot.rl.clock``).
"""

from __future__ import annotations

import asyncio
import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gin

from pivot.config.validation import check_range
from pivot.errors import StateError
from pivot.rl import checkpoint
from pivot.rl.clock import WallClock
from pivot.rl.ports import (ControlPort, LoopStatus, RewardPort, RolloutPort, TrainerPort,
                            TrainingLost)
from pivot.rl.workflow import RLWorkflow
from pivot.waits import settle

log = logging.getLogger(__name__)


def pearson_or_none(xs: list[float], ys: list[float]) -> float | None:
    """Pearson's r, or None where either side is constant (JSON has no NaN)."""
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:
        return None


@gin.configurable
@dataclass
class LoopConfig:
    """Attributes:
        poll_s: how often rollout and reward collect finished sequences (seconds).
        tick_s: planner period (seconds).
        checkpoint_every: steps between checkpoints (0: none).
        stop_after: stop after this many trained steps in this invocation (None: run to
            the end); a stopped run resumes from its last checkpoint.
        timeout_s: a run past this wall time is an error (a stuck deployment).
    """

    poll_s: float = 0.05
    tick_s: float = 0.5
    checkpoint_every: int = 1
    stop_after: int | None = None
    timeout_s: float = 3600.0

    def __post_init__(self) -> None:
        for k in ("poll_s", "tick_s", "timeout_s"):
            check_range(f"LoopConfig.{k}", getattr(self, k), 0, open_lo=True, why="seconds")
        check_range("LoopConfig.checkpoint_every", self.checkpoint_every, 0, integer=True,
                    why="0: no checkpoints")
        check_range("LoopConfig.stop_after", self.stop_after, 1, integer=True, optional=True)


@dataclass
class StepRecord:
    """One trained step's metrics (a line of metrics.jsonl)."""

    data: dict[str, Any] = field(default_factory=dict)


class RLLoop:
    """Runs a workflow over the four ports until the last step (or ``stop_after``).

    Args:
        workflow: the RL state (prompts, trajectories, version).
        rollout / reward / trainer / control: the driver's ports.
        cfg: loop timing and checkpoints.
        run_dir: where checkpoints go (None: no checkpoints).
        clock: ``now()`` callable with an async ``sleep`` (``WallClock``;
            tests use ``pivot.testing.rl.ManualClock``).
        on_step: called with each step's metrics dict (JSONL writer, wandb, progress bar);
            may be a coroutine function.
        extra_state: returns driver state to checkpoint (e.g. the allocation trace).
    """

    def __init__(self, workflow: RLWorkflow, rollout: RolloutPort, reward: RewardPort,
                 trainer: TrainerPort, control: ControlPort, cfg: LoopConfig = LoopConfig(),
                 run_dir: str | Path | None = None, clock=None,
                 on_step: Callable[[dict[str, Any]], None] | None = None):
        self.wf, self.rollout, self.reward = workflow, rollout, reward
        self.trainer, self.control, self.cfg = trainer, control, cfg
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.clock = clock or WallClock()
        self.on_step = on_step or (lambda m: None)
        self.history: list[dict[str, Any]] = []
        self.data_order: list[list[Any]] = []
        self.tokens = 0
        self.trained_tokens = 0
        self.steps_lost = 0   # steps whose training replica died (TrainingLost), retrained
        self._step_tokens = 0
        self._rollout_pending: set[int] = set()
        self._reward_pending: set[int] = set()
        self._stop = False
        self._trained_here = 0
        self._error: BaseException | None = None
        self._ckpt_task: asyncio.Task | None = None
        self._ckpt_s = 0.0
        self._resubmit: tuple[list, list] = ([], [])

    # ------------------------------------------------------------------ resume
    def resume(self, state: dict[str, Any]) -> None:
        """Continues from a checkpoint: workflow (version, data position, replay buffer)
        and trainer state; unfinished rollouts and judgements are submitted again."""
        self.wf.load_state(state["workflow"])
        self.trainer.load_state(state["trainer"])
        self.history = list(state.get("history", []))
        self.tokens = int(state.get("tokens", 0))
        self.trained_tokens = int(state.get("trained_tokens", 0))
        redo, rejudge = self.wf.pending()
        for t in redo:
            t.start_version = max(t.start_version, self.wf.version)
        # submitted by the loops once they run (the ports may await their slots)
        self._rollout_pending.update(t.traj_id for t in redo)
        self._reward_pending.update(t.traj_id for t in rejudge)
        self._resubmit = (list(redo), list(rejudge))
        log.info("resumed at version %d (released %d, %d to roll out, %d to judge)",
                 self.wf.version, self.wf.released, len(redo), len(rejudge))

    # ------------------------------------------------------------------ coroutines
    async def rollout_loop(self) -> None:
        redo, rejudge = self._resubmit
        self._resubmit = ([], [])
        if redo:
            await self._submit_rollout(redo)
        if rejudge:
            await self._submit_reward(rejudge)
        while not self._stop:
            new = self.wf.release()
            if new:
                self.data_order.append([t.question for t in new[::self.wf.n]])
                await self._submit_rollout(new)
            judge = []
            for r in await settle(self.rollout.poll()):
                t = self.wf.responded(r.traj_id, r.tokens, r.logprobs, r.text,
                                      r.finish_reason)
                t.tokens_processed += r.tokens_processed
                judge.append(t)
                self._rollout_pending.discard(r.traj_id)
                self._count(r.tokens_processed)
            # one submission per poll: each submission dispatches to the engines, and one
            # per response (128 a step) held the loop for seconds between two steps
            if judge:
                await self._submit_reward(judge)
            await self.clock.sleep(self.cfg.poll_s)

    async def reward_loop(self) -> None:
        while not self._stop:
            for j in await settle(self.reward.poll()):
                t = self.wf.judged(j.traj_id, j.text)
                t.tokens_processed += j.tokens_processed
                t.judge_len = j.generated
                self._reward_pending.discard(j.traj_id)
                self._count(j.tokens_processed)
            await self.clock.sleep(self.cfg.poll_s)

    async def control_loop(self) -> None:
        while not self._stop:
            await settle(self.control.tick(self.status()))
            await self.clock.sleep(self.cfg.tick_s)

    async def train_loop(self) -> None:
        t_start = self.clock()
        t_prev = t_start
        while not self._stop:
            if self.wf.done or (self.cfg.stop_after is not None
                                and self._trained_here >= self.cfg.stop_after):
                await self._flush_checkpoint()   # the last checkpoint is on disk at return
                self._stop = True
                return
            if self.clock() - t_start > self.cfg.timeout_s:
                raise StateError(f"RL loop: no progress within LoopConfig.timeout_s="
                                 f"{self.cfg.timeout_s} s at version {self.wf.version}")
            if not (self.wf.batch_ready() and self.trainer.ready()):
                await self.clock.sleep(self.cfg.poll_s)
                continue
            # the checkpoint of the last step is on disk before the next step trains: a
            # crash inside a step resumes from the version just before it
            await self._flush_checkpoint()
            if not self.trainer.ready():
                # a shift that began while the checkpoint was written takes training's
                # devices down: no step may start on them (ClusterControl.training_leaving)
                continue
            step = self.wf.version
            groups = self.wf.take_batch()
            lag = max(step - t.start_version for g in groups for t in g.trajectories)
            # training's devices stay busy until its Write is published: a planner (or
            # the idle-training release) that took them mid-Write would shift the
            # writer's ranks down under it
            self.control.set_busy(True)
            try:
                try:
                    tm = await asyncio.to_thread(self.trainer.train, groups, step)
                except TrainingLost as e:
                    # nothing the run keeps changed: the batch is still the next one and
                    # trains again when training is back (on a replaced or other slot)
                    self.steps_lost += 1
                    log.warning("step %d lost with its training replica (%s); it trains "
                                "again", step + 1, e)
                    continue
                version = step + 1
                t_pub = self.clock()
                try:
                    # on the loop's thread (awaiting its slot calls): it touches the
                    # schedulers. The workflow advances once the Write committed, before
                    # the rollout replicas Read it: prompts released from then on are
                    # dispatched after that Read (it holds the fleet), on the new policy
                    pm = await settle(self.trainer.publish(version, self.wf.trained))
                except TrainingLost as e:
                    # the replica died before its Write committed: GPS holds the previous
                    # version and the trainer its state before the step, so the batch,
                    # still the next one (not ``trained``), trains again
                    self.steps_lost += 1
                    log.warning("step %d lost with its training replica while publishing "
                                "(%s); it trains again", step + 1, e)
                    continue
                if self.wf.version != version:
                    raise StateError(f"{type(self.trainer).__name__}.publish returned "
                                     f"without calling its on_written at version {version}")
            finally:
                self.control.set_busy(False)
            now = self.clock()
            pm["loop/publish_s"] = now - t_pub
            pm["loop/checkpoint_s"] = self._ckpt_s   # the previous step's (taken + written)
            rows = [t for g in groups for t in g.trajectories]
            batch_tokens = sum(t.tokens_processed for t in rows)
            self.trained_tokens += batch_tokens
            m = {"step": step + 1, "version": version, "time_s": now - t_start,
                 "step_time_s": now - t_prev, "tokens": self.tokens,
                 "step_tokens": self._step_tokens,
                 # the tokens of the trajectories this step trained on, and their running
                 # sum: the end-to-end throughput counts these, so work done ahead for
                 # later batches (staleness) is counted when it is trained, not before
                 "batch_tokens": batch_tokens, "trained_tokens": self.trained_tokens,
                 "tokens_per_s": self.tokens / max(now - t_start, 1e-9),
                 "staleness_max": lag,
                 "reward/mean": statistics.fmean(t.reward for t in rows),
                 "reward/verifiable_mean": statistics.fmean(t.verifiable for t in rows),
                 "reward/genrm_mean": statistics.fmean(t.genrm for t in rows),
                 "reward/genrm_parse_ok": statistics.fmean(bool(t.genrm_ok) for t in rows),
                 "rollout/response_len_mean": statistics.fmean(
                     len(t.response_tokens or []) for t in rows),
                 # the whole step's lengths: their distribution (the long tail) is
                 # reported at the start and the end of a run
                 "rollout/response_lens": [len(t.response_tokens or []) for t in rows],
                 "reward/judge_lens": [t.judge_len for t in rows],
                 # does the GenRM agree with the verifier on this batch (the build
                 # reports the same correlation on the validation set)
                 "reward/genrm_pearson": pearson_or_none([t.genrm for t in rows],
                                                         [t.verifiable for t in rows]),
                 "allocation": self.control.allocation(),
                 # what reached training: prompt index -> [rewarded responses, trajectories]
                 "batch/groups": {str(g.prompt_index): [sum(t.rewarded for t in g.trajectories),
                                                        len({t.traj_id for t in g.trajectories})]
                                  for g in groups},
                 **tm, **pm}
            self._step_tokens, t_prev = 0, now
            self.history.append(m)
            self._trained_here += 1
            await settle(self.on_step(m))
            if (self.run_dir is not None and self.cfg.checkpoint_every
                    and version % self.cfg.checkpoint_every == 0):
                await self._checkpoint(version)

    async def _checkpoint(self, version: int) -> None:
        """Takes the state on the loop's thread (consistent), then writes it in a worker
        thread while the loop publishes, logs and waits for the next batch; the next step
        trains only once it is written. At most one write is in flight, so checkpoints
        land in order and a failed write surfaces at the next step."""
        t = self.clock()
        await self._flush_checkpoint()
        state = self.checkpoint_state(await settle(self.trainer.state()))
        self._ckpt_task = asyncio.create_task(
            asyncio.to_thread(checkpoint.save, self.run_dir, version, state))
        self._ckpt_s = self.clock() - t

    async def _flush_checkpoint(self) -> None:
        if self._ckpt_task is not None:
            task, self._ckpt_task = self._ckpt_task, None
            await task

    # ------------------------------------------------------------------ running
    async def _main(self) -> None:
        tasks = [asyncio.create_task(c(), name=c.__name__) for c in
                 (self.rollout_loop, self.reward_loop, self.control_loop, self.train_loop)]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in done:
                if t.exception() is not None:
                    raise t.exception()
            await asyncio.gather(*tasks)
        finally:
            self._stop = True
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def run(self) -> list[dict[str, Any]]:
        """Runs until the last step or ``stop_after``; returns the step metrics."""
        self._stop = False
        asyncio.run(self._main())
        return self.history

    def status(self) -> LoopStatus:
        return LoopStatus(self.wf.version, self.wf.batch_ready(), len(self._rollout_pending),
                          len(self._reward_pending), self.oldest_rollout_done())

    def oldest_rollout_done(self) -> bool:
        """Every response of the oldest untrained step has finished (rollout-reward
        colocated then turns its pool over to reward)."""
        s = self.wf.version
        ts = [t for t in self.wf.trajs.values() if t.step == s]
        return bool(ts) and all(t.responded for t in ts)

    def checkpoint_state(self, trainer_state: dict[str, Any] | None = None) -> dict[str, Any]:
        """A snapshot the loop may go on changing under: the workflow's and trainer's
        states and the allocation are built fresh; step records are never changed once
        appended, so the history list is copied, not its records. ``trainer_state``: the
        trainer's, if the caller already took it (an async trainer port)."""
        if trainer_state is None:
            trainer_state = self.trainer.state()
        return {"workflow": self.wf.state(), "trainer": trainer_state,
                "allocation": self.control.allocation(), "history": list(self.history),
                "tokens": self.tokens, "trained_tokens": self.trained_tokens}

    # ------------------------------------------------------------------ helpers
    async def _submit_rollout(self, trajs) -> None:
        self._rollout_pending.update(t.traj_id for t in trajs)
        await settle(self.rollout.submit(trajs))

    async def _submit_reward(self, trajs) -> None:
        self._reward_pending.update(t.traj_id for t in trajs)
        await settle(self.reward.submit(trajs))

    def _count(self, n: int) -> None:
        self.tokens += n
        self._step_tokens += n
