"""The one step loop of a generator replica: a thread that steps the engine while it holds
sequences; every other call takes the same lock, so it lands between two steps.

Plain threading, no Monarch: the actor (``pivot.testing.generator``) and the role context
of a device slot share one loop per model per process (``shared_loop``), so a shift down
cannot free memory under a running step.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

import torch

from pivot.errors import PivotError, StateError
from pivot.roles.engine.config import EngineConfig
from pivot.roles.engine.requests import GenRequest, SeqResult
from pivot.roles.engine.vllm_engine import VllmEngine

if TYPE_CHECKING:
    from pivot.roles.engine.mirror import FollowerLoop

log = logging.getLogger(__name__)
R = TypeVar("R")


class StepLoop:
    """Steps ``engine`` in a background thread; finished sequences wait in ``done``."""

    def __init__(self, engine: VllmEngine, idle_wait_s: float = 0.01):
        self.engine = engine
        self.cond = threading.Condition()
        self.done: dict[int, SeqResult] = {}
        self.error: BaseException | None = None
        self._idle = idle_wait_s
        self._stop = False
        # Callers waiting for the lock. The step thread lets them in before its next step:
        # a lock is not fair, and a thread that re-takes it at once (under a CPU quota
        # above all) can starve a caller for many steps.
        self._waiting = 0
        self._count = threading.Lock()
        # the step thread must run OpenMP like the thread vLLM bound at engine start: its
        # attention metadata and kernels each read the calling thread's thread count, and
        # a fresh thread defaults to every core ("thread_num == thread_num (2 vs. 1)")
        self._threads = torch.get_num_threads()
        self._affinity = os.sched_getaffinity(0)
        self._thread = threading.Thread(target=self._run, name="generator-step", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        os.sched_setaffinity(0, self._affinity)   # this thread only (Linux)
        torch._C.set_num_threads(self._threads)  # vLLM's CPU worker patches the public one
        while True:
            with self.cond:
                while not self._stop and not self.engine.live:
                    self.cond.wait(self._idle)
                if self._stop:
                    return
                try:
                    for r in self.engine.step():
                        self.done[r.seq_id] = r
                except BaseException as e:  # the loop must not die silently
                    log.exception("engine step failed")
                    self.error = e
                    self.done.update(self.engine.fail_running(
                        f"step failed: {type(e).__name__}: {e}"))
                self.cond.notify_all()
            time.sleep(0)  # let waiting callers take the lock between steps
            while self._waiting and not self._stop:
                time.sleep(0.0002)

    @contextlib.contextmanager
    def _turn(self):
        """The lock, taken between two steps, ahead of the step thread's next step."""
        with self._count:
            self._waiting += 1
        try:
            self.cond.acquire()
        finally:
            with self._count:
                self._waiting -= 1
        try:
            yield
        finally:
            self.cond.release()

    def call(self, fn: Callable[[VllmEngine], R]) -> R:
        """Runs ``fn(engine)`` between two steps."""
        with self._turn():
            out = fn(self.engine)
            self.cond.notify_all()
            return out

    def submit(self, reqs: Iterable[GenRequest]) -> list[str | None]:
        """Adds the sequences; per request None or the error that rejected it (only that
        request is lost)."""
        errs: list[str | None] = []
        with self._turn():
            for r in reqs:
                try:
                    self.engine.submit(r)
                    errs.append(None)
                except PivotError as e:
                    errs.append(str(e))
            self.cond.notify_all()
        return errs

    def abort(self, seq_ids: Iterable[int]) -> dict[int, SeqResult]:
        """Aborts running sequences (tokens kept); a sequence that already finished comes
        back as finished instead."""
        ids = list(seq_ids)
        with self._turn():
            out = self.engine.abort(ids)
            for s in ids:
                if s not in out and s in self.done:
                    out[s] = self.done.pop(s)
            return out

    def collect(self) -> dict[int, SeqResult]:
        """Pops every finished sequence."""
        with self._turn():
            out, self.done = self.done, {}
            return out

    def poll(self) -> tuple[dict[int, SeqResult], dict[int, int]]:
        """Pops every finished sequence and, in the same critical section, the current
        length (prompt + every token generated, across aborts) of each running one: the
        N_tok the scheduler's throughput model needs (sec. 6.1)."""
        with self._turn():
            out, self.done = self.done, {}
            return out, self.engine.lengths()

    def wait(self, seq_ids: Iterable[int], timeout_s: float = 300.0) -> dict[int, SeqResult]:
        """Blocks until every sequence in ``seq_ids`` finished; pops and returns them."""
        ids = set(seq_ids)
        deadline = time.monotonic() + timeout_s
        with self._turn():
            while not ids <= set(self.done):
                lost = ids - set(self.done) - set(self.engine.live)
                if lost:
                    raise StateError(f"sequences {sorted(lost)} neither run nor finished here")
                if not self.cond.wait(max(deadline - time.monotonic(), 0)):
                    raise TimeoutError(f"{len(ids - set(self.done))} sequences unfinished "
                                       f"after {timeout_s} s")
            return {s: self.done.pop(s) for s in ids}

    def first_tokens(self, seq_ids: Iterable[int], timeout_s: float = 60.0) -> float:
        """Blocks until each sequence produced a token since it was submitted (its
        re-prefill is done); returns the sum of their submit-to-first-token seconds."""
        ids = list(seq_ids)
        deadline = time.monotonic() + timeout_s
        with self._turn():
            while True:
                times = [self.engine.first_token_s(s) for s in ids
                         if s in self.engine.live]
                if all(t is not None for t in times):
                    return float(sum(times))
                if not self.cond.wait(max(deadline - time.monotonic(), 0)):
                    raise TimeoutError(f"re-prefill not done after {timeout_s} s")

    def close(self) -> None:
        with self.cond:
            self._stop = True
            self.cond.notify_all()
        self._thread.join(timeout=10)


