"""What the scheduler decides and a driver carries out (sec. 6.2, alg. 2).

The scheduler never touches an engine: it emits actions, in the order they must run. A
driver aborts before it dispatches, so an aborted sequence's generated tokens are back in
its ``SequenceState`` when the dispatch that resumes it (a re-prefill) runs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Run ``seq_id`` on ``replica_id``; ``resume`` means it has generated tokens already,
    so the engine re-prefills prompt + generated tokens and continues."""

    seq_id: int
    replica_id: str
    resume: bool = False


@dataclass(frozen=True, slots=True)
class Abort:
    """Stop ``seq_id`` on ``replica_id`` and keep the tokens it generated."""

    seq_id: int
    replica_id: str


Action = Dispatch | Abort
