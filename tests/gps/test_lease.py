"""Write leases (sec. 5.1): the pure lease logic, and in-process GPS hosts where a
writer stops mid-Write and the next Write resolves its leftover without abort_write."""

import concurrent.futures
import os
import time

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pivot.errors import ConfigError, StateError
from pivot.gps.client import GlobalParameterStorage
from pivot.gps.layout import ParallelLayout
from pivot.gps.lease import (STAGES, Resolution, WriteLeaseConfig, due, expired, open_lease,
                             remaining, renew, resolve, revoke)
from pivot.testing.gps import (SMALL_GENRM, SMALL_MODELS, SMALL_POLICY, LocalHost, close_gps,
                               expected_shard, local_gps, random_state,
                               storage_with_k)

times = st.floats(0, 1e6, allow_nan=False)
ttls = st.floats(1e-3, 1e4, allow_nan=False)


# --- The pure logic ----------------------------------------------------------------------

@given(t0=times, ttl=ttls, dt=st.floats(0, 2e4, allow_nan=False))
def test_a_lease_expires_exactly_when_ttl_passes_without_renewal(t0, ttl, dt):
    lease = open_lease("w", 3, ttl, t0)
    assert expired(lease, t0 + dt) == (t0 + dt > t0 + ttl)
    assert remaining(lease, t0) == pytest.approx(ttl)


@given(t0=times, ttl=ttls, gaps=st.lists(st.floats(0, 1, allow_nan=False), max_size=20))
def test_renewals_each_within_the_ttl_keep_a_lease_alive(t0, ttl, gaps):
    lease, now = open_lease("w", 0, ttl, t0), t0
    for g in gaps:
        now += g * ttl
        assert not expired(lease, now)
        lease = renew(lease, "w", 0, now)
    assert lease.deadline == pytest.approx(now + ttl) and lease.started == t0


def test_a_renewal_never_moves_the_deadline_back():
    lease = renew(open_lease("w", 0, 10.0, 100.0), "w", 0, 50.0)
    assert lease.deadline == 110.0


def test_renewing_someone_elses_lease_or_version_is_a_fencing_error():
    lease = open_lease("w", 4, 10.0, 0.0)
    with pytest.raises(StateError, match="held by 'w'.*'z' renewing v4 lost its lease"):
        renew(lease, "z", 4, 1.0)
    with pytest.raises(StateError, match="renewing v5"):
        renew(lease, "w", 5, 1.0)


@given(t0=times, ttl=ttls)
def test_revoke_ends_only_the_named_holders_lease(t0, ttl):
    lease = open_lease("w", 0, ttl, t0)
    assert expired(revoke(lease, "w", t0), t0)
    assert revoke(lease, "other", t0) == lease


@given(stage=st.sampled_from(STAGES), t0=times, ttl=ttls, late=st.booleans(),
       published=st.one_of(st.none(), st.integers(0, 10)))
def test_resolve_refuses_live_writes_and_rolls_forward_only_what_another_host_published(
        stage, t0, ttl, late, published):
    lease = open_lease("w", 5, ttl, t0)
    now = t0 + (2 * ttl if late else ttl / 2)
    got = resolve(lease, stage, now, published)
    if not late:
        assert got is Resolution.REFUSE
    elif stage == "installed" and published == 5:
        assert got is Resolution.ROLL_FORWARD
    else:
        assert got is Resolution.DISCARD  # nobody can have published a staged version
    assert resolve(None, None, now, published) is Resolution.NONE
    # the same writer writing again (restarted): its earlier Write is dead, lease or not
    again = resolve(lease, stage, now, published, holder="w")
    assert again is (Resolution.ROLL_FORWARD if stage == "installed" and published == 5
                     else Resolution.DISCARD)
    assert resolve(lease, stage, now, published, holder="z") is got
    assert resolve(open_lease("", 5, ttl, t0), stage, t0, published, holder="") \
        is Resolution.REFUSE  # no id: never taken for a restart


def test_due_asks_for_a_renewal_every_quarter_lease():
    assert not due(0.0, 8.0, 1.9) and due(0.0, 8.0, 2.0)


