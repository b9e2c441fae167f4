"""Cross-host atomic Write and peer-to-peer rebuild through real GPSActor hosts (sec. 5.1):
four host processes in two groups of two, driven from this process."""

import pytest
import torch

from pivot.errors import StateError
from pivot.gps.layout import ParallelLayout
from pivot.testing.gps import (SMALL_GENRM, SMALL_MODELS, SMALL_POLICY, expected_shard,
                               random_state, storage_with_k)

pytestmark = [pytest.mark.monarch, pytest.mark.slow]

DEVICE_HOST = (0, 0, 1, 1, 2, 2, 3, 3)
STORAGE = storage_with_k(list(SMALL_MODELS.values()), 4, 2)


@pytest.fixture(scope="module")
def cluster():
    from monarch.actor import this_host

    from pivot.gps.actor import ActorHost, GPSActor
    from pivot.gps.client import GlobalParameterStorage

    procs = this_host().spawn_procs(per_host={"gps": 4})
    actors = [procs.slice(gps=i).spawn(f"agps{i}", GPSActor, i, STORAGE, SMALL_MODELS)
              for i in range(4)]
    hosts = [ActorHost(i, a) for i, a in enumerate(actors)]
    client = GlobalParameterStorage(list(hosts), SMALL_MODELS, STORAGE, DEVICE_HOST)
    client.load("policy", random_state(SMALL_POLICY, 0))
    client.load("genrm", random_state(SMALL_GENRM, 0))
    spare = []
    yield client, hosts, spare
    client.close()
    for h in client.hosts:
        h.close()
    for p in [procs, *spare]:
        p.stop().get()


class FailingActorHost:
    """An ActorHost whose ``op`` fails once before reaching the actor."""

    def __init__(self, inner, op):
        self.inner, self.index, self.op, self.armed = inner, inner.index, op, True

    def __getattr__(self, op):
        fn = getattr(self.inner, op)
        if op != self.op or not self.armed:
            return fn

        def call(*a, **k):
            self.armed = False
            raise StateError(f"GPS host {self.index}: {op} failed: injected")
        return call


def snapshot(host, model="policy"):
    """(version, {shard key: tensor}) of what a host serves as its latest, via its actor."""
    man = host.acquire(model)
    try:
        keys = [key for key, _, _, _ in man.entries]
        items = [(n, s, (slice(0, shape[0]),)) for (n, s), _, shape, _ in man.entries]
        got = host.get(model, man.version, items)
    finally:
        host.release(model, man.version)
    return man.version, {k: t for k, (t, _) in zip(keys, got)}


def write(client, seed):
    lay = ParallelLayout.create(SMALL_POLICY, dp=2, tp=2)
    full = random_state(SMALL_POLICY, seed)
    devs = (0, 3, 4, 7)
    v = client.write("policy", devs, lay,
                     {d: expected_shard(full, SMALL_POLICY, lay, r) for r, d in enumerate(devs)},
                     verify=True)
    return v, full


def full_reads(client):
    return client.read("policy", (0, 2, 4, 6), ParallelLayout.create(SMALL_POLICY, dp=4),
                       verify=True)


def test_a_failure_on_one_actor_host_mid_write_leaves_all_four_on_the_old_version(cluster):
    client, hosts, _ = cluster
    v0, full = write(client, 1)
    before = [snapshot(h) for h in hosts]
    assert all(v == v0 for v, _ in before)
    for op, host in (("install", 2), ("prepare", 3), ("begin_write", 1)):
        client.hosts[host] = FailingActorHost(hosts[host], op)
        with pytest.raises(StateError, match="injected"):
            write(client, 2)
        client.hosts[host] = hosts[host]
        for h, (v, shards) in zip(hosts, before):
            assert h.versions("policy") == [v0] and h.writing("policy") is None
            got_v, got = snapshot(h)
            assert got_v == v0 and got.keys() == shards.keys()
            assert all(torch.equal(got[k], t) for k, t in shards.items()), (op, h.index)
        out = full_reads(client)
        assert all(torch.equal(out[d][n], t) for d in out for n, t in full.items())
    v1, new = write(client, 2)  # the retry
    assert v1 == v0 + 1 and all(h.latest("policy") == v1 for h in hosts)
    out = full_reads(client)
    assert all(torch.equal(out[d][n], t) for d in out for n, t in new.items())


def test_reads_racing_cross_host_writes_return_one_whole_version(cluster):
    client, _, _ = cluster
    lay = ParallelLayout.create(SMALL_POLICY)
    futs, seen = [], set()
    client.write("policy", (0,), lay,
                 {0: {p.name: torch.zeros(p.shape) for p in SMALL_POLICY.params}})
    for k in range(1, 6):
        fut = client.write_async("policy", (0,), lay,
                                 {0: {p.name: torch.full(p.shape, float(k))
                                      for p in SMALL_POLICY.params}})
        futs.append(fut)
        while not fut.done():
            out = client.read("policy", (2, 5), ParallelLayout.create(SMALL_POLICY, dp=2))
            vals = {float(x) for sd in out.values() for t in sd.values()
                    for x in (t.min(), t.max())}
            assert len(vals) == 1, vals  # every slice from one version
            seen |= vals
    for f in futs:
        f.result(timeout=60)
    assert len(seen) >= 2


def test_a_lost_actor_host_is_rebuilt_peer_to_peer_and_excludes_other_writes(cluster):
    from monarch.actor import this_host

    from pivot.gps.actor import ActorHost, GPSActor
    from pivot.gps.recovery import lost_hosts

    client, hosts, spare = cluster
    v, full = write(client, 3)
    want = {m: snapshot(hosts[3], m) for m in SMALL_MODELS}  # host 1's peer (slot 1, group 1)
    hosts[1].close()  # the store is gone: the host came back empty
    assert lost_hosts(client) == [1]
    procs = this_host().spawn_procs(per_host={"gps": 1})
    spare.append(procs)
    fresh = ActorHost(1, procs.spawn("agps1b", GPSActor, 1, STORAGE, SMALL_MODELS))
    # Another client's rebuild holds host 0's lease: this Write is refused, naming it.
    hosts[0].lease("the rebuild of GPS host 1 (other client)")
    with pytest.raises(StateError, match=r"GPS host 0: Write of policy v\d+ refused: the "
                                         r"rebuild of GPS host 1 \(other client\)"):
        write(client, 4)
    with pytest.raises(StateError, match="refused: the rebuild of GPS host 1 .other client. "
                                         "is in progress"):
        client.rebuild(1, fresh)  # two rebuilds exclude each other as well
    hosts[0].end_lease("the rebuild of GPS host 1 (other client)")
    relayed = []
    for t in client.transports.values():  # the caller must relay nothing
        t.read = lambda *a, _t=t, **k: relayed.append(a) or type(_t).read(_t, *a, **k)
    try:
        report = client.rebuild(1, fresh)
    finally:
        for t in client.transports.values():
            del t.read
    assert not relayed and set(report.senders["policy"]) == {3}
    for m, (ver, shards) in want.items():
        got_v, got = snapshot(fresh, m)
        assert got_v == ver and all(torch.equal(got[k], t) for k, t in shards.items())
    out = full_reads(client)
    assert all(torch.equal(out[d][n], t) for d in out for n, t in full.items())
    assert write(client, 5)[0] == v + 1 and fresh.latest("policy") == v + 1
