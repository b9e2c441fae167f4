"""The driver's ``ReplicaPort`` for generator replicas: applies the scheduler's Abort and
Dispatch actions (sec. 6.2, alg. 2) and times them as the paper's table 3 does (abort,
dispatch, re-prefill).

Each operation is written once as steps (``pivot.waits``): ``apply`` and ``collect``
block, ``apply_async`` and ``collect_async`` await the replicas' calls, for a caller on the
RL loop's event loop.

A handle is anything with the ``StepLoop`` calls ``submit`` / ``abort`` / ``collect`` /
``first_tokens``: a ``StepLoop`` in this process, the cluster driver's ``SlotHandle`` over
a device slot (``pivot.cluster.fleet``), or a test's ``ActorHandle``
(``pivot.testing.generator``).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pivot.errors import StateError
from pivot.roles.engine.requests import GenRequest, SampleSpec, SeqResult
from pivot.scheduler.actions import Abort, Dispatch
from pivot.shifting.executor import MigrationStats
from pivot.types import SequenceState
from pivot.waits import Done, Steps, run_async, run_blocking

log = logging.getLogger(__name__)


class GeneratorHandle(Protocol):
    """One generator replica as the port calls it. A handle whose calls can run
    concurrently also has ``started()``: the same calls, each returning at once with a
    pending result (``.get()`` / ``await .wait()``), so the port starts one per replica
    before it waits for any."""

    def submit(self, reqs: list[GenRequest]) -> list[str | None]: ...
    def abort(self, seq_ids: list[int]) -> dict[int, SeqResult]: ...
    def collect(self) -> dict[int, SeqResult]: ...
    def first_tokens(self, seq_ids: list[int], timeout_s: float = 60.0) -> float: ...


def greedy_spec(seq: SequenceState) -> SampleSpec:
    return SampleSpec(max_tokens=seq.max_new_tokens)


@dataclass
class GeneratorPort:
    """Applies actions to generator replicas and keeps ``sequences`` up to date.

    Args:
        replicas: replica id -> handle.
        sequences: seq id -> state; an Abort writes the generated tokens back here.
        spec_for: the sampling parameters of a sequence.
        measure_reprefill: wait for resumed sequences' first token to time the re-prefill.
    """

    replicas: Mapping[str, GeneratorHandle]
    sequences: dict[int, SequenceState]
    spec_for: Callable[[SequenceState], SampleSpec] = greedy_spec
    measure_reprefill: bool = True
    finished: dict[int, SeqResult] = field(default_factory=dict)
    rejected: dict[int, str] = field(default_factory=dict)
    logprobs: dict[int, list[float]] = field(default_factory=dict)
    lengths: dict[str, dict[int, int]] = field(default_factory=dict)
    """replica id -> {seq id: current length} of its running sequences, as of the last
    ``collect`` (handles with ``poll`` only)."""

    def apply(self, actions: Sequence[object]) -> MigrationStats:
        """Runs ``actions`` in order, blocking (see ``apply_steps``)."""
        return run_blocking(self.apply_steps(actions))

    async def apply_async(self, actions: Sequence[object]) -> MigrationStats:
        """``apply`` on an event loop: the replicas' calls are awaited."""
        return await run_async(self.apply_steps(actions))

    def collect(self) -> dict[int, SeqResult]:
        """Finished sequences of every replica, blocking (see ``collect_steps``)."""
        return run_blocking(self.collect_steps())

    async def collect_async(self) -> dict[int, SeqResult]:
        return await run_async(self.collect_steps())

    def apply_steps(self, actions: Sequence[object], stats: MigrationStats | None = None
                    ) -> Steps[MigrationStats]:
        """Runs ``actions`` in order. Each run of consecutive actions of one kind is one
        round: one call per replica, started on every replica before any is waited for,
        so a round costs the slowest replica's call, not their sum (each call lands
        between two engine steps). ``stats``, when given, is filled as the rounds run, so
        a caller still has the counts of an application that failed partway."""
        stats = MigrationStats() if stats is None else stats
        for kind, run in itertools.groupby(actions, key=type):
            if kind not in (Abort, Dispatch):
                raise StateError(f"unknown action type {kind.__name__}")
            by_replica: dict[str, list[int]] = {}
            for a in run:
                by_replica.setdefault(a.replica_id, []).append(a.seq_id)
            handles = {rid: self._handle(rid) for rid in by_replica}
            if kind is Abort:
                yield from self._abort(handles, by_replica, stats)
            else:
                yield from self._dispatch(handles, by_replica, stats)
        return stats

    def _abort(self, handles: Mapping[str, GeneratorHandle], ids: Mapping[str, list[int]],
               stats: MigrationStats) -> Steps[None]:
        t = time.perf_counter()
        outs = yield from _fan_out(handles, lambda rid, h: h.abort(ids[rid]))
        stats.abort_s += time.perf_counter() - t
        for out in outs.values():
            if isinstance(out, BaseException):
                continue
            for s, res in out.items():
                seq = self.sequences[s]
                if res.finish_reason != "abort":
                    self._finish(res)
                    continue
                seq.generated_tokens = list(res.tokens)
                seq.generated_len = len(res.tokens)
                self.logprobs[s] = list(res.logprobs)
                seq.replica_id = None
                seq.num_aborts += 1
                stats.aborted += 1
        _raise_first(outs)

    def _dispatch(self, handles: Mapping[str, GeneratorHandle], ids: Mapping[str, list[int]],
                  stats: MigrationStats) -> Steps[None]:
        reqs: dict[str, list[GenRequest]] = {}
        for rid, sids in ids.items():
            reqs[rid] = []
            for s in sids:
                if s in self.finished:
                    # its abort found it finished (a migration's Abort + Dispatch): running
                    # it again would finish it twice; the scheduler is told at next collect
                    continue
                seq = self.sequences[s]
                if seq.prompt_tokens is None:
                    raise StateError(f"sequence {s} has no prompt tokens; the cluster driver "
                                     f"needs them to dispatch")
                reqs[rid].append(GenRequest(s, list(seq.prompt_tokens), self.spec_for(seq),
                                            list(seq.generated_tokens or []),
                                            list(self.logprobs.get(s, []))))
        live = {rid: h for rid, h in handles.items() if reqs[rid]}
        t = time.perf_counter()
        errs = yield from _fan_out(live, lambda rid, h: h.submit(reqs[rid]))
        stats.dispatch_s += time.perf_counter() - t
        resumed: dict[str, list[int]] = {}
        for rid, out in errs.items():
            if isinstance(out, BaseException):
                continue
            for r, err in zip(reqs[rid], out):
                if err is not None:
                    self.rejected[r.seq_id] = err
                    log.warning("replica %s rejected sequence %d: %s", rid, r.seq_id, err)
                    continue
                self.sequences[r.seq_id].replica_id = rid
                stats.dispatched += 1
                if r.resume:
                    resumed.setdefault(rid, []).append(r.seq_id)
        if resumed and self.measure_reprefill:
            firsts = yield from _fan_out({rid: live[rid] for rid in resumed},
                                         lambda rid, h: h.first_tokens(resumed[rid]))
            stats.reprefill_s += sum(v for v in firsts.values()
                                     if not isinstance(v, BaseException))
            _raise_first(firsts)
        _raise_first(errs)

    def collect_steps(self) -> Steps[dict[int, SeqResult]]:
        """Pops finished sequences from every replica (and any that an abort found
        finished), polling all replicas in one round; marks them off their replica."""
        self.lengths = {}
        handles = dict(self.replicas.items())
        polling = {rid: h for rid, h in handles.items() if hasattr(h, "poll")}
        rest = {rid: h for rid, h in handles.items() if rid not in polling}
        outs = yield from _fan_out({**polling, **rest}, lambda rid, h: (
            h.poll() if rid in polling else h.collect()))
        for rid, out in outs.items():
            if isinstance(out, BaseException):
                continue
            done = out
            if rid in polling:
                done, self.lengths[rid] = out
            for res in done.values():
                self._finish(res)
        _raise_first(outs)
        out, self.finished = self.finished, {}
        return out

    def _finish(self, res: SeqResult) -> None:
        seq = self.sequences[res.seq_id]
        seq.generated_tokens, seq.generated_len = list(res.tokens), len(res.tokens)
        seq.replica_id = None
        self.finished[res.seq_id] = res

    def _handle(self, rid: str) -> GeneratorHandle:
        if rid not in self.replicas:
            raise StateError(f"no generator replica {rid!r}; known: {sorted(self.replicas)}")
        return self.replicas[rid]


def _fan_out(handles: Mapping[str, GeneratorHandle],
             call: Callable[[str, GeneratorHandle], object]) -> Steps[dict[str, object]]:
    """``call(replica id, handle)`` for every handle, all started before any is waited
    for: on ``handle.started()`` where the handle has it (the call returns a pending
    result), else on the handle itself, in turn. Returns replica id -> result, or the
    exception that call raised: every call is waited for, so a failing replica never
    leaves another's result (generated tokens) unread."""
    started: dict[str, object] = {}
    for rid, h in handles.items():
        try:
            started[rid] = (call(rid, h.started()) if hasattr(h, "started")
                            else Done(call(rid, h)))
        except Exception as e:  # noqa: BLE001 - reported by _raise_first
            started[rid] = Done(e)
    if not started:
        return {}
    return (yield started)


def _raise_first(results: Mapping[str, object]) -> None:
    for rid, r in results.items():
        if isinstance(r, BaseException):
            raise r
