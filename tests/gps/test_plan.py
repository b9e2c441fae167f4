"""Tests of the refinement, the greedy plan and the plan cache (appendix B.2)."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pivot.errors import ConfigError
from pivot.gps.layout import ParallelLayout, param_stage, plan_storage, qwen3_model
from pivot.gps.greedy import water_fill
from pivot.gps.plan import Link, LinkProfile, Planner
from pivot.testing.gps import storage_with_k
from pivot.testing.strategies import gps_setups

SETTINGS = settings(max_examples=int(os.environ.get("GPS_EXAMPLES", 60)), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def planner_of(s):
    storage = storage_with_k([s.model], s.hosts, s.k)
    return Planner({"policy": s.model}, storage, s.device_host)


@SETTINGS
@given(gps_setups())
def test_read_slices_tile_every_target_shard_exactly_once(s):
    plan = planner_of(s).read("policy", s.devices, s.layout)
    pairs = set(zip(plan.cell.tolist(), plan.rank.tolist()))
    assert len(pairs) == plan.cell.size  # each (slice, receiver) demand once
    cover = {}
    for r in range(len(s.devices)):
        for name, shape in plan.target_shapes(r).items():
            cover[(r, name)] = np.zeros(shape, dtype=np.int32)
    for (h, r), ts in plan.transfers().items():
        for t in ts:
            slot = plan.storage.param_shards("policy")[t.param].slots[t.shard]
            assert h % plan.storage.k == slot, "sender does not hold the slice"
            cover[(r, t.param)][t.target_box] += 1
    for key, c in cover.items():
        assert (c == 1).all(), f"{key} covered {c.min()}..{c.max()} times"


@SETTINGS
@given(gps_setups())
def test_write_sends_every_slice_to_every_replica_holder_exactly_once(s):
    plan = planner_of(s).write("policy", s.devices, s.layout)
    st_ = plan.storage
    cover = {}
    shards = st_.param_shards("policy")
    meta = {p.name: p for p in s.model.params}
    for name, sh in shards.items():
        for i, ((a, b), slot) in enumerate(zip(sh.rows, sh.slots)):
            for h in st_.holders(slot):
                cover[(h, name, i)] = np.zeros((b - a, *meta[name].shape[1:]), np.int32)
    for (h, r), ts in plan.transfers().items():
        _, stage, t = s.layout.coords(r)
        for tr in ts:
            assert param_stage(meta[tr.param], s.model.num_layers, s.layout.pp) == stage
            cover[(h, tr.param, tr.shard)][tr.shard_box] += 1
    for key, c in cover.items():
        assert (c == 1).all(), f"{key} covered {c.min()}..{c.max()} times"


@SETTINGS
@given(gps_setups(), st.sampled_from(["read", "write"]))
def test_greedy_plan_is_no_worse_than_every_demand_to_its_first_holder(s, op):
    p = planner_of(s)
    greedy = p._plan(op, "policy", s.devices, s.layout, greedy=True)
    first = p._plan(op, "policy", s.devices, s.layout, greedy=False)
    assert greedy.makespan <= first.makespan * (1 + 1e-9) + 1e-15
    assert greedy.cell.size == first.cell.size
    if op == "read":  # disjoint candidate sets: the pure greedy always wins
        assert greedy.strategy == "greedy"


@given(st.lists(st.floats(0, 5), min_size=1, max_size=6),
       st.lists(st.floats(0.01, 3), min_size=6, max_size=6), st.integers(1, 40))
def test_water_fill_equals_the_one_at_a_time_greedy(acc, cost, m):
    acc = np.array(acc)
    cost = np.array(cost[:acc.size])
    a = acc.copy()
    for _ in range(m):
        g = int(np.argmin(a + cost))
        a[g] += cost[g]
    counts = water_fill(acc, cost, m)
    assert counts.sum() == m
    assert np.isclose((acc + counts * cost).max(), a.max())


def test_greedy_gives_a_fast_local_link_more_data_than_a_slow_remote_one():
    m = qwen3_model("policy", layers=2, hidden=256, intermediate=512, heads=4, kv_heads=2,
                    head_dim=64, vocab=512)
    storage = plan_storage([m], hosts=2, budget_bytes=m.nbytes)  # replicated on 2 hosts
    links = LinkProfile(local_bw=4e9, remote_bw=1e9, per_transfer_s=0)
    plan = Planner({"policy": m}, storage, (0, 0), links).read(
        "policy", (0, 1), ParallelLayout.create(m, dp=1, tp=2))
    by_link = {lk: int(plan.cells.nbytes[plan.cell][plan.link == lk].sum()) for lk in Link}
    assert by_link[Link.LOCAL] > 3 * by_link[Link.REMOTE] > 0
    assert plan.makespan <= 1.05 * plan.nbytes / 5e9 + 1e-4


def test_plans_are_cached_by_model_devices_and_layout():
    m = qwen3_model("policy", layers=2, hidden=64, intermediate=128, heads=2, kv_heads=1,
                    head_dim=32, vocab=64)
    p = Planner({"policy": m}, plan_storage([m], 2, m.nbytes), (0, 0, 1, 1))
    lay = ParallelLayout.create(m, dp=2, tp=2)
    a = p.read("policy", (0, 1, 2, 3), lay)
    assert p.read("policy", [0, 1, 2, 3], ParallelLayout.create(m, dp=2, tp=2)) is a
    assert p.read("policy", (1, 0, 2, 3), lay) is not a
    assert p.write("policy", (0, 1, 2, 3), lay) is not a


def test_bad_reads_fail_at_once_naming_the_problem():
    m = qwen3_model("policy", layers=2, hidden=64, intermediate=96, heads=2, kv_heads=1,
                    head_dim=32, vocab=64)
    p = Planner({"policy": m}, plan_storage([m], 1, m.nbytes), (0, 0, 0, 0))
    with pytest.raises(ConfigError, match=r"TP=3 does not divide dim 0 \(size 64\) of "
                                          r"parameter model.embed_tokens.weight"):
        p.read("policy", (0, 1, 2), ParallelLayout.create(m, tp=3))
    with pytest.raises(ConfigError, match=r"devices \[4, 5\] do not exist"):
        p.read("policy", (0, 1, 4, 5), ParallelLayout.create(m, dp=2, tp=2))
    with pytest.raises(ConfigError, match="needs 2 devices, got 1"):
        p.read("policy", (0,), ParallelLayout.create(m, tp=2))
    with pytest.raises(ConfigError, match="no model 'reward'"):
        p.read("reward", (0,), ParallelLayout.create(m))
    with pytest.raises(ConfigError, match="PP=3 exceeds"):
        p.read("policy", (0, 1, 2), ParallelLayout.create(m, pp=3))


# --- The fast greedy equals the straightforward scan-based one -----------------------------

def plans_fast_and_reference(monkeypatch, planner_factory, op, devices, layout):
    import pivot.gps.plan as plan_mod
    from pivot.testing import reference_greedy

    fast = planner_factory()._plan(op, "policy", devices, layout)
    with monkeypatch.context() as mp:
        mp.setattr(plan_mod, "_assign", reference_greedy.assign)
        ref = planner_factory()._plan(op, "policy", devices, layout)
    return fast, ref


def assert_same_plan(fast, ref):
    for f in ("param", "shard", "slot", "r0", "r1", "split", "c0", "c1", "tp", "nbytes"):
        assert np.array_equal(getattr(fast.cells, f), getattr(ref.cells, f)), f
    for f in ("cell", "rank", "host", "link"):
        assert np.array_equal(getattr(fast, f), getattr(ref, f)), f
    assert np.array_equal(fast.sender_load, ref.sender_load)  # bit-identical balance
    assert fast.strategy == ref.strategy and fast.makespan == ref.makespan


@SETTINGS
@given(gps_setups(), st.sampled_from(["read", "write"]))
def test_fast_greedy_plan_equals_the_scan_based_one_on_random_layouts(s, op):
    with pytest.MonkeyPatch.context() as mp:
        fast, ref = plans_fast_and_reference(mp, lambda: planner_of(s), op, s.devices,
                                             s.layout)
    assert_same_plan(fast, ref)


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("op", ["read", "write"])
def test_fast_greedy_plan_equals_the_scan_based_one_with_large_candidate_sets(
        monkeypatch, k, op):
    # 64 devices on 8 hosts: a replicated norm has 64 candidate ranks in a Write (the numpy
    # water fill), replicated GPS gives every host the same slices (many exact ties).
    m = qwen3_model("policy", layers=4, hidden=64, intermediate=128, heads=8, kv_heads=8,
                    head_dim=8, vocab=64)
    storage = (plan_storage([m], 8, m.nbytes) if k == 1
               else storage_with_k([m], 8, k))
    assert storage.k == k
    lay = ParallelLayout.create(m, dp=8, tp=8)
    fast, ref = plans_fast_and_reference(
        monkeypatch, lambda: Planner({"policy": m}, storage, [d // 8 for d in range(64)]),
        op, tuple(range(64)), lay)
    assert_same_plan(fast, ref)


@SETTINGS
@given(st.integers(0, 2**32 - 1))
def test_fast_assign_equals_the_scan_based_one_on_random_demands(seed):
    from pivot.gps.greedy import assign
    from pivot.testing import reference_greedy

    r = np.random.default_rng(seed)
    senders = int(r.integers(1, 70))
    sender_host = r.integers(0, 4, senders)
    candidates = [r.choice(senders, int(r.integers(1, senders + 1)), replace=False)
                  for _ in range(int(r.integers(1, 5)))]
    n = int(r.integers(1, 400))
    nbytes = r.choice([1, 7, 4096, 1 << 20], n)  # few sizes: long runs, many ties
    cset = r.integers(0, len(candidates), n)
    recv_host = r.integers(0, 4, n)
    links = LinkProfile(local_bw=float(r.choice([4e9, 63e9])), remote_bw=1e9,
                        per_transfer_s=float(r.choice([0.0, 5e-6])))
    args = (nbytes, cset, recv_host, recv_host, candidates, sender_host, senders, links, True)
    for a, b in zip(assign(*args), reference_greedy.assign(*args)):
        assert np.array_equal(a, b)
