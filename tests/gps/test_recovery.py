"""Tests of GPS fault recovery (sec. 5.1): a lost host is rebuilt from a replica or from a
checkpoint at the same version; a Read checks the sizes and checksums of what it gets."""

import pytest
import torch

from pivot.errors import ConfigError, StateError
from pivot.gps.layout import ParallelLayout, plan_storage
from pivot.gps.plan import Link
from pivot.gps.recovery import (Checkpoint, PeerTransports, host_shards, lost_hosts,
                                 rebuild_host)
from pivot.gps.storage import HostStore
from pivot.gps.transport import MonarchTransport, ShmTransport
from pivot.testing.gps import (SMALL_GENRM, SMALL_MODELS, SMALL_POLICY, DeadHost, LocalHost,
                               close_gps, expected_shard, kill_host, local_gps, random_state,
                               storage_with_k)


def snapshot(store, model):
    v = store.latest(model)
    return v, {k: t.clone() for k, t in store.tensors(model, v).items()}


def write_policy(gps, seed, devs=(0, 1)):
    lay = ParallelLayout.create(SMALL_POLICY, dp=1, tp=2)
    full = random_state(SMALL_POLICY, seed)
    v = gps.write("policy", devs, lay,
                  {d: expected_shard(full, SMALL_POLICY, lay, r) for r, d in enumerate(devs)})
    return v, full


def read_all(gps, devs):
    out = gps.read("policy", devs, ParallelLayout.create(SMALL_POLICY, dp=len(devs)), verify=True)
    return out


@pytest.mark.parametrize("hosts,k", [(4, 1), (4, 2)])
def test_a_lost_replica_is_rebuilt_from_a_peer_bit_identically_at_the_same_version(hosts, k):
    storage = storage_with_k(list(SMALL_MODELS.values()), hosts, k)
    assert storage.k == k and storage.groups >= 2
    gps, stores = local_gps(SMALL_MODELS, storage, tuple(h for h in range(hosts) for _ in (0, 1)))
    fresh = None
    try:
        gps.load("policy", random_state(SMALL_POLICY, 0))
        gps.load("genrm", random_state(SMALL_GENRM, 0))
        v, full = write_policy(gps, 1)
        assert v == 1
        lost = 1
        peer = lost + k  # the same slot in the next group
        want = {m: snapshot(stores[peer], m) for m in SMALL_MODELS}
        kill_host(gps, stores, lost)
        assert lost_hosts(gps) == [lost]
        with pytest.raises(StateError):
            read_all(gps, (2, 3))  # devices on the lost host
        fresh = HostStore(lost, storage, SMALL_MODELS)
        report = gps.rebuild(lost, LocalHost(fresh))
        assert report.versions == {"policy": 1, "genrm": 0}
        assert report.from_checkpoint == []
        assert set(report.senders["policy"]) <= set(storage.holders(lost % k)) - {lost}
        for m, (ver, tensors) in want.items():
            assert fresh.latest(m) == ver
            got = fresh.tensors(m, ver)
            assert got.keys() == tensors.keys()
            assert all(torch.equal(got[key], t) for key, t in tensors.items()), m
        assert lost_hosts(gps) == []
        out = read_all(gps, (2, 3))  # now served by the rebuilt host
        assert all(torch.equal(out[2][n], t) for n, t in full.items())
        v2, full2 = write_policy(gps, 2, devs=(2, 3))  # Writes reach it again
        assert v2 == 2 and fresh.latest("policy") == 2
        out = read_all(gps, (2, 4))
        assert all(torch.equal(out[2][n], t) for n, t in full2.items())
    finally:
        close_gps(gps, stores)
        if fresh is not None:
            fresh.close()


