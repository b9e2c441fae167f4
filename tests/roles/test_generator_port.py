"""GeneratorPort on real step loops is covered by test_generator_actor.py; this checks the
bookkeeping races with a recording handle (no engine): a migration whose Abort finds the
sequence finished must not run it again, and poll lengths reach ``lengths``."""

from pivot.roles.engine.port import GeneratorPort
from pivot.roles.engine.requests import SeqResult
from pivot.scheduler.actions import Abort, Dispatch
from pivot.types import POLICY, SequenceState


class Recorder:
    def __init__(self, finished=None, lengths=None):
        self.finished, self.lengths = dict(finished or {}), dict(lengths or {})
        self.submitted: list[int] = []

    def submit(self, reqs):
        self.submitted += [r.seq_id for r in reqs]
        return [None] * len(reqs)

    def abort(self, seq_ids):
        return {s: self.finished.pop(s) for s in seq_ids if s in self.finished}

    def collect(self):
        out, self.finished = self.finished, {}
        return out

    def poll(self):
        return self.collect(), dict(self.lengths)

    def first_tokens(self, seq_ids, timeout_s=60.0):
        return 0.0


def test_a_move_whose_abort_finds_the_sequence_finished_does_not_rerun_it():
    a = Recorder(finished={7: SeqResult(7, 3, [4, 5], [-1.0, -1.0], "stop")})
    b = Recorder()
    seqs = {7: SequenceState(7, POLICY, 3, 8, prompt_tokens=[1, 2, 3])}
    port = GeneratorPort({"a": a, "b": b}, seqs, measure_reprefill=False)
    port.apply([Abort(7, "a"), Dispatch(7, "b", resume=True)])
    assert b.submitted == []
    assert list(port.collect()) == [7]


def test_collect_keeps_each_replicas_running_lengths():
    a = Recorder(lengths={3: 9})
    port = GeneratorPort({"a": a}, {}, measure_reprefill=False)
    port.collect()
    assert port.lengths == {"a": {3: 9}}