_LOOPS: dict[tuple[str, EngineConfig], "StepLoop | FollowerLoop"] = {}


def shared_loop(model: str, cfg: EngineConfig) -> "StepLoop | FollowerLoop":
    """The process's loop of ``model`` ("policy", "genrm") on ``cfg``, its engine started on
    first use: a device slot holds one engine per model for the whole run (the rollout
    context and the generator actor share the policy's, the reward context has the
    GenRM's), so no shift ever starts an engine (sec. 5.2, preserved engine definition).

    Keyed by the model's name as well as its config: two models built from one folder
    (tests) still get an engine each. With ``cfg.tensor_parallel_size`` above 1 this
    process is one rank of a replica: rank 0 gets a ``StepLoop`` over a
    ``MirroredEngine``, the others a ``FollowerLoop`` (``pivot.roles.engine.mirror``).
    """
    key = (model, cfg)
    if key not in _LOOPS:
        engine = VllmEngine(cfg)
        if cfg.tensor_parallel_size > 1:
            import torch.distributed as dist

            from pivot.roles.engine.mirror import FollowerLoop, MirroredEngine, replica_group
            group = replica_group()
            _LOOPS[key] = (StepLoop(MirroredEngine(engine, group)) if dist.get_rank() == 0
                           else FollowerLoop(engine, group))
        else:
            _LOOPS[key] = StepLoop(engine)
    return _LOOPS[key]


def shared_engines() -> dict[tuple[str, EngineConfig], VllmEngine]:
    """Every engine this process started through ``shared_loop``, by (model, config)."""
    return {k: loop.engine for k, loop in _LOOPS.items()}


def close_shared_loops() -> None:
    for cfg in list(_LOOPS):
        loop = _LOOPS.pop(cfg)
        if hasattr(loop.engine, "close"):   # a replica's rank 0 ends its followers
            loop.call(lambda e: e.close())
        loop.close()
        loop.engine.shutdown()
