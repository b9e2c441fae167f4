"""Tests of the GPS client: Read after Write, atomic versions, GenRM, bad input, Monarch."""

import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pivot.errors import ConfigError, StateError
from pivot.gps.layout import ParallelLayout, plan_storage
from pivot.gps.plan import Link
from pivot.gps.transport import MonarchTransport, ShmTransport
from pivot.testing.gps import (SMALL_GENRM, SMALL_MODELS, SMALL_POLICY, close_gps,
                               expected_shard, local_gps, random_state, storage_with_k)
from pivot.testing.strategies import gps_setups


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gps_setups(), st.data())
def test_read_after_write_returns_bit_identical_shards_under_any_layout(s, data):
    storage = storage_with_k([s.model], s.hosts, s.k)
    gps, stores = local_gps({"policy": s.model}, storage, s.device_host)
    try:
        gps.load("policy", random_state(s.model, 0))
        full = random_state(s.model, 1)
        states = {d: expected_shard(full, s.model, s.layout, r) for r, d in enumerate(s.devices)}
        v = gps.write("policy", s.devices, s.layout, states, verify=True)
        assert v == 1
        # Read back under another layout: same TP (the split dims divide), new DP / PP.
        tp = s.layout.tp
        pp = data.draw(st.integers(1, min(2, s.model.num_layers)))
        dp = data.draw(st.integers(1, 2))
        lay = ParallelLayout(dp, tp, pp, s.layout.split_dims)
        if lay.world > len(s.device_host):
            lay = s.layout
        devs = data.draw(st.permutations(range(len(s.device_host))))[:lay.world]
        out = gps.read("policy", devs, lay, verify=True)
        for r, d in enumerate(devs):
            want = expected_shard(full, s.model, lay, r)
            assert out[d].keys() == want.keys()
            for name, t in want.items():
                assert torch.equal(out[d][name], t), (d, name)
    finally:
        close_gps(gps, stores)