@pytest.mark.parametrize("ttl", [0, -1.0, float("inf"), "60"])
def test_a_bad_ttl_is_a_config_error_naming_the_binding(ttl):
    with pytest.raises(ConfigError, match=r"WriteLeaseConfig.ttl_s="):
        WriteLeaseConfig(ttl)


# --- In-process hosts ----------------------------------------------------------------------

DEVICE_HOST = (0, 0, 1, 1)
FULL = ParallelLayout.create(SMALL_POLICY)


def constant(v):
    return {p.name: torch.full(p.shape, float(v)) for p in SMALL_POLICY.params}


@pytest.fixture
def two():
    """Two hosts each holding half of the policy (a Write touches both), policy at v0."""
    storage = storage_with_k(list(SMALL_MODELS.values()), 2, 2)
    gps, stores = local_gps(SMALL_MODELS, storage, DEVICE_HOST)
    gps.load("policy", constant(1))
    gps.load("genrm", random_state(SMALL_GENRM, 0))
    yield gps, stores, storage
    close_gps(gps, stores)


def client(stores, storage, gps, ttl):
    """Another client of the same hosts (ttl None: the lease from gin)."""
    return GlobalParameterStorage([LocalHost(s) for s in stores], SMALL_MODELS, storage,
                                  DEVICE_HOST, transports=dict(gps.transports),
                                  lease=None if ttl is None else WriteLeaseConfig(ttl))


def values(gps):
    out = gps.read("policy", (0, 2), ParallelLayout.create(SMALL_POLICY, dp=2))
    return {float(x) for sd in out.values() for t in sd.values() for x in (t.min(), t.max())}


def stop_mid_write(stores, holder, ttl, stage):
    """What a writer that died at ``stage`` left on every host (v1 of the policy)."""
    paths = []
    for s in stores:
        man = s.begin_write("policy", 1, holder=holder, ttl_s=ttl, published=0)
        s.put("policy", 1, [(k, i, (slice(None),), torch.full(shape, 9.0))
                            for (k, i), _, shape, _ in man.entries])
        paths.append(man.path)
        if stage in ("prepared", "installed"):
            s.prepare("policy", 1)
        if stage == "installed":
            s.install("policy", 1)
    return paths


@pytest.mark.parametrize("stage", ["staged", "installed"])
def test_after_the_lease_expires_the_next_write_discards_the_dead_writers_version(two, stage):
    gps, stores, storage = two
    paths = stop_mid_write(stores, "dead", 0.3, stage)
    t0 = time.monotonic()
    with pytest.raises(StateError, match=r"v1 is in progress \(" + stage + ", by 'dead'"):
        gps.write("policy", (0,), FULL, {0: constant(2)})  # refused while the lease lives
    assert values(gps) == {1.0}  # readers see the last committed version meanwhile
    time.sleep(max(0.0, 0.35 - (time.monotonic() - t0)))
    assert gps.write("policy", (0,), FULL, {0: constant(2)}) == 1
    assert values(gps) == {2.0} and all(s.versions("policy") == [1] for s in stores)
    if stage == "staged":  # a staged arena is unlinked, never recycled into the new Write
        assert not any(os.path.exists(p) for p in paths)


def test_a_version_published_on_one_host_before_the_writer_died_is_rolled_forward(two):
    gps, stores, _ = two
    stop_mid_write(stores, "dead", 0.2, "installed")
    stores[0].publish("policy", 1)  # died after publishing on host 0 only
    assert values(gps) == {9.0}  # Reads pin v1 on host 1 by number
    time.sleep(0.25)
    assert gps.write("policy", (0,), FULL, {0: constant(3)}) == 2
    assert all(s.latest("policy") == 2 for s in stores) and values(gps) == {3.0}


def test_writer_lost_ends_the_lease_at_once_and_a_slow_writer_is_fenced_off(two):
    gps, stores, storage = two
    slow = client(stores, storage, gps, 3600.0)
    for s in stores:
        s.begin_write("policy", 1, holder=slow.holder, ttl_s=3600.0, published=0)
    assert [x[1:] for x in gps.writer_lost(slow.holder)] == [("policy", 1)] * 2
    assert all(s.writing("policy") is None for s in stores)  # staged: discarded now
    with pytest.raises(StateError, match="no longer in progress"):
        stores[0].renew("policy", 1, slow.holder)
    with pytest.raises(StateError, match="no write of policy version 1"):
        stores[1].put("policy", 1, [])
    assert gps.write("policy", (0,), FULL, {0: constant(4)}) == 1 and values(gps) == {4.0}
    slow.close()


