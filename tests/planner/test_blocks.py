"""Aligned blocks (sec. 5.2): the block arithmetic, and the planner's
``aligned_blocks`` option on random device layouts; its default leaves plans unchanged."""

import hashlib
import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pivot.errors import ConfigError, StateError
from pivot.planner import PivotPlanner
from pivot.planner.blocks import (aligned_blocks, check_blocks_fit, free_blocks, host_slots,
                                  is_aligned, misaligned)
from pivot.planner.shift_pairs import prepare_aligned_shift_pairs, prepare_shift_pairs
from pivot.planner.strategies import RuleBasedPlanner, StaticPlanner
from pivot.reliability.injectors import ForcedShiftPlanner
from pivot.shifting.device_map import DeviceMap
from pivot.planner.baselines import ColocatedPlanner, RolloutRewardColocatedPlanner
from pivot.testing.layouts import random_snapshot
from pivot.testing.planner import MODEL, fill
from pivot.types import ReplicaView, Role, RoleLoad, ShiftDown, TrainingLoad, WorkloadSnapshot

MODELS = {Role.ROLLOUT: MODEL, Role.REWARD: MODEL}


# ---- block arithmetic ------------------------------------------------------------------
def test_blocks_of_two_hosts_of_eight():
    hosts = tuple(d // 8 for d in range(16))
    assert aligned_blocks(hosts, 4) == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11),
                                        (12, 13, 14, 15)]
    assert aligned_blocks(hosts, 3) == [(0, 1, 2), (3, 4, 5), (8, 9, 10), (11, 12, 13)]
    assert is_aligned((4, 5, 6, 7), hosts, 4) and is_aligned((7, 6, 5, 4), hosts, 4)
    assert not is_aligned((2, 3, 4, 5), hosts, 4)      # inside host 0, not at 4j
    assert not is_aligned((6, 7, 8, 9), hosts, 4)      # across hosts
    assert not is_aligned((6, 7, 8), hosts, 3)         # block 2 of size 3 would pass 8
    assert misaligned([(0, 1), (1, 2), (14, 15)], hosts, 2) == [(1, 2)]
    assert free_blocks(hosts, 4, [1, 2, 3, 4, 5, 6, 7, 8]) == [(4, 5, 6, 7)]


def test_interleaved_hosts_count_places_within_each_host():
    hosts = (0, 1, 0, 1, 0, 1, 0, 1)           # device d on host d % 2
    assert host_slots(hosts) == (0, 0, 1, 1, 2, 2, 3, 3)
    assert aligned_blocks(hosts, 2) == [(0, 2), (4, 6), (1, 3), (5, 7)]
    assert is_aligned((4, 6), hosts, 2) and not is_aligned((2, 4), hosts, 2)
    assert not is_aligned((0, 1), hosts, 2)


@settings(max_examples=80, deadline=None)
@given(per_host=st.integers(1, 12), hosts=st.integers(1, 5), size=st.integers(1, 12),
       interleave=st.booleans())
