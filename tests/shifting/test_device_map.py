"""The device map: validated transitions and a replayable log (sec. 5.2)."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pivot.errors import StateError
from pivot.shifting.device_map import DeviceMap, replay
from pivot.shifting.role_shift import SlotKind
from pivot.types import Role


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        self.t += 0.5
        return self.t


def deployed() -> DeviceMap:
    dm = DeviceMap((0, 0, 1, 1), clock=FakeClock())
    dm.begin_shift_up((0, 1), Role.ROLLOUT, "ro-0")
    dm.end_shift_up((0, 1))
    dm.begin_shift_up((2,), Role.REWARD, "rm-0")
    dm.end_shift_up((2,))
    return dm


def test_a_shift_up_then_down_moves_devices_through_shifting_to_active_and_idle():
    dm = deployed()
    assert dm.replicas() == {"ro-0": (0, 1), "rm-0": (2,)}
    dm.begin_shift_down((0, 1), to_role=Role.REWARD)
    s = dm.state(0)
    assert (s.kind, s.from_role, s.to_role) == (SlotKind.SHIFTING_DOWN, Role.ROLLOUT, Role.REWARD)
    dm.end_shift_down((0, 1))
    dm.begin_shift_up((0,), Role.REWARD, "rm-1")
    assert dm.state(0).from_role is Role.ROLLOUT
    dm.end_shift_up((0,))
    assert dm.replicas(Role.REWARD) == {"rm-0": (2,), "rm-1": (0,)}
    assert dm.devices_in(SlotKind.IDLE) == (1, 3)
    times = [e.time for e in dm.events]
    assert times == sorted(times) and times[0] == 0.5


def test_assigning_an_active_device_again_names_the_device_its_owner_and_the_change():
    dm = deployed()
    with pytest.raises(StateError, match=r"device 2 \(host 1\) is active in reward replica "
                                         r"rm-0; cannot shift up to rollout replica ro-1"):
        dm.begin_shift_up((3, 2), Role.ROLLOUT, "ro-1")
    assert dm.state(3).kind is SlotKind.IDLE


def test_half_a_replica_cannot_shift_down():
    dm = deployed()
    with pytest.raises(StateError, match="holds devices \\[0, 1\\], asked for \\[0\\]"):
        dm.begin_shift_down((0,))


def test_a_reused_replica_id_and_a_second_training_replica_are_refused():
    dm = deployed()
    with pytest.raises(StateError, match="replica id ro-0 is already used"):
        dm.begin_shift_up((3,), Role.ROLLOUT, "ro-0")
    dm.begin_shift_up((3,), Role.TRAINING, "tr-0")
    dm.end_shift_up((3,))
    dm.begin_shift_down((2,))
    dm.end_shift_down((2,))
    with pytest.raises(StateError, match="training shifts as a whole"):
        dm.begin_shift_up((2,), Role.TRAINING, "tr-1")


def test_bad_device_ids_and_duplicates_are_refused_before_any_change():
    dm = deployed()
    n = len(dm.events)
    with pytest.raises(StateError, match="device 7 is outside the pool of 4"):
        dm.begin_shift_up((3, 7), Role.ROLLOUT, "ro-9")
    with pytest.raises(StateError, match="name a device twice"):
        dm.begin_shift_up((3, 3), Role.ROLLOUT, "ro-9")
    with pytest.raises(StateError, match="device_host is empty"):
        DeviceMap(())
    assert len(dm.events) == n


def test_lost_devices_stay_out_until_recovered():
    dm = deployed()
    dm.mark_lost((2,), "process died")
    assert dm.state(2).describe() == "lost (process died)"
    with pytest.raises(StateError, match="lost"):
        dm.begin_shift_up((2,), Role.ROLLOUT, "ro-1")
    dm.recover((2,))
    dm.begin_shift_up((2,), Role.ROLLOUT, "ro-1")
    assert replay(dm.device_host, dm.events) == dm.states


OPS = st.lists(st.tuples(st.integers(0, 5), st.sampled_from(list(Role)),
                         st.sets(st.integers(0, 5), min_size=1, max_size=3),
                         st.booleans()), max_size=40)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_random_shift_sequences_never_assign_a_device_twice_and_replay(ops):
    dm = DeviceMap((0, 0, 0, 1, 1, 1), clock=FakeClock())
    ids = itertools.count()
    for pick, role, devs, fail in ops:
        replicas = sorted(dm.replicas().items())
        try:
            if pick % 3 == 0 and replicas:
                rid, rdevs = replicas[pick % len(replicas)]
                dm.begin_shift_down(rdevs, role)
                if fail:
                    dm.mark_lost(rdevs, "failed")
                else:
                    dm.end_shift_down(rdevs)
            elif pick % 3 == 1:
                dm.begin_shift_up(tuple(sorted(devs)), role, f"r{next(ids)}")
                dm.end_shift_up(tuple(sorted(devs)))
            elif fail:
                dm.recover(tuple(sorted(devs)))
        except StateError:
            pass
        owner: dict[int, str] = {}
        for rid, rdevs in dm.replicas().items():
            for d in rdevs:
                assert d not in owner, f"device {d} in {owner.get(d)} and {rid}"
                owner[d] = rid
        assert sum(1 for s in dm.states if s.kind is SlotKind.ACTIVE and s.role is Role.TRAINING
                   and s.replica_id) == sum(len(v) for v in dm.replicas(Role.TRAINING).values())
        assert len(dm.replicas(Role.TRAINING)) <= 1
        assert not dm.devices_in(SlotKind.SHIFTING_UP)
        assert not dm.devices_in(SlotKind.SHIFTING_DOWN)
        _assert_indexes_match_scans(dm)
    assert replay(dm.device_host, dm.events) == dm.states


def _assert_indexes_match_scans(dm: DeviceMap) -> None:
    """The map's lookups (kind, replica, last role) equal scans of its states and events."""
    for kind in SlotKind:
        want = tuple(d for d, s in enumerate(dm.states) if s.kind is kind)
        assert dm.devices_in(kind) == want and dm.count(kind) == len(want)
    for rid in {s.replica_id for s in dm.states if s.replica_id} | {"nobody"}:
        assert dm.replica_devices(rid) == tuple(
            d for d, s in enumerate(dm.states) if s.replica_id == rid)
    for d in range(dm.num_devices):
        last = next((e.before.role for e in reversed(dm.events)
                     if e.device == d and e.before.kind is SlotKind.ACTIVE), None)
        assert dm._last_role(d) is last
    for role in Role:
        assert dm.active_count(role) == sum(len(v) for v in dm.replicas(role).values())


def test_the_indexed_lookups_follow_shifts_losses_and_recoveries():
    dm = deployed()
    _assert_indexes_match_scans(dm)
    dm.begin_shift_down((0, 1), to_role=Role.REWARD)
    _assert_indexes_match_scans(dm)
    dm.end_shift_down((0, 1))
    dm.mark_lost((2,), "died")
    _assert_indexes_match_scans(dm)
    assert dm.replica_devices("rm-0") == () and dm.devices_in(SlotKind.LOST) == (2,)
    dm.recover((2,))
    dm.begin_shift_up((2, 0), Role.REWARD, "rm-1")
    assert dm.state(0).from_role is Role.ROLLOUT and dm.state(2).from_role is Role.REWARD
    dm.end_shift_up((0, 2))
    _assert_indexes_match_scans(dm)
    assert dm.replica_devices("rm-1") == (0, 2)