@pytest.fixture
def sharded():
    """Four hosts in two groups of two; two devices per host."""
    storage = plan_storage(list(SMALL_MODELS.values()), 4,
                           (SMALL_POLICY.nbytes + SMALL_GENRM.nbytes) * 6 // 10, min_split_bytes=0)
    assert storage.k == 2
    gps, stores = local_gps(SMALL_MODELS, storage, (0, 0, 1, 1, 2, 2, 3, 3))
    gps.load("policy", random_state(SMALL_POLICY, 0))
    gps.load("genrm", random_state(SMALL_GENRM, 0))
    yield gps, stores
    close_gps(gps, stores)


def test_a_read_during_writes_returns_one_whole_version(sharded):
    gps, _ = sharded
    lay = ParallelLayout.create(SMALL_POLICY, dp=2, tp=2)
    devs = (0, 3, 4, 7)
    seen, errors, stop = set(), [], threading.Event()

    def write_constant(v):
        full = {p.name: torch.full(p.shape, float(v)) for p in SMALL_POLICY.params}
        gps.write("policy", devs, lay,
                  {d: expected_shard(full, SMALL_POLICY, lay, r) for r, d in enumerate(devs)})

    write_constant(0)

    def reader():
        while not stop.is_set():
            try:
                out = gps.read("policy", devs, lay)
                vals = {float(t.flatten()[0]) for sd in out.values() for t in sd.values()}
                vals |= {float(t.flatten()[-1]) for sd in out.values() for t in sd.values()}
                if len(vals) != 1:
                    errors.append(vals)
                seen.update(vals)
            except Exception as e:  # noqa: BLE001 - surfaced below
                errors.append(e)

    th = threading.Thread(target=reader)
    th.start()
    try:
        for v in range(1, 16):
            write_constant(v)
    finally:
        stop.set()
        th.join()
    assert not errors, errors[:3]
    assert len(seen) >= 2


def test_write_async_overlaps_the_caller_and_installs_the_next_version(sharded):
    gps, _ = sharded
    lay = ParallelLayout.create(SMALL_POLICY, dp=1, tp=2)
    full = random_state(SMALL_POLICY, 5)
    fut = gps.write_async("policy", (1, 2), lay,
                          {d: expected_shard(full, SMALL_POLICY, lay, r)
                           for r, d in enumerate((1, 2))})
    assert fut.result(timeout=60) == 1
    out = gps.read("policy", (5,), ParallelLayout.create(SMALL_POLICY))
    assert all(torch.equal(out[5][k], v) for k, v in full.items())


def test_writing_the_genrm_is_an_error_and_leaves_it_untouched(sharded):
    gps, stores = sharded
    lay = ParallelLayout.create(SMALL_GENRM)
    with pytest.raises(StateError, match="GenRM is frozen"):
        gps.write("genrm", (0,), lay, {0: random_state(SMALL_GENRM, 9)})
    with pytest.raises(StateError, match="GenRM is frozen"):
        gps.write_async("genrm", (0,), lay, {0: random_state(SMALL_GENRM, 9)})
    out = gps.read("genrm", (0,), lay)
    assert all(torch.equal(out[0][k], v) for k, v in random_state(SMALL_GENRM, 0).items())
    assert all(s.versions("genrm") == [0] for s in stores)


def test_bad_reads_and_writes_fail_before_any_work(sharded):
    gps, stores = sharded
    with pytest.raises(StateError, match="no version 3"):
        gps.read("policy", (0,), ParallelLayout.create(SMALL_POLICY), version=3)
    with pytest.raises(ConfigError, match="TP=3 does not divide"):
        gps.read("policy", (0, 1, 2), ParallelLayout.create(SMALL_POLICY, tp=3))
    with pytest.raises(ConfigError, match=r"devices \[8, 9\] do not exist"):
        gps.read("policy", (0, 1, 8, 9), ParallelLayout.create(SMALL_POLICY, dp=4))
    lay = ParallelLayout.create(SMALL_POLICY, tp=2)
    good = expected_shard(random_state(SMALL_POLICY, 3), SMALL_POLICY, lay, 0)
    bad = dict(good, **{"lm_head.weight": torch.zeros(3, 3)})
    with pytest.raises(ConfigError, match=r"lm_head.weight\] is \(3, 3\)"):
        gps.write("policy", (0, 1), lay, {0: good, 1: bad})
    with pytest.raises(ConfigError, match="no entry for device 1"):
        gps.write("policy", (0, 1), lay, {0: good})
    assert all(s.versions("policy") == [0] for s in stores)
    assert all(not s._staged for s in stores)


class CorruptingShm(ShmTransport):
    """The real shared-memory transport, but one copy flips a bit of what lands."""

    def __init__(self):
        super().__init__(threads=1)
        self.armed = False

    def _copy(self, dst, src):
        super()._copy(dst, src)
        if self.armed:
            self.armed = False
            dst.reshape(-1)[:1].view(torch.int32).__ixor__(1)


def test_a_read_whose_bytes_arrive_corrupted_fails_loudly_when_verifying():
    storage = plan_storage([SMALL_POLICY], 1, SMALL_POLICY.nbytes)
    shm = CorruptingShm()
    gps, stores = local_gps({"policy": SMALL_POLICY}, storage, (0,),
                           transports={Link.LOCAL: shm, Link.REMOTE: MonarchTransport()})
    try:
        gps.load("policy", random_state(SMALL_POLICY, 0), device=0)
        shm.armed = True
        with pytest.raises(StateError, match="checksum mismatch on read"):
            gps.read("policy", (0,), ParallelLayout.create(SMALL_POLICY), verify=True)
        out = gps.read("policy", (0,), ParallelLayout.create(SMALL_POLICY), verify=True)  # disarmed
        assert all(torch.equal(out[0][k], v) for k, v in random_state(SMALL_POLICY, 0).items())
    finally:
        close_gps(gps, stores)


def test_nixl_moves_row_and_column_slices_both_ways_bit_identically():
    from pivot.gps.nixl import NixlTransport

    storage = plan_storage([SMALL_POLICY], 2, SMALL_POLICY.nbytes * 6 // 10, min_split_bytes=0)
    nixl = NixlTransport()
    gps, stores = local_gps({"policy": SMALL_POLICY}, storage, (0, 0, 1, 1),
                           transports={Link.LOCAL: nixl, Link.REMOTE: nixl})
    try:
        gps.load("policy", random_state(SMALL_POLICY, 0))
        lay = ParallelLayout.create(SMALL_POLICY, dp=2, tp=2)
        full = random_state(SMALL_POLICY, 1)
        states = {d: {k: v.contiguous()
                      for k, v in expected_shard(full, SMALL_POLICY, lay, r).items()}
                  for r, d in enumerate((0, 1, 2, 3))}
        gps.write("policy", (0, 1, 2, 3), lay, states, verify=True)
        out = gps.read("policy", (3, 0, 1, 2), lay, verify=True)
        for r, d in enumerate((3, 0, 1, 2)):
            want = expected_shard(full, SMALL_POLICY, lay, r)
            assert all(torch.equal(out[d][k], v) for k, v in want.items())
    finally:
        close_gps(gps, stores)


def test_a_read_for_one_device_of_a_tp_layout_returns_only_its_shard(sharded):
    gps, _ = sharded
    lay = ParallelLayout.create(SMALL_POLICY, tp=4)
    devs = (6, 1, 2, 5)
    whole = gps.read("policy", devs, lay)
    full = random_state(SMALL_POLICY, 0)
    for r, d in enumerate(devs):
        one = gps.read("policy", devs, lay, only=(d,), verify=True)
        assert list(one) == [d]
        want = expected_shard(full, SMALL_POLICY, lay, r)
        assert one[d].keys() == want.keys()
        assert all(torch.equal(one[d][k], v) and torch.equal(whole[d][k], v)
                   for k, v in want.items())
        nbytes = sum(t.nbytes for t in one[d].values())
        assert nbytes < SMALL_POLICY.nbytes / 4 * 1.1
    with pytest.raises(ConfigError, match=r"only=\[0\] names devices \[0\] outside "
                                          r"G=\[6, 1, 2, 5\]"):
        gps.read("policy", devs, lay, only=(0,))