def test_a_writer_restarted_under_the_same_id_supersedes_its_dead_write_at_once(two):
    gps, stores, storage = two
    stop_mid_write(stores, "trainer-0", 3600.0, "staged")
    again = GlobalParameterStorage([LocalHost(s) for s in stores], SMALL_MODELS, storage,
                                   DEVICE_HOST, transports=dict(gps.transports),
                                   holder="trainer-0")
    with pytest.raises(StateError, match="in progress"):  # another id must wait
        gps.write("policy", (0,), FULL, {0: constant(2)})
    assert again.write("policy", (0,), FULL, {0: constant(7)}) == 1 and values(gps) == {7.0}
    again.close()


def test_a_writer_renews_its_lease_while_its_write_runs_longer_than_the_lease(two):
    gps, stores, storage = two
    w = client(stores, storage, gps, 0.4)
    slowed = {}
    for link, t in w.transports.items():
        class Slow(type(t)):  # the real transport, each (host, device) copy 0.15 s longer
            def write(self, *a, **k):
                time.sleep(0.15)
                return super().write(*a, **k)
        slowed[link] = Slow()
    w.transports = slowed
    lay = ParallelLayout.create(SMALL_POLICY, tp=2)
    full = constant(5)
    states = {d: expected_shard(full, SMALL_POLICY, lay, r) for r, d in enumerate((0, 1))}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        t0 = time.monotonic()
        fut = pool.submit(w.write, "policy", (0, 1), lay, states)  # 4 copies: 0.6 s
        time.sleep(0.5)  # past the lease: only renewals keep it
        with pytest.raises(StateError, match=r"v1 is in progress \(staged"):
            gps.write("policy", (0,), FULL, {0: constant(6)})
        assert fut.result(timeout=30) == 1
    assert time.monotonic() - t0 > 0.5 and values(gps) == {5.0}
    w.close()


def test_the_lease_comes_from_gin_and_reaches_every_host(two):
    import gin

    gps, stores, storage = two
    gin.parse_config("WriteLeaseConfig.ttl_s = 5.0")
    try:
        w = client(stores, storage, gps, None)
    finally:
        gin.clear_config()
    assert w.lease.ttl_s == 5.0 and gps.lease.ttl_s == 60.0
    for s in stores:
        s.begin_write("policy", 1, holder=w.holder, ttl_s=w.lease.ttl_s, published=0)
        assert s._writing["policy"].lease.ttl_s == 5.0
    w.close()


def test_a_rebuild_resolves_a_dead_writers_expired_write_instead_of_being_refused():
    from pivot.gps.storage import HostStore
    from pivot.testing.gps import kill_host

    storage = storage_with_k(list(SMALL_MODELS.values()), 4, 2)
    gps, stores = local_gps(SMALL_MODELS, storage, (0, 0, 1, 1, 2, 2, 3, 3))
    fresh = HostStore(1, storage, SMALL_MODELS)
    try:
        gps.load("policy", constant(1))
        stop_mid_write(stores, "dead", 0.2, "installed")
        stores[0].publish("policy", 1)  # died mid-publish: host 0 serves v1
        time.sleep(0.25)
        kill_host(gps, stores, 1)
        report = gps.rebuild(1, LocalHost(fresh))
        assert report.versions["policy"] == 1  # rolled forward where installed, then rebuilt
        assert [stores[h].latest("policy") for h in (0, 2, 3)] == [1, 1, 1]
        assert fresh.latest("policy") == 1
        assert all(stores[h].writing("policy") is None for h in (0, 2, 3))
        out = gps.read("policy", (0, 2, 4, 6), ParallelLayout.create(SMALL_POLICY, dp=4))
        assert {float(x) for sd in out.values() for t in sd.values()
                for x in (t.min(), t.max())} == {9.0}
    finally:
        fresh.close()
        close_gps(gps, stores)
