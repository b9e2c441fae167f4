"""One Write is one commit across every GPS host (sec. 5.1): a failure on one host mid-Write
leaves every host on the old version; Reads see one whole version; a rebuild and a Write
exclude each other; a rebuilt host pulls from its peers, not through the caller."""

import threading

import pytest
import torch

from pivot.errors import StateError
from pivot.gps.client import GlobalParameterStorage
from pivot.gps.layout import ParallelLayout
from pivot.gps.plan import Link
from pivot.gps.storage import HostStore
from pivot.gps.transport import MonarchTransport, ShmTransport
from pivot.testing.gps import (SMALL_GENRM, SMALL_MODELS, SMALL_POLICY, LocalHost, close_gps,
                               expected_shard, kill_host, local_gps, random_state,
                               storage_with_k)

DEVICE_HOST = (0, 0, 1, 1, 2, 2, 3, 3)
FULL = ParallelLayout.create(SMALL_POLICY)


class FailingHost(LocalHost):
    """A host handle whose ``op`` fails once: before doing it (the call never arrived) or
    after (the host did it, the reply was lost)."""

    def __init__(self, store, op, when="before"):
        super().__init__(store)
        self.op, self.when, self.armed = op, when, True

    def __getattr__(self, op):
        fn = super().__getattr__(op)
        if op != self.op:
            return fn

        def call(*a, **k):
            if self.armed and self.when == "before":
                self.armed = False
                raise StateError(f"GPS host {self.index}: {op} failed: injected")
            out = fn(*a, **k)
            if self.armed:
                self.armed = False
                raise StateError(f"GPS host {self.index}: {op} reply lost: injected")
            return out
        return call


class GatedHost(LocalHost):
    """A host handle whose ``op`` waits for ``go`` after signalling ``reached``."""

    def __init__(self, store, op):
        super().__init__(store)
        self.op, self.reached, self.go = op, threading.Event(), threading.Event()

    def __getattr__(self, op):
        fn = super().__getattr__(op)
        if op != self.op:
            return fn

        def call(*a, **k):
            self.reached.set()
            assert self.go.wait(30)
            return fn(*a, **k)
        return call


@pytest.fixture
def four():
    """Four hosts in two groups of two (every shard on two hosts), policy at v1."""
    storage = storage_with_k(list(SMALL_MODELS.values()), 4, 2)
    gps, stores = local_gps(SMALL_MODELS, storage, DEVICE_HOST)
    gps.load("policy", random_state(SMALL_POLICY, 0))
    gps.load("genrm", random_state(SMALL_GENRM, 0))
    v, full = write(gps, 1)
    assert v == 1
    extra = []
    yield gps, stores, storage, full, extra
    close_gps(gps, stores)
    for s in extra:
        s.close()


