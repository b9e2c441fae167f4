"""The driver's ``ReplicaPort`` for generator replicas: applies the scheduler's Abort and
Dispatch actions (sec. 6.2, alg. 2) and times them as the paper's table 3 does (abort,
dispatch, re-prefill).

A handle is anything with the ``StepLoop`` calls ``submit`` / ``abort`` / ``collect`` /
``first_tokens``: a ``StepLoop`` in this process, or ``ActorHandle`` over a Monarch
generator actor (``pivot.roles.generator``).
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

log = logging.getLogger(__name__)


class GeneratorHandle(Protocol):
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
        """Runs ``actions`` in order, batching consecutive ones of a kind per replica."""
        stats = MigrationStats()
        key = lambda a: (type(a), a.replica_id)  # noqa: E731
        for (kind, rid), group in itertools.groupby(actions, key=key):
            handle = self._handle(rid)
            ids = [a.seq_id for a in group]
            if kind is Abort:
                self._abort(handle, rid, ids, stats)
            elif kind is Dispatch:
                self._dispatch(handle, rid, ids, stats)
            else:
                raise StateError(f"unknown action type {kind.__name__}")
        return stats

    def _abort(self, handle, rid: str, ids: list[int], stats: MigrationStats) -> None:
        t = time.perf_counter()
        out = handle.abort(ids)
        stats.abort_s += time.perf_counter() - t
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

    def _dispatch(self, handle, rid: str, ids: list[int], stats: MigrationStats) -> None:
        reqs = []
        for s in ids:
            if s in self.finished:
                # its abort found it finished (a migration's Abort + Dispatch): running it
                # again would finish it twice; the scheduler is told at the next collect
                continue
            seq = self.sequences[s]
            if seq.prompt_tokens is None:
                raise StateError(f"sequence {s} has no prompt tokens; the local driver "
                                 f"needs them to dispatch")
            reqs.append(GenRequest(s, list(seq.prompt_tokens), self.spec_for(seq),
                                   list(seq.generated_tokens or []),
                                   list(self.logprobs.get(s, []))))
        t = time.perf_counter()
        errs = handle.submit(reqs)
        stats.dispatch_s += time.perf_counter() - t
        resumed = []
        for r, err in zip(reqs, errs):
            if err is not None:
                self.rejected[r.seq_id] = err
                log.warning("replica %s rejected sequence %d: %s", rid, r.seq_id, err)
                continue
            self.sequences[r.seq_id].replica_id = rid
            stats.dispatched += 1
            if r.resume:
                resumed.append(r.seq_id)
        if resumed and self.measure_reprefill:
            stats.reprefill_s += handle.first_tokens(resumed)

    def collect(self) -> dict[int, SeqResult]:
        """Pops finished sequences from every replica (and any that an abort found
        finished); marks them off their replica."""
        self.lengths = {}
        for rid, handle in self.replicas.items():
            if hasattr(handle, "poll"):
                done, self.lengths[rid] = handle.poll()
            else:
                done = handle.collect()
            for res in done.values():
                self._finish(res)
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