@pytest.fixture
def one_group():
    """Two hosts, one group of two: every shard has exactly one copy."""
    storage = plan_storage([SMALL_POLICY], 2, SMALL_POLICY.nbytes * 6 // 10, min_split_bytes=0)
    assert storage.k == 2 and storage.groups == 1
    gps, stores = local_gps({"policy": SMALL_POLICY}, storage, (0, 0, 1, 1))
    gps.load("policy", random_state(SMALL_POLICY, 0))
    v, full = write_policy(gps, 1)
    assert v == 1
    fresh = []
    yield gps, stores, storage, full, fresh
    close_gps(gps, stores)
    for s in fresh:
        s.close()


def test_a_lost_unique_shard_is_rebuilt_from_the_checkpoint_of_that_version(one_group):
    gps, stores, storage, full, fresh = one_group
    ver, before = snapshot(stores[1], "policy")
    assert before and ver == 1
    kill_host(gps, stores, 1)
    assert lost_hosts(gps) == [1]
    new = HostStore(1, storage, {"policy": SMALL_POLICY})
    fresh.append(new)
    stale = Checkpoint(0, random_state(SMALL_POLICY, 0))
    with pytest.raises(StateError, match="checkpoint is version 0 but the surviving GPS "
                                         "hosts hold version 1"):
        rebuild_host(gps, 1, LocalHost(new), checkpoints={"policy": stale})
    assert new.versions("policy") == [] and isinstance(gps.hosts[1], DeadHost)
    report = rebuild_host(gps, 1, LocalHost(new),
                          checkpoints={"policy": Checkpoint(1, full)})
    assert report.from_checkpoint == ["policy"] and report.versions == {"policy": 1}
    assert report.nbytes == sum(s.nbytes for s in host_shards(storage, SMALL_POLICY, 1))
    got = new.tensors("policy", 1)
    assert got.keys() == before.keys()
    assert all(torch.equal(got[k], t) for k, t in before.items())
    out = gps.read("policy", (0, 2), ParallelLayout.create(SMALL_POLICY, dp=2), verify=True)
    for d in (0, 2):
        assert all(torch.equal(out[d][n], t) for n, t in full.items())


def test_a_rebuild_with_neither_replica_nor_checkpoint_fails_naming_model_slices_and_fix(
        one_group):
    gps, stores, storage, full, fresh = one_group
    kill_host(gps, stores, 1)
    new = HostStore(1, storage, {"policy": SMALL_POLICY})
    fresh.append(new)
    lost = host_shards(storage, SMALL_POLICY, 1)
    with pytest.raises(StateError) as e:
        gps.rebuild(1, LocalHost(new))
    msg = str(e.value)
    assert "cannot rebuild GPS host 1" in msg and "model 'policy' version 1" in msg
    assert f"{len(lost)} slices" in msg and f"{lost[0].param}[{lost[0].r0}:{lost[0].r1}]" in msg
    assert "Checkpoint(1, full_state)" in msg and "no checkpoint was given" in msg
    assert new.versions("policy") == [] and isinstance(gps.hosts[1], DeadHost)
    # A checkpoint missing a parameter is refused before anything is installed.
    partial = {k: v for k, v in full.items() if k != lost[0].param}
    with pytest.raises(ConfigError, match=f"checkpoint lacks parameter {lost[0].param}"):
        gps.rebuild(1, LocalHost(new), checkpoints={"policy": Checkpoint(1, partial)})
    assert new.versions("policy") == []


def test_a_replacement_that_is_not_empty_or_for_another_host_is_refused(one_group):
    gps, stores, storage, full, fresh = one_group
    kill_host(gps, stores, 1)
    other = HostStore(0, storage, {"policy": SMALL_POLICY})
    fresh.append(other)
    with pytest.raises(ConfigError, match="replacement store is for host 0, not 1"):
        gps.rebuild(1, LocalHost(other))
    used = HostStore(1, storage, {"policy": SMALL_POLICY})
    fresh.append(used)
    used.begin_write("policy", 7)
    used.commit("policy", 7)
    with pytest.raises(ConfigError, match="already holds"):
        gps.rebuild(1, LocalHost(used), checkpoints={"policy": Checkpoint(1, full)})


def test_rebuild_pulling_over_the_monarch_path_is_verified_and_bit_identical():
    storage = plan_storage([SMALL_POLICY], 2, SMALL_POLICY.nbytes)  # replicated on 2 hosts
    gps, stores = local_gps({"policy": SMALL_POLICY}, storage, (0, 1),
                           transports={Link.LOCAL: MonarchTransport(),
                                       Link.REMOTE: MonarchTransport()})
    new = HostStore(0, storage, {"policy": SMALL_POLICY})
    try:
        gps.load("policy", random_state(SMALL_POLICY, 3), device=1)
        _, want = snapshot(stores[1], "policy")
        kill_host(gps, stores, 0)
        peers = PeerTransports(MonarchTransport(), shm=False)
        report = gps.rebuild(0, LocalHost(new, peers), via_device=1)
        assert peers.remote is not None and peers.shm is None
        assert report.senders == {"policy": {1: report.nbytes}}
        got = new.tensors("policy", 0)
        assert all(torch.equal(got[k], t) for k, t in want.items())
    finally:
        close_gps(gps, stores)
        new.close()


# --- A Read checks what it received -------------------------------------------------------

class TruncatingHost(LocalHost):
    """Returns the first row only of every multi-row slice (a short or stale reply)."""

    def get(self, model, version, items):
        return [(t[:1].clone(), c) if t.shape[0] > 1 else (t, c)
                for t, c in self.store.get(model, version, items)]


class FlippingHost(LocalHost):
    """Flips one bit of the first slice it returns, keeping the checksum it sent."""

    def get(self, model, version, items):
        out = self.store.get(model, version, items)
        t, c = out[0]
        t.reshape(-1)[:1].view(torch.int32).__ixor__(1)
        return out


@pytest.mark.parametrize("verify", [False, True])
def test_a_read_that_receives_a_slice_of_the_wrong_size_fails_loudly(verify):
    storage = plan_storage([SMALL_POLICY], 1, SMALL_POLICY.nbytes)
    gps, stores = local_gps({"policy": SMALL_POLICY}, storage, (0,),
                           transports={Link.LOCAL: MonarchTransport(),
                                       Link.REMOTE: MonarchTransport()})
    try:
        gps.load("policy", random_state(SMALL_POLICY, 0))
        gps.hosts[0] = TruncatingHost(stores[0])
        with pytest.raises(StateError, match=r"size mismatch on read of policy .* GPS host 0: "
                                             r"got shape \(1, "):
            gps.read("policy", (0,), ParallelLayout.create(SMALL_POLICY), verify=verify)
    finally:
        close_gps(gps, stores)


def test_a_read_whose_bytes_are_corrupted_on_the_remote_path_fails_its_checksum():
    storage = plan_storage([SMALL_POLICY], 1, SMALL_POLICY.nbytes)
    gps, stores = local_gps({"policy": SMALL_POLICY}, storage, (0,),
                           transports={Link.LOCAL: MonarchTransport(),
                                       Link.REMOTE: MonarchTransport()})
    try:
        gps.load("policy", random_state(SMALL_POLICY, 0))
        gps.hosts[0] = FlippingHost(stores[0])
        with pytest.raises(StateError, match="checksum mismatch on read"):
            gps.read("policy", (0,), ParallelLayout.create(SMALL_POLICY), verify=True)
    finally:
        close_gps(gps, stores)


def test_a_shm_read_from_a_store_with_another_layout_fails_on_sizes():
    storage = plan_storage([SMALL_POLICY], 1, SMALL_POLICY.nbytes)
    gps, stores = local_gps({"policy": SMALL_POLICY}, storage, (0,),
                           transports={Link.LOCAL: ShmTransport(), Link.REMOTE: ShmTransport()})
    other = plan_storage([SMALL_POLICY], 2, SMALL_POLICY.nbytes * 6 // 10, min_split_bytes=0)
    wrong = HostStore(0, other, {"policy": SMALL_POLICY})  # holds only half of each split tensor
    try:
        man = wrong.begin_write("policy", 0)
        wrong.commit("policy", 0)
        assert man.nbytes < SMALL_POLICY.nbytes
        gps.hosts[0] = LocalHost(wrong)
        with pytest.raises(StateError, match="size mismatch on read of policy"):
            gps.read("policy", (0,), ParallelLayout.create(SMALL_POLICY))
    finally:
        close_gps(gps, stores)
        wrong.close()