def write(gps, seed, devs=(0, 3, 4, 7), tp=2):
    lay = ParallelLayout.create(SMALL_POLICY, dp=len(devs) // tp, tp=tp)
    full = random_state(SMALL_POLICY, seed)
    return gps.write("policy", devs, lay,
                     {d: expected_shard(full, SMALL_POLICY, lay, r)
                      for r, d in enumerate(devs)}), full


def constant(v):
    return {p.name: torch.full(p.shape, float(v)) for p in SMALL_POLICY.params}


def stored(store):
    """Every shard a host serves as its latest policy, cloned."""
    v = store.latest("policy")
    return v, {k: t.clone() for k, t in store.tensors("policy", v).items()}


def assert_all_hosts_hold(stores, snaps, version):
    for s, (v, shards) in zip(stores, snaps):
        assert s.latest("policy") == version == v and s.versions("policy") == [version]
        assert not s._staged and not s._writing
        got = s.tensors("policy", version)
        assert got.keys() == shards.keys()
        assert all(torch.equal(got[k], t) for k, t in shards.items()), s.host


def assert_reads(gps, full):
    """A full copy on a device of every host equals ``full`` bit for bit."""
    out = gps.read("policy", (0, 2, 4, 6), ParallelLayout.create(SMALL_POLICY, dp=4), verify=True)
    for d in out:
        assert all(torch.equal(out[d][n], t) for n, t in full.items()), d


@pytest.mark.parametrize("op,host,when", [
    ("begin_write", 2, "before"),   # hosts 0, 1 staged
    ("put", 3, "before"),           # the bytes never reach host 3 (Monarch path)
    ("prepare", 3, "before"),       # hosts 0-2 verified, host 3 does not answer
    ("install", 2, "before"),       # hosts 0, 1 installed
    ("install", 1, "after"),        # host 1 installed but the reply was lost
])
def test_a_failure_on_one_host_mid_write_leaves_every_host_on_the_old_version(
        four, op, host, when):
    gps, stores, _, full, _ = four
    gps.transports[Link.REMOTE] = MonarchTransport()
    gps.transports[Link.LOCAL] = MonarchTransport()  # every slice through host.put
    snaps = [stored(s) for s in stores]
    gps.hosts[host] = FailingHost(stores[host], op, when)
    with pytest.raises(StateError, match="injected"):
        write(gps, 2)
    assert_all_hosts_hold(stores, snaps, 1)
    assert_reads(gps, full)
    v, new = write(gps, 2)  # the retry (the handle fails once)
    assert v == 2 and all(s.latest("policy") == 2 for s in stores)
    assert_reads(gps, new)


def test_a_checksum_mismatch_on_the_last_host_discards_the_version_everywhere(four):
    gps, stores, _, full, _ = four

    class Corrupting(ShmTransport):
        def write(self, host, manifest, transfers, src, verify=False):
            out = super().write(host, manifest, transfers, src, verify)
            if host.index == 3:
                p, sh, box, c = out[0]
                out[0] = (p, sh, box, c + 1)  # host 3 finds other bytes than were sent
            return out

    gps.transports = {Link.LOCAL: Corrupting(), Link.REMOTE: MonarchTransport()}
    snaps = [stored(s) for s in stores]
    lay = ParallelLayout.create(SMALL_POLICY, dp=2, tp=2)
    new = random_state(SMALL_POLICY, 2)
    states = {d: expected_shard(new, SMALL_POLICY, lay, r) for r, d in enumerate((0, 3, 4, 7))}
    with pytest.raises(StateError, match="GPS host 3: checksum mismatch writing policy v2"):
        gps.write("policy", (0, 3, 4, 7), lay, states, verify=True)
    assert_all_hosts_hold(stores, snaps, 1)
    assert_reads(gps, full)


def test_a_read_during_install_gets_the_old_version_and_during_publish_one_whole_version(
        four):
    gps, stores, _, full, _ = four
    devs = (0, 2)  # a full copy each: host 0 and host 1 hold the two halves
    # Phase 2 half-way (host 0 installed v2, host 1 not yet): Reads get v1, whole.
    gate = gps.hosts[1] = GatedHost(stores[1], "install")
    w = threading.Thread(target=lambda: gps.write("policy", (0,), FULL, {0: constant(7)}))
    w.start()
    assert gate.reached.wait(30)
    assert stores[0].versions("policy") == [1, 2] and stores[0].latest("policy") == 1
    out = gps.read("policy", devs, ParallelLayout.create(SMALL_POLICY, dp=2))
    for d in devs:
        assert all(torch.equal(out[d][n], t) for n, t in full.items())
    gate.go.set()
    w.join()
    # Phase 3 half-way (hosts 0 published v3, host 1 still v2): one whole version, v3.
    gate = gps.hosts[1] = GatedHost(stores[1], "publish")
    w = threading.Thread(target=lambda: gps.write("policy", (0,), FULL, {0: constant(8)}))
    w.start()
    assert gate.reached.wait(30)
    assert stores[0].latest("policy") == 3 and stores[1].latest("policy") == 2
    out = gps.read("policy", devs, ParallelLayout.create(SMALL_POLICY, dp=2), verify=True)
    vals = {float(v) for sd in out.values() for t in sd.values() for v in (t.min(), t.max())}
    assert vals == {8.0}
    gate.go.set()
    w.join()
    assert all(s.latest("policy") == 3 and s.versions("policy") == [3] for s in stores)


def test_a_host_that_fails_to_publish_is_named_and_reads_still_pin_the_new_version(four):
    gps, stores, _, _, _ = four
    gps.hosts[1] = FailingHost(stores[1], "publish")
    with pytest.raises(StateError, match=r"installed on every GPS host, but publishing it "
                                         r"failed on hosts \[1\]"):
        gps.write("policy", (0,), FULL, {0: constant(5)})
    assert stores[1].latest("policy") == 1 and stores[0].latest("policy") == 2
    out = gps.read("policy", (0, 2), ParallelLayout.create(SMALL_POLICY, dp=2))
    assert {float(t.max()) for sd in out.values() for t in sd.values()} == {5.0}
    assert {float(t.min()) for sd in out.values() for t in sd.values()} == {5.0}


def test_writes_of_one_model_are_one_at_a_time_and_a_dead_writers_leftover_can_be_aborted(
        four):
    gps, stores, storage, full, _ = four
    stores[2].begin_write("policy", 2)  # a writer that died after staging on host 2
    other = GlobalParameterStorage([LocalHost(s) for s in stores], SMALL_MODELS, storage,
                                   DEVICE_HOST, transports=dict(gps.transports))
    with pytest.raises(StateError, match=r"GPS host 2: Write of policy v2 refused: a Write "
                                         r"of policy v2 is in progress \(staged"):
        other.write("policy", (0,), FULL, {0: constant(3)})
    assert all(s.latest("policy") == 1 and not s._writing for s in stores if s.host != 2)
    gps.abort_write("policy", 2)
    assert other.write("policy", (0,), FULL, {0: constant(3)}) == 2
    other.close()


# --- Rebuild and Write exclude each other ------------------------------------------------

class GatedPeers:
    """The rebuilt host's peer transport, paused before its first pull."""

    def __init__(self):
        self.inner = ShmTransport(threads=1)
        self.reached, self.go = threading.Event(), threading.Event()

    def __call__(self, manifest):
        self.reached.set()
        assert self.go.wait(30)
        return self.inner


def test_a_write_during_a_rebuild_is_refused_or_waits_and_neither_is_corrupted(four):
    gps, stores, storage, full, extra = four
    lost = 1
    kill_host(gps, stores, lost)
    other = GlobalParameterStorage([LocalHost(s) for s in stores], SMALL_MODELS, storage,
                                   DEVICE_HOST, transports=dict(gps.transports))
    fresh = HostStore(lost, storage, SMALL_MODELS)
    extra.append(fresh)
    peers = GatedPeers()
    errors = []

    def rebuild():
        try:
            gps.rebuild(lost, LocalHost(fresh, peers))
        except Exception as e:  # noqa: BLE001 - surfaced below
            errors.append(e)
    th = threading.Thread(target=rebuild)
    th.start()
    assert peers.reached.wait(30)
    # Another client's Write is refused by the leased hosts, naming model and version.
    other.hosts[lost] = LocalHost(fresh)
    with pytest.raises(StateError, match=r"GPS host 0: Write of policy v2 refused: the "
                                         r"rebuild of GPS host 1 is in progress .*holds "
                                         r"policy v1"):
        other.write("policy", (0,), FULL, {0: constant(4)})
    # This client's Write waits for the rebuild, then reaches the rebuilt host too.
    fut = gps.write_async("policy", (0,), FULL, {0: constant(4)})
    assert not fut.done()
    assert all(s.writing("policy") is None for s in stores if s.host != lost)
    peers.go.set()
    th.join()
    assert not errors, errors
    assert fut.result(timeout=30) == 2
    assert all(s.latest("policy") == 2 for s in (*stores[:lost], fresh, *stores[lost + 1:]))
    out = gps.read("policy", (0, 2, 4, 6), ParallelLayout.create(SMALL_POLICY, dp=4), verify=True)
    assert all(float(t.min()) == float(t.max()) == 4.0 for sd in out.values()
               for t in sd.values())
    other.close()


def test_a_rebuild_during_another_clients_write_is_refused_and_both_end_consistent(four):
    gps, stores, storage, full, extra = four
    writer = GlobalParameterStorage([LocalHost(s) for s in stores], SMALL_MODELS, storage,
                                    DEVICE_HOST, transports=dict(gps.transports))
    gate = writer.hosts[3] = GatedHost(stores[3], "prepare")  # all staged, not verified
    failed = []

    def w():
        try:
            writer.write("policy", (0,), FULL, {0: constant(9)})
        except Exception as e:  # noqa: BLE001 - surfaced below
            failed.append(e)
    th = threading.Thread(target=w)
    th.start()
    assert gate.reached.wait(30)
    kill_host(gps, stores, 1)  # host 1 dies mid-Write
    fresh = HostStore(1, storage, SMALL_MODELS)
    extra.append(fresh)
    with pytest.raises(StateError, match=r"GPS host 0: the rebuild of GPS host 1 refused: a "
                                         r"Write of policy v2 is in progress \(prepared"):
        gps.rebuild(1, LocalHost(fresh))
    assert fresh.versions("policy") == []
    writer.hosts[1] = gps.hosts[1]  # the writer's handle on host 1 is dead too
    gate.go.set()
    th.join()
    assert failed and "actor is dead" in str(failed[0])
    report = gps.rebuild(1, LocalHost(fresh))  # the Write was rolled back: retry works
    assert report.versions["policy"] == 1
    assert_reads(gps, full)
    assert write(gps, 3)[0] == 2
    writer.close()


def test_a_rebuilt_host_pulls_from_its_peer_and_nothing_passes_through_the_caller(four):
    gps, stores, storage, full, extra = four

    class Counting(ShmTransport):
        calls = 0

        def read(self, *a, **k):
            Counting.calls += 1
            return super().read(*a, **k)

        def write(self, *a, **k):
            Counting.calls += 1
            return super().write(*a, **k)

    gps.transports = {Link.LOCAL: Counting(), Link.REMOTE: Counting()}
    kill_host(gps, stores, 2)
    fresh = HostStore(2, storage, SMALL_MODELS)
    extra.append(fresh)
    report = gps.rebuild(2, LocalHost(fresh))
    assert Counting.calls == 0
    assert report.senders["policy"] == {0: report.senders["policy"][0]}  # its one peer
    assert fresh.latest("policy") == 1 and fresh.latest("genrm") == 0
    for m in SMALL_MODELS:
        want = stores[0].tensors(m, stores[0].latest(m))
        got = fresh.tensors(m, fresh.latest(m))
        assert got.keys() == want.keys() and all(torch.equal(got[k], t)
                                                 for k, t in want.items())


def test_a_pinned_version_outlives_a_write_until_its_block_ends(four):
    """A TP replica's rank 0 Reads a version and names it to the other ranks, which Read
    it later: a Write publishing between the two Reads must not drop it (the race a CI
    run hit as 'policy has no version 1 (stored: [2])')."""
    gps, stores, _, full, _ = four
    lay = ParallelLayout.create(SMALL_POLICY, dp=2)
    with gps.pinned("policy") as v:
        assert v == 1
        write(gps, 2)
        assert all(s.latest("policy") == 2 and s.versions("policy") == [1, 2] for s in stores)
        out = gps.read("policy", (0, 2), lay, version=v, verify=True)
        assert all(torch.equal(out[d][n], t) for d in out for n, t in full.items())
    assert all(s.versions("policy") == [2] for s in stores)
    with pytest.raises(StateError, match=r"policy has no version 1 \(stored: \[2\]\)"):
        gps.read("policy", (0, 2), lay, version=1)
