"""A writer process killed with SIGKILL mid-Write does not block GPS (sec. 5.1).

Two GPSActor host processes hold the policy (half each); a GPSWriter in a third process
writes real tensors through them (shared memory to host 0, NIXL to host 1) and is killed
after two (host, device) transfers, leaving a staged version on both hosts. Nobody calls
abort_write: the next Write, from this process, commits once the dead writer's lease has
expired (fallback) or at once when the owner of the writer's proc relays its death from
Monarch supervision (fast path); Reads meanwhile return the last committed version.
"""

import os
import signal
import time

import pytest
import torch

from pivot.errors import StateError
from pivot.gps.layout import ParallelLayout, plan_storage, qwen3_model
from pivot.testing.gps import expected_shard, random_state

pytestmark = [
    pytest.mark.monarch, pytest.mark.slow,
    # In a full session the SIGKILLed writer's link times out ~30 s later and the pytest
    # process then died silently a few modules on (twice, at the same test): the suite runs
    # this module in a process of its own (test_lease_monarch_isolated.py), which sets
    # PIVOT_KILL_TESTS=1.
    pytest.mark.skipif(os.environ.get("PIVOT_KILL_TESTS") != "1",
                       reason="kills a proc: run by test_lease_monarch_isolated.py in a "
                              "process of its own (or set PIVOT_KILL_TESTS=1)"),
]

M = qwen3_model("policy", layers=4, hidden=256, intermediate=512, heads=4, kv_heads=2,
                head_dim=64, vocab=512)
MODELS = {"policy": M}
DEVICE_HOST = (0, 0, 1, 1)
STORAGE = plan_storage([M], 2, M.nbytes * 6 // 10, min_split_bytes=0)
TP = ParallelLayout.create(M, tp=2)
FULL = ParallelLayout.create(M, dp=2)


@pytest.fixture(scope="module")
def cluster():
    from monarch.actor import this_host

    from pivot.compat.monarch import install_fault_hook
    from pivot.gps.actor import ActorHost, GPSActor
    from pivot.gps.client import GlobalParameterStorage

    assert STORAGE.k == 2  # a Write touches both hosts
    faults = []
    # killed writers' faults (some arrive ~30 s later, when their links time out) must not
    # end the session: the listener stays for the rest of the process
    install_fault_hook(faults.append, key="test_lease_monarch")
    procs = this_host().spawn_procs(per_host={"gps": 2})
    actors = [procs.slice(gps=i).spawn(f"lgps{i}", GPSActor, i, STORAGE, MODELS)
              for i in range(2)]
    gps = GlobalParameterStorage([ActorHost(i, a) for i, a in enumerate(actors)], MODELS,
                                 STORAGE, DEVICE_HOST)
    gps.load("policy", random_state(M, 0))
    read_full(gps)  # this client's NIXL agent starts now, not inside a lease
    yield gps, actors, faults
    gps.close()
    for h in gps.hosts:
        h.close()
    procs.stop().get()


def read_full(gps):
    out = gps.read("policy", (0, 2), FULL)
    return out[0], out[2]


def equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def start_and_kill(actors, ttl_s, seed, tmp_path):
    """Spawns a writer proc, starts its Write, kills it after two transfers; returns
    (holder, seconds the writer ran its Write, time of the kill). The dead proc's mesh is
    left alone: a message to it is never acknowledged."""
    from monarch.actor import this_host

    from pivot.testing.gps_writer import GPSWriter

    wprocs = this_host().spawn_procs(per_host={"w": 1})
    writer = wprocs.spawn(f"writer{seed}", GPSWriter, actors, MODELS, STORAGE, DEVICE_HOST, ttl_s)
    pid, holder = writer.whoami.call_one().get()
    full = random_state(M, seed)
    states = {d: expected_shard(full, M, TP, r) for r, d in enumerate((0, 1))}
    marker = tmp_path / f"paused-{seed}"
    t0 = time.monotonic()
    writer.start_write.call_one("policy", [0, 1], TP, states, 2, str(marker)).get()
    while not marker.exists():
        assert time.monotonic() - t0 < 120, "the writer never reached its second transfer"
        time.sleep(0.01)
    ran = time.monotonic() - t0
    os.kill(pid, signal.SIGKILL)
    return holder, ran, time.monotonic()


def write_until_committed(gps, committed, new, timeout_s):
    """Retries a Write of ``new`` until it commits; every Read in between must return
    ``committed``. Returns (version, refusals, seconds)."""
    states = {d: expected_shard(new, M, TP, r) for r, d in enumerate((0, 1))}
    refused, t0 = 0, time.monotonic()
    while True:
        a, b = read_full(gps)
        assert equal(a, committed) and equal(b, committed)  # never the half-written one
        try:
            return gps.write("policy", (0, 1), TP, states), refused, time.monotonic() - t0
        except StateError as e:
            assert "is in progress (staged" in str(e), e
            refused += 1
            assert time.monotonic() - t0 < timeout_s, f"still refused after {timeout_s} s: {e}"
            time.sleep(0.2)


def test_a_killed_writers_version_is_discarded_once_its_lease_expires(cluster, tmp_path):
    gps, actors, _ = cluster
    committed = random_state(M, 0)
    v0 = gps.latest("policy")
    ttl = 8.0
    holder, ran, killed = start_and_kill(actors, ttl, 1, tmp_path)
    assert [h.writing("policy") for h in gps.hosts] == [v0 + 1, v0 + 1]  # half-written
    new = random_state(M, 2)
    v, refused, waited = write_until_committed(gps, committed, new, timeout_s=ttl + 30)
    print(f"\nlease fallback: writer ran {ran:.2f} s (2 transfers), killed; the next Write "
          f"was refused {refused} times and committed {time.monotonic() - killed:.2f} s "
          f"after the kill (ttl {ttl} s)")
    assert v == v0 + 1 and refused >= 1
    a, b = read_full(gps)
    assert equal(a, new) and equal(b, new)


def test_the_owner_relays_the_writers_death_and_the_next_write_need_not_wait(cluster,
                                                                            tmp_path):
    gps, actors, faults = cluster
    committed = {k: t.clone() for k, t in read_full(gps)[0].items()}
    v0 = gps.latest("policy")
    n = len(faults)
    holder, ran, killed = start_and_kill(actors, 600.0, 3, tmp_path)
    # Monarch supervision reports the dead proc (each of its meshes) to its owner
    while not any("Killed(sig=9)" in str(f) and "writer3" in str(f) for f in faults[n:]):
        assert time.monotonic() - killed < 60, "no supervision event for the killed writer"
        time.sleep(0.05)
    noticed = time.monotonic() - killed
    assert [x[1:] for x in gps.writer_lost(holder)] == [("policy", v0 + 1)] * 2
    new = random_state(M, 4)
    v, refused, waited = write_until_committed(gps, committed, new, timeout_s=5)
    print(f"\nfast path: supervision reported the kill after {noticed:.2f} s; the next Write "
          f"committed {time.monotonic() - killed:.2f} s after the kill (lease 600 s)")
    assert v == v0 + 1 and refused == 0
    a, b = read_full(gps)
    assert equal(a, new) and equal(b, new)
