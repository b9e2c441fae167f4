"""One simulated inference replica doing continuous batching (sec. 6.1, app. A).

Each decode step adds one token to every running sequence and lasts
tau = A * N_tok + max(B, C * N_seq) + D. Between events all running sequences grow at the
same rate, so the replica jumps to its next event in closed form: k steps cost
k * (A * N_tok + max(B, C * N_seq) + D) + A * N_seq * k (k - 1) / 2 (an arithmetic series).
Events: a sequence reaches its true length, or growth would overflow the KV capacity
(then the newest sequence is preempted, like vLLM's recompute preemption).
Admission and resumption pay a prefill of the sequence's current length at
``prefill_rate`` tokens/s, during which the replica does not decode.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from pivot.errors import StateError
from pivot.scheduler.throughput import ThroughputModel
from pivot.types import Role


@dataclass
class SimReplica:
    """State of one replica in virtual time.

    A sequence admitted at step count ``s0`` with ``r`` tokens still to generate finishes
    when ``steps`` reaches ``s0 + r``, so its finish step is fixed at admission and a heap
    of finish steps gives the next finish in O(log n).
    """

    replica_id: str
    role: Role
    devices: tuple[int, ...]
    model: ThroughputModel
    kv_capacity: int
    prefill_rate: float
    time: float = 0.0
    """Virtual time up to which the replica has been simulated."""
    busy_until: float = 0.0
    """Prefill, shift-up or weight-update stall: no decode before this time."""
    steps: int = 0
    num_tokens: int = 0
    finish_step: dict[int, int] = field(default_factory=dict)
    base_len: dict[int, int] = field(default_factory=dict)
    """Length at admission minus ``steps`` at admission: length = base_len + steps."""
    order: dict[int, int] = field(default_factory=dict)
    """Admission counter per sequence (preemption takes the newest)."""
    _heap: list[tuple[int, int]] = field(default_factory=list)
    _admitted: int = 0
    generated: int = 0
    """Tokens this replica decoded (for conservation checks)."""
    prefilled: int = 0
    decode_s: float = 0.0

    @property
    def num_seqs(self) -> int:
        return len(self.finish_step)

    def length(self, seq_id: int) -> int:
        return self.base_len[seq_id] + self.steps

    def lengths(self) -> dict[int, int]:
        return dict(self.length_items())

    def length_items(self) -> Iterator[tuple[int, int]]:
        """(sequence id, current length) of every running sequence, built lazily (for
        ``dict.update`` without an intermediate dict)."""
        return zip(self.base_len, map(self.steps.__add__, self.base_len.values()))

    # ------------------------------------------------------------------ admission
    def admit(self, seq_id: int, length: int, target: int, now: float) -> float:
        """Starts ``seq_id`` at ``length`` tokens, to finish at ``target``; returns the
        prefill seconds paid."""
        if seq_id in self.finish_step:
            raise StateError(f"sequence {seq_id} already runs on {self.replica_id}")
        if target <= length:
            raise StateError(f"sequence {seq_id}: target {target} <= length {length}")
        self._catch_up(now)
        self.finish_step[seq_id] = self.steps + (target - length)
        self.base_len[seq_id] = length - self.steps
        self.order[seq_id] = self._admitted
        self._admitted += 1
        heapq.heappush(self._heap, (self.finish_step[seq_id], seq_id))
        self.num_tokens += length
        cost = length / self.prefill_rate
        self.busy_until = max(self.busy_until, now) + cost
        self.prefilled += length
        return cost

    def remove(self, seq_id: int, now: float) -> int:
        """Stops ``seq_id`` (abort or finish); returns its length."""
        self._catch_up(now)
        length = self.length(seq_id)
        del self.finish_step[seq_id], self.base_len[seq_id], self.order[seq_id]
        self.num_tokens -= length
        return length

    def stall(self, until: float) -> None:
        self.busy_until = max(self.busy_until, until)

    def _catch_up(self, now: float) -> None:
        """Actions land at ``now``: the fraction of a step in flight is dropped (its
        tokens were not produced), so the replica's time becomes ``now``."""
        if now < self.time - 1e-9:
            raise StateError(f"{self.replica_id}: action at {now} before its time {self.time}")
        self.time = max(self.time, now)

    # ------------------------------------------------------------------ closed form
    def _span(self, k: int) -> float:
        """Seconds of the next ``k`` decode steps."""
        m = self.model
        n = self.num_seqs
        first = m.A * self.num_tokens + max(m.B, m.C * n) + m.D
        return k * first + m.A * n * k * (k - 1) / 2

    def _next_finish(self) -> int:
        while self._heap:
            fs, sid = self._heap[0]
            if self.finish_step.get(sid) == fs:
                return fs - self.steps
            heapq.heappop(self._heap)
        raise StateError(f"{self.replica_id}: no running sequence")

    def _steps_to_event(self) -> tuple[int, bool]:
        """(steps to the next event, whether it is a KV overflow)."""
        k_fin = self._next_finish()
        room = (self.kv_capacity - self.num_tokens) // self.num_seqs
        if room < k_fin:
            return max(room, 0), True
        return k_fin, False

    def next_event_time(self) -> float | None:
        """Virtual time of the next finish or overflow; None when idle."""
        if not self.finish_step:
            return None
        k, _ = self._steps_to_event()
        return max(self.time, self.busy_until) + self._span(k)

    def advance(self, until: float) -> tuple[list[int], bool]:
        """Decodes up to ``until`` (whole steps only, never past the next event).

        Returns the sequences that reached their true length (still running: the caller
        finishes them) and whether the KV cache is full (the caller preempts).
        """
        if not self.finish_step:
            self.time = max(self.time, until)
            return [], False
        start = max(self.time, self.busy_until)
        k_ev, overflow = self._steps_to_event()
        if overflow and k_ev == 0:
            return [], True  # no room for one more step: preempt now, not at an event
        if until <= start:
            return [], False
        if start + self._span(k_ev) <= until + 1e-9:
            k = k_ev
        else:
            k = min(k_ev, self._steps_within(until - start))
        if k > 0:
            span = self._span(k)
            self.steps += k
            self.num_tokens += k * self.num_seqs
            self.generated += k * self.num_seqs
            self.decode_s += span
            self.time = start + span
        done = [] if k < k_ev or overflow else self._finished()
        return done, overflow and k == k_ev

    def _steps_within(self, dt: float) -> int:
        """Largest k with _span(k) <= dt (the quadratic's root, then exact correction)."""
        m = self.model
        n = self.num_seqs
        b = m.A * self.num_tokens + max(m.B, m.C * n) + m.D
        a = m.A * n / 2
        if a <= 0:
            k = int(dt / b)
        else:
            bb = b - a
            k = int((-bb + math.sqrt(bb * bb + 4 * a * dt)) / (2 * a))
        while k > 0 and self._span(k) > dt * (1 + 1e-12):
            k -= 1
        while self._span(k + 1) <= dt * (1 + 1e-12):
            k += 1
        return k

    def _finished(self) -> list[int]:
        out = []
        while self._heap and self._heap[0][0] <= self.steps:
            fs, sid = heapq.heappop(self._heap)
            if self.finish_step.get(sid) == fs and sid not in out:  # re-admitted: 2 entries
                out.append(sid)
        return out

    def newest(self) -> int:
        """The latest admitted running sequence: ``order``'s last key (admission numbers
        grow and a sequence leaves ``order`` before it is admitted again)."""
        return next(reversed(self.order))
