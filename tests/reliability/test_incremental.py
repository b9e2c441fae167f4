"""The incremental checker catches each kind of violation from what an event touched (or
from its O(1) counters), stays quiet on valid changes, and its full check reports a change
the journal missed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pivot.reliability.incremental import IncrementalChecker
from pivot.reliability.invariants import ControlState, EngineReplica, check_state
from pivot.scheduler.scheduler import ShiftAwareScheduler
from pivot.scheduler.throughput import ThroughputModel
from pivot.shifting.device_map import DeviceMap
from pivot.testing.reliability import StaticSource
from pivot.types import POLICY, ReplicaView, Role, SequenceState

MODEL = ThroughputModel(A=1e-6, B=0.01, C=1e-4, D=0.001)


class World:
    """A small healthy state: rollout replicas ro-0 (device 0) and ro-1 (device 1) running
    sequences 0..3, training on device 3, engines agreeing with the scheduler."""

    def __init__(self) -> None:
        self.dm = DeviceMap((0, 0, 0, 0), clock=lambda: 0.0)
        self.ro = ShiftAwareScheduler(Role.ROLLOUT, MODEL)
        self.rm = ShiftAwareScheduler(Role.REWARD, MODEL)
        for d, rid in ((0, "ro-0"), (1, "ro-1")):
            self.dm.begin_shift_up((d,), Role.ROLLOUT, rid)
            self.dm.end_shift_up((d,))
        self.dm.begin_shift_up((3,), Role.TRAINING, "tr-0")
        self.dm.end_shift_up((3,))
        self.ro.add_replicas([ReplicaView("ro-0", Role.ROLLOUT, (0,), 1000),
                              ReplicaView("ro-1", Role.ROLLOUT, (1,), 1000)])
        for i in range(4):
            self.ro.submit(SequenceState(i, POLICY, 10, 100))
        self.ro.dispatch()
        self.engines = {rid: EngineReplica(Role.ROLLOUT, v.devices, 1000, dict(v.running))
                        for rid, v in self.ro.replicas.items()}
        self.expected = {Role.ROLLOUT: {0, 1, 2, 3}, Role.REWARD: set()}
        self.src = StaticSource(ControlState(
            {Role.ROLLOUT: self.ro, Role.REWARD: self.rm}, self.dm, version=0, released=1,
            staleness=2, expected_live=self.expected, engines=self.engines,
            training_devices=(3,)))
        self.chk = IncrementalChecker(self.src)
        assert self.chk.full() == []

    @property
    def touched(self):
        return self.src.touched

    def where(self, sid: int) -> str:
        return self.ro.seqs[sid].replica_id


def _lost(w: World) -> None:  # the workflow released a sequence nobody submitted
    w.expected[Role.ROLLOUT].add(9)
    w.touched.seqs.add(9)


def _lost_untouched(w: World) -> None:  # the same, and the journal missed it
    w.expected[Role.ROLLOUT].add(9)


def _duplicated(w: World) -> None:  # a sequence live in both roles
    w.rm.submit(SequenceState(2, POLICY, 10, 100))
    w.touched.seqs.add(2)


def _unexpected(w: World) -> None:  # a sequence the workflow never released
    w.ro.submit(SequenceState(7, POLICY, 10, 100))
    w.touched.seqs.add(7)


def _neither_waiting_nor_running(w: World) -> None:
    rid = w.where(1)
    v = w.ro.replicas[rid]
    v.num_tokens -= v.running.pop(1)
    w.engines[rid].lengths.pop(1)
    w.ro.seqs[1].replica_id = None
    w.touched.seqs.add(1)
    w.touched.replicas.add(rid)


def _engine_disagrees(w: World) -> None:  # the engine runs a sequence the view lacks
    rid = w.where(0)
    w.engines[rid].lengths[5] = 10
    w.touched.replicas.add(rid)


def _engine_vanished(w: World) -> None:  # an engine gone, its view still there, no touch
    w.engines.pop("ro-1")


def _staleness(w: World) -> None:
    w.src.state = replace(w.src.state, released=4)


def _orphan_device(w: World) -> None:  # active in the map, held by nobody
    w.dm.begin_shift_up((2,), Role.REWARD, "rm-0")
    w.dm.end_shift_up((2,))


def _replica_device_lost(w: World) -> None:
    w.dm.mark_lost((0,), "test")


def _training_device_lost(w: World) -> None:
    w.dm.mark_lost((3,), "test")


def _device_in_two_replicas(w: World) -> None:
    w.rm.add_replicas([ReplicaView("rm-9", Role.REWARD, (1,), 1000)])
    w.engines["rm-9"] = EngineReplica(Role.REWARD, (1,), 1000, {})
    w.touched.replicas.add("rm-9")


def _engine_over_kv(w: World) -> None:
    rid = w.where(0)
    w.engines[rid] = replace(w.engines[rid], kv_capacity=5)
    w.touched.replicas.add(rid)


def _view_over_kv(w: World) -> None:  # the scheduler's view holds more than its capacity
    rid = w.where(0)
    w.ro.replicas[rid].kv_capacity = 5
    w.touched.replicas.add(rid)


def _prefix_shrunk(w: World) -> None:  # a resumed sequence came back shorter
    seq = w.ro.seqs[3]
    seq.generated_len = 5
    w.touched.seqs.add(3)
    assert w.chk.check() == []
    seq.generated_len = 2
    w.touched.seqs.add(3)


def _tokens_changed(w: World) -> None:  # a resumed sequence's token ids differ
    seq = w.ro.seqs[3]
    seq.generated_tokens = [1, 2, 3]
    w.touched.seqs.add(3)
    assert w.chk.check() == []
    seq.generated_tokens = [1, 9, 3, 4]
    w.touched.seqs.add(3)


def _engine_behind(w: World) -> None:  # the engine lost tokens the scheduler recorded
    rid = w.where(0)
    sid = next(iter(w.engines[rid].lengths))
    w.engines[rid].lengths[sid] -= 1
    w.touched.replicas.add(rid)


CASES = {
    "I1 lost": (_lost, "lost"),
    "I1 lost, counter": (_lost_untouched, "expected"),
    "I1 duplicated": (_duplicated, "live in both"),
    "I1 unexpected": (_unexpected, "unexpected"),
    "I1 neither waiting nor running": (_neither_waiting_nor_running, "either waiting"),
    "I1 engine disagrees": (_engine_disagrees, "I1 replica"),
    "I3 engine vanished, counter": (_engine_vanished, "engines"),
    "I2 staleness": (_staleness, "I2"),
    "I3 orphan device": (_orphan_device, "no replica"),
    "I3 replica device lost": (_replica_device_lost, "lost"),
    "I3 training device lost": (_training_device_lost, "lost device 3 is held by training"),
    "I3 device in two replicas": (_device_in_two_replicas, "held by both"),
    "I4 engine over kv": (_engine_over_kv, "I4 engine"),
    "I4 view over kv": (_view_over_kv, "exceed its KV capacity"),
    "I5 prefix shrunk": (_prefix_shrunk, "fewer"),
    "I5 tokens changed": (_tokens_changed, "token ids"),  # the ledger then takes the new ids
    "I5 engine behind": (_engine_behind, "I5"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_incremental_pass_catches_each_kind_of_violation(name):
    inject, needle = CASES[name]
    w = World()
    inject(w)
    full_before = w.chk.stats.full
    v = w.chk.check()
    assert w.chk.stats.full == full_before  # the incremental pass alone
    assert any(needle in x for x in v), v
    assert any(name.split()[0] in x.split()[0] for x in v), v
    if name != "I5 tokens changed":
        assert w.chk.full() != []  # the full check agrees that something is wrong


def test_valid_journaled_changes_pass_both_passes():
    w = World()
    rid = w.where(0)
    # sequence 0 finishes; sequence 4 is released and dispatched; ro-1 grows by 5 tokens
    w.ro.finish(0)
    w.engines[rid].lengths.pop(0)
    w.expected[Role.ROLLOUT] -= {0}
    w.touched.seqs.add(0)
    w.touched.replicas.add(rid)
    w.expected[Role.ROLLOUT].add(4)
    w.ro.submit(SequenceState(4, POLICY, 10, 100))
    for a in w.ro.dispatch():
        w.engines[a.replica_id].lengths[a.seq_id] = 10
        w.touched.replicas.add(a.replica_id)
    w.touched.seqs.add(4)
    grow = {s: n + 5 for s, n in w.ro.replicas["ro-1"].running.items()}
    w.ro.update_lengths("ro-1", grow)
    w.engines["ro-1"].lengths.update(grow)
    w.touched.replicas.add("ro-1")
    w.touched.seqs.update(grow)
    # a reward replica comes up on device 2
    w.dm.begin_shift_up((2,), Role.REWARD, "rm-0")
    w.dm.end_shift_up((2,))
    w.rm.add_replicas([ReplicaView("rm-0", Role.REWARD, (2,), 1000)])
    w.engines["rm-0"] = EngineReplica(Role.REWARD, (2,), 1000, {})
    w.touched.replicas.add("rm-0")
    assert w.chk.check() == []
    assert w.chk.full() == []
    assert check_state(w.src.state) == []


def test_a_change_the_journal_missed_is_reported_by_the_full_check():
    w = World()
    # a sequence moves from ro-0 to ro-1 correctly, but nobody journals it: every counter
    # still agrees, so only the full check's comparison with a rebuild can tell
    sid = w.ro.replicas["ro-0"].running and next(iter(w.ro.replicas["ro-0"].running))
    w.ro.abort("ro-0", sid)
    w.ro.dispatch(["ro-1"])
    w.engines["ro-1"].lengths[sid] = w.engines["ro-0"].lengths.pop(sid)
    w.src.touched.clear()
    assert w.chk.check() == []
    v = w.chk.full()
    assert v and all(x.startswith("checker:") for x in v), v
    assert w.chk.full() == []  # resynchronised


def test_full_check_requires_training_devices_active_under_training():
    w = World()
    w.dm.begin_shift_down((3,))
    v = check_state(w.src.state)
    assert any("device 3 of training is shifting_down" in x for x in v), v