def test_blocks_are_disjoint_aligned_and_fill_each_host(per_host, hosts, size, interleave):
    dh = tuple((d % hosts) if interleave else (d // per_host) for d in range(per_host * hosts))
    blocks = aligned_blocks(dh, size)
    flat = [d for b in blocks for d in b]
    assert len(flat) == len(set(flat))
    assert len(blocks) == hosts * (per_host // size)
    assert all(is_aligned(b, dh, size) and len({dh[d] for d in b}) == 1 for b in blocks)


def test_a_replica_larger_than_every_host_is_refused():
    with pytest.raises(ConfigError, match="reward replica needs 16 devices"):
        check_blocks_fit(tuple(d // 8 for d in range(32)), {"rollout": 8, "reward": 16},
                         "gin/x.gin")


# ---- the planner with the option -------------------------------------------------------
def apply_on_device_map(snap: WorkloadSnapshot, plan) -> DeviceMap:
    """Replays ``snap`` and then ``plan`` on a real device map (its transition checks
    refuse a donor that is not a whole replica or a shift up onto a busy device)."""
    dm = DeviceMap(snap.device_host)
    for load in (snap.rollout, snap.reward):
        for r in load.replicas:
            dm.begin_shift_up(r.devices, load.role, r.replica_id)
            dm.end_shift_up(r.devices)
    if snap.training.devices:
        dm.begin_shift_up(snap.training.devices, Role.TRAINING, "training")
        dm.end_shift_up(snap.training.devices)
    if snap.lost_devices:
        dm.mark_lost(snap.lost_devices, "test")
    for s in plan.down:
        if s.role is not None:
            dm.begin_shift_down(s.devices, plan.up_role)
            dm.end_shift_down(s.devices)
    for i, g in enumerate(plan.up_devices):
        dm.begin_shift_up(g, plan.up_role, f"new{i}")
        dm.end_shift_up(g)
    return dm


def check_aligned_plan(snap: WorkloadSnapshot, plan) -> None:
    own: dict[int, object] = {d: None for d in snap.idle_devices}
    for load in (snap.rollout, snap.reward):
        own.update({d: r.replica_id for r in load.replicas for d in r.devices})
    own.update({d: "training" for d in snap.training.devices})
    freed = [d for s in plan.down for d in s.devices]
    assert len(freed) == len(set(freed))
    for s in plan.down:
        assert all(own[d] == (s.replica_id or ("training" if s.role else None))
                   for d in s.devices), s
    up = [d for g in plan.up_devices for d in g]
    # idle devices may shift up unlisted (the forced planner's plans): both are free
    assert len(up) == len(set(up)) and set(up) <= set(freed) | set(snap.idle_devices)
    if plan.up_role is Role.TRAINING:
        return
    size = snap.role_load(plan.up_role).replica_devices
    assert misaligned(plan.up_devices, snap.device_host, size) == []
    dm = apply_on_device_map(snap, plan)
    for i in range(len(plan.up_devices)):   # what the device map placed
        devs = dm.replica_devices(f"new{i}")
        assert is_aligned(devs, snap.device_host, size)
        assert len({snap.device_host[d] for d in devs}) == 1


@settings(max_examples=300, deadline=None)
@given(rng=st.randoms(use_true_random=False), H=st.sampled_from([5.0, 60.0, 600.0]),
       min_replicas=st.sampled_from([0, 1]))
def test_every_aligned_plan_puts_each_replica_on_a_block_of_one_host(rng, H, min_replicas):
    snap = random_snapshot(rng)
    planner = PivotPlanner(MODEL, MODEL, H=H, min_replicas=min_replicas, aligned_blocks=True)
    try:
        plan = planner.plan(snap)
    except StateError:      # training needs more devices than are alive
        assert snap.training.batch_ready
        return
    if plan is not None:
        check_aligned_plan(snap, plan)
        if plan.up_role is not Role.TRAINING:
            assert plan.benefit > 0


@settings(max_examples=150, deadline=None)
@given(rng=st.randoms(use_true_random=False), up=st.sampled_from([Role.ROLLOUT, Role.REWARD]))
def test_aligned_pairs_free_exactly_whole_blocks(rng, up):
    snap = random_snapshot(rng)
    u = snap.role_load(up).replica_devices
    used: set[int] = set()
    for p in prepare_aligned_shift_pairs(snap, up, MODELS):
        freed = {d for s in p.down for d in s.devices}
        groups = [d for g in p.up_devices for d in g]
        assert set(groups) <= freed and not used & freed   # pairs are exclusive
        used |= freed
        assert all(is_aligned(g, snap.device_host, u) for g in p.up_devices)
        assert all(s.role is not up for s in p.down)


@settings(max_examples=150, deadline=None)
@given(rng=st.randoms(use_true_random=False))
def test_with_replicas_of_one_device_the_option_changes_nothing(rng):
    # every device is its own aligned block, so the aligned pairs are today's pairs
    snap = random_snapshot(rng, sizes=(1, 1))
    for up in (Role.ROLLOUT, Role.REWARD):
        assert prepare_aligned_shift_pairs(snap, up, MODELS) == \
            prepare_shift_pairs(snap, up, MODELS)
    try:
        off = PivotPlanner(MODEL, MODEL).plan(snap)
    except StateError:
        return
    assert PivotPlanner(MODEL, MODEL, aligned_blocks=True).plan(snap) == off


def _plan_key(planner, snap) -> str:
    try:
        p = planner.plan(snap)
    except StateError:
        return "StateError"
    if p is None:
        return "None"
    return repr((p.up_role.value, tuple((d.role.value if d.role else None, d.replica_id,
                                         d.devices) for d in p.down), p.up_devices))


DEFAULT_DIGEST = "01e8c0a27b9dabbe625f35a7cb61d76bfb9611c157352868dc5ff5ee8e514bce"
"""sha256 of the plans of ``_plan_key`` over layouts 0..399 for the two planners below,
made with the planner of commit 4c4b7d4 (before the option existed). It changes if the
default planner's decisions change or if ``pivot.testing.layouts`` draws differently."""


def test_option_off_plans_equal_those_before_the_option():
    keys = []
    for planner in (PivotPlanner(MODEL, MODEL),
                    PivotPlanner(MODEL, MODEL, H=600.0, min_replicas=1, aligned_blocks=False)):
        keys += [_plan_key(planner, random_snapshot(random.Random(s))) for s in range(400)]
    assert sum(k not in ("None", "StateError") for k in keys) > 400   # plans were made
    assert hashlib.sha256("\n".join(keys).encode()).hexdigest() == DEFAULT_DIGEST


def straddling_state() -> WorkloadSnapshot:
    """Two hosts of 8. Rollout (4 devices a replica) is loaded with work waiting; two
    idle reward replicas of 2 sit on (5, 6) and (7, 8), the second across the hosts'
    boundary (as a placement that ignores hosts leaves them); 4, 9, 10, 11 are idle."""
    ro = [ReplicaView("ro0", Role.ROLLOUT, (0, 1, 2, 3), 100_000),
          ReplicaView("ro1", Role.ROLLOUT, (12, 13, 14, 15), 100_000)]
    sid = 0
    for r in ro:
        sid = fill(r, [2000] * 8, sid)
    rm = [ReplicaView("rm0", Role.REWARD, (5, 6), 100_000),
          ReplicaView("rm1", Role.REWARD, (7, 8), 100_000)]
    waiting = [(sid + i, 1000) for i in range(200)]
    return WorkloadSnapshot(0.0, RoleLoad(Role.ROLLOUT, ro, waiting, 4, 100_000, 4),
                            RoleLoad(Role.REWARD, rm, [], 2, 100_000, 8),
                            TrainingLoad(8), tuple(d // 8 for d in range(16)),
                            idle_devices=(4, 9, 10, 11))


def test_the_option_keeps_a_replica_from_straddling_two_hosts():
    snap = straddling_state()
    today = PivotPlanner(MODEL, MODEL).plan(snap)
    assert today.up_role is Role.ROLLOUT and today.up_devices == ((5, 6, 7, 8),)
    assert {snap.device_host[d] for d in today.up_devices[0]} == {0, 1}   # across hosts
    plan = PivotPlanner(MODEL, MODEL, aligned_blocks=True).plan(snap)
    assert plan.up_role is Role.ROLLOUT
    assert plan.up_devices == ((4, 5, 6, 7), (8, 9, 10, 11))
    assert {s.replica_id for s in plan.down} == {None, "rm0", "rm1"}
    check_aligned_plan(snap, plan)


def test_smaller_replicas_freeing_a_non_aligned_set_feed_no_larger_replica():
    # Two hosts of 8. Host 0: rollout replicas of 2 on (0,1) and (4,5) idle, on (2,3)
    # and (6,7) busy; host 1: two reward replicas of 4, with work waiting. Today's pair
    # takes the two cheapest rollout replicas of the host, freeing {0,1,4,5} for one
    # reward replica; aligned, a reward replica takes a whole block [0-3] or [4-7].
    ro = [ReplicaView(f"ro{i}", Role.ROLLOUT, (2 * i, 2 * i + 1), 100_000) for i in range(4)]
    rm = [ReplicaView("rm0", Role.REWARD, (8, 9, 10, 11), 100_000),
          ReplicaView("rm1", Role.REWARD, (12, 13, 14, 15), 100_000)]
    sid = 0
    for r in (ro[1], ro[3], *rm):
        sid = fill(r, [3000] * 4, sid)
    snap = WorkloadSnapshot(0.0, RoleLoad(Role.ROLLOUT, ro, [], 2, 100_000, 8),
                            RoleLoad(Role.REWARD, rm, [(sid + i, 2000) for i in range(300)],
                                     4, 100_000, 4), TrainingLoad(8),
                            tuple(d // 8 for d in range(16)))
    today = PivotPlanner(MODEL, MODEL).plan(snap)
    assert today.up_role is Role.REWARD and (0, 1, 4, 5) in today.up_devices
    pairs = prepare_aligned_shift_pairs(snap, Role.REWARD, MODELS)
    assert [p.up_devices for p in pairs] == [((0, 1, 2, 3),), ((4, 5, 6, 7),)]
    assert [[s.replica_id for s in p.down] for p in pairs] == [["ro0", "ro1"], ["ro2", "ro3"]]
    plan = PivotPlanner(MODEL, MODEL, aligned_blocks=True).plan(snap)
    assert plan is not None and plan.up_role is Role.REWARD
    check_aligned_plan(snap, plan)


def test_the_option_refuses_a_replica_that_fits_no_host():
    snap = straddling_state()
    snap.rollout.replica_devices = 16
    with pytest.raises(ConfigError, match="rollout replica needs 16 devices"):
        PivotPlanner(MODEL, MODEL, aligned_blocks=True).plan(snap)


# ---- the baselines with the option --------------------------------------------------
def _forced(rollout_model, reward_model, aligned_blocks: bool = False) -> ForcedShiftPlanner:
    """The reliability suite's random planner: replica sizes from the snapshot."""
    return ForcedShiftPlanner(rollout_model, reward_model, None, None,
                              np.random.default_rng(0), aligned_blocks=aligned_blocks)


BASELINES = {"colocated": ColocatedPlanner, "rr_colocated": RolloutRewardColocatedPlanner,
             "static": StaticPlanner, "rule_based": RuleBasedPlanner, "forced": _forced}


@settings(max_examples=300, deadline=None)
@given(rng=st.randoms(use_true_random=False), name=st.sampled_from(sorted(BASELINES)),
       rollout_done=st.booleans())
def test_every_baseline_with_the_option_places_replicas_on_aligned_blocks(rng, name,
                                                                         rollout_done):
    snap = random_snapshot(rng)
    planner = BASELINES[name](MODEL, MODEL, aligned_blocks=True)
    if hasattr(planner, "bind"):
        planner.bind(lambda: rollout_done)
    try:
        plan = planner.plan(snap)
    except StateError:      # training needs more devices than are alive
        return
    if plan is not None:
        check_aligned_plan(snap, plan)


def test_rr_colocated_beside_training_takes_the_aligned_block_of_what_it_frees():
    # one host of 4; training holds slot 0, so rollout's turn frees 1, 2, 3: replicas of 2
    # cut from the freed list start at 1 (unaligned), an aligned block is (2, 3)
    snap = WorkloadSnapshot(0.0, RoleLoad(Role.ROLLOUT, [], [(0, 10), (1, 10)], 2, 1000, 2),
                            RoleLoad(Role.REWARD, [], [], 1, 1000, 4),
                            TrainingLoad(1, (0,)), (0, 0, 0, 0), idle_devices=(1, 2, 3))
    off = RolloutRewardColocatedPlanner(MODEL, MODEL).plan(snap)
    assert off.up_devices == ((1, 2),)
    on = RolloutRewardColocatedPlanner(MODEL, MODEL, aligned_blocks=True).plan(snap)
    assert on.up_devices == ((2, 3),) and on.down == (ShiftDown(None, None, (1, 2, 3)),)


def test_the_forced_planner_refuses_replica_sizes_other_than_the_drivers():
    snap = WorkloadSnapshot(0.0, RoleLoad(Role.ROLLOUT, [], [(0, 10), (1, 10)], 2, 1000, 2),
                            RoleLoad(Role.REWARD, [], [], 1, 1000, 4),
                            TrainingLoad(1, (0,)), (0, 0, 0, 0), idle_devices=(1, 2, 3))
    sizes = {Role.ROLLOUT: 1, Role.REWARD: 1}
    planner = ForcedShiftPlanner(MODEL, MODEL, sizes, None, np.random.default_rng(0))
    with pytest.raises(StateError, match="replica_devices: 1 for rollout.*are 2 devices"):
        planner.plan(snap)
