"""The shift executor on the real mesh, with the real shift-aware scheduler (sec. 4, 6.2)."""

import pytest

from pivot.scheduler import Abort, ShiftAwareScheduler, ThroughputModel
from pivot.shifting.device_map import replay
from pivot.shifting.executor import MigrationStats, ShiftExecutor
from pivot.shifting.role_shift import SlotKind
from pivot.shifting.shifter import ShiftError
from pivot.types import GENRM, ReplicaView, Role, SequenceState, ShiftDown, ShiftPlan

pytestmark = pytest.mark.monarch


class Ledger:
    """A replica port that keeps which sequence runs where and checks the action order."""

    def __init__(self):
        self.where: dict[int, str] = {}
        self.log: list[object] = []

    def apply(self, actions):
        stats = MigrationStats()
        for a in actions:
            self.log.append(a)
            if isinstance(a, Abort):
                assert self.where.pop(a.seq_id) == a.replica_id
                stats.aborted += 1
            else:
                assert a.seq_id not in self.where, f"{a} dispatched before its abort"
                self.where[a.seq_id] = a.replica_id
                stats.dispatched += 1
        return stats


def test_a_rollout_replica_shifts_to_reward_and_its_sequences_move(idle_mesh, models):
    m = idle_mesh
    tm = ThroughputModel(A=1e-6, B=0.01, C=1e-4, D=0.001)
    sched = {r: ShiftAwareScheduler(r, tm) for r in (Role.ROLLOUT, Role.REWARD)}
    ledger = Ledger()
    views = {}
    for rid, role, dev in (("ro-a", Role.ROLLOUT, 0), ("ro-b", Role.ROLLOUT, 1),
                           ("rm-a", Role.REWARD, 2)):
        res = m.shifter.shift_up(role, rid, (dev,))
        views[rid] = ReplicaView(rid, role, (dev,), res.kv_capacity)
    sched[Role.ROLLOUT].add_replicas([views["ro-a"], views["ro-b"]])
    sched[Role.REWARD].add_replicas([views["rm-a"]])
    for i in range(6):
        sched[Role.ROLLOUT].submit(SequenceState(i, "policy", 20, 40, generated_len=i))
        sched[Role.REWARD].submit(SequenceState(100 + i, "genrm", 30, 40))
    ledger.apply(sched[Role.ROLLOUT].dispatch() + sched[Role.REWARD].dispatch())
    assert set(ledger.where.values()) == {"ro-a", "ro-b", "rm-a"}

    ex = ShiftExecutor(m.shifter, sched, ledger)
    plan = ShiftPlan(Role.REWARD, (ShiftDown(Role.ROLLOUT, "ro-b", (1,)),
                                   ShiftDown(None, None, (3,))), ((1,), (3,)))
    report = ex.execute(plan)

    assert "ro-b" not in ledger.where.values()
    assert {"reward-0", "reward-1"} <= set(ledger.where.values())
    assert report.migration_down.aborted > 0 and report.migration_up.dispatched > 0
    for s in sched.values():
        s.check()
    assert m.device_map.replicas(Role.REWARD) == {"rm-a": (2,), "reward-0": (1,),
                                                  "reward-1": (3,)}
    for dev in (1, 3):
        w = m.tensors(dev, Role.REWARD, "weights")
        assert all((w[k] == models[GENRM][k]).all() for k in models[GENRM])
    assert set(report.up[0].phases) >= {"gps_read", "load_parameters", "reallocate_temporary"}
    assert set(report.down[0].phases) >= {"discard_temporary", "discard_parameters"}
    assert report.shift_up_s > 0 and report.total_s >= report.shift_up_s
    assert replay(m.device_map.device_host, m.device_map.events) == m.device_map.states


def test_a_slot_out_of_sync_fails_its_shift_is_marked_lost_and_recovers(idle_mesh, models):
    m = idle_mesh
    m.actor(0).shift_up.call_one(Role.ROLLOUT, "rogue").get()  # behind the map's back
    with pytest.raises(ShiftError, match="holds rollout replica rogue"):
        m.shifter.shift_up(Role.REWARD, "rm-z", (0,))
    assert m.device_map.state(0).kind is SlotKind.LOST
    assert m.device_map.replicas() == {}
    assert m.recover((0,)) >= 0
    assert m.describe(0)["role"] is None
    m.shifter.shift_up(Role.REWARD, "rm-z", (0,))
    assert m.describe(0)["replica_id"] == "rm-z"
