"""GPS through real Monarch actors: two host processes, Write then Read from this one."""

import pytest
import torch

from pivot.errors import StateError
from pivot.gps.layout import ParallelLayout, plan_storage, qwen3_model
from pivot.gps.plan import Link
from pivot.gps.transport import LazyTransport, MonarchTransport
from pivot.testing.gps import random_state

pytestmark = pytest.mark.monarch

M = qwen3_model("policy", layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2,
                head_dim=16, vocab=96)


@pytest.fixture(scope="module")
def gps():
    from monarch.actor import this_host

    from pivot.gps.actor import ActorHost, GPSActor
    from pivot.gps.client import GlobalParameterStorage

    storage = plan_storage([M], 2, M.nbytes * 6 // 10, min_split_bytes=0)
    assert storage.k == 2  # each host holds half; device 0 is local to host 0 only
    procs = this_host().spawn_procs(per_host={"gps": 2})
    hosts = [ActorHost(i, procs.slice(gps=i).spawn(f"gps{i}", GPSActor, i, storage,
                                                     {"policy": M}))
             for i in range(2)]
    client = GlobalParameterStorage(hosts, {"policy": M}, storage, (0, 0, 1, 1))
    remote = client.transports[Link.REMOTE]
    # the NIXL agent (and its UCX threads) starts on the first remote transfer only
    assert isinstance(remote, LazyTransport) and not remote.started
    yield client
    client.close()
    for h in hosts:
        h.close()
    procs.stop().get()


def test_write_then_read_through_the_actors_is_bit_identical_over_both_links(gps):
    gps.load("policy", random_state(M, 0))
    lay = ParallelLayout.create(M, dp=2, tp=2)
    full = random_state(M, 1)
    split = dict(lay.split_dims)
    states = {}
    for r, d in enumerate((0, 1, 2, 3)):
        t = lay.coords(r)[2]
        states[d] = {k: v if split[k] is None else v.chunk(2, split[k])[t]
                     for k, v in full.items()}
    v = gps.write("policy", (0, 1, 2, 3), lay, states, verify=True)
    assert v == 1 and gps.latest("policy") == 1
    from pivot.gps.nixl import NixlTransport
    assert isinstance(gps.transports[Link.REMOTE].inner, NixlTransport)
    out = gps.read("policy", (3, 0), ParallelLayout.create(M, dp=2), verify=True)
    for d in (3, 0):
        assert all(torch.equal(out[d][k], full[k]) for k in full)


def test_the_monarch_fallback_path_reads_the_same_bytes(gps):
    local = gps.transports[Link.LOCAL]
    gps.transports[Link.LOCAL] = MonarchTransport()
    try:
        a = gps.read("policy", (0, 2), ParallelLayout.create(M, tp=2), verify=True)
    finally:
        gps.transports[Link.LOCAL] = local
    b = gps.read("policy", (0, 2), ParallelLayout.create(M, tp=2))
    assert all(torch.equal(a[d][k], b[d][k]) for d in a for k in a[d])


def test_an_unknown_version_fails_with_the_hosts_message(gps):
    with pytest.raises(StateError, match="no version 99"):
        gps.read("policy", (0,), ParallelLayout.create(M), version=99)


def test_each_host_actor_finds_distinct_free_ports_on_its_host(gps):
    import socket

    for h in gps.hosts:   # the raw actor: free_ports is no storage op (HOST_OPS)
        ports = h._actor.free_ports.call_one(3).get()
        assert len(set(ports)) == 3
        for p in ports:   # free on this machine (both hosts' procs run here)
            with socket.socket() as s:
                s.bind(("127.0.0.1", p))
