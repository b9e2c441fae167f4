"""A Write fed by several writers (sec. 5.1): one client begins it, each writer
stages its own devices' shards (``write_part``, another client: another process in a
run), and the first client finishes it with every part's checksums. The result is the
same version a single-writer Write gives; a missing or failed part leaves every host on
the old version."""

import pickle

import pytest
import torch

from pivot.errors import StateError
from pivot.gps.client import GlobalParameterStorage
from pivot.gps.layout import ParallelLayout
from pivot.testing.gps import (SMALL_MODELS, SMALL_POLICY, LocalHost, close_gps,
                               expected_shard, local_gps, random_state, storage_with_k)

TP2 = ParallelLayout.create(SMALL_POLICY, tp=2, split_dim=lambda n, s: 0)
DEVICE_HOST = (0, 0, 1, 1)


@pytest.fixture
def gps_pair():
    """Two clients (two writers' own ids) over the same 2 in-process hosts, the policy
    split over both (k = 2)."""
    storage = storage_with_k(list(SMALL_MODELS.values()), 2, 2)
    a, stores = local_gps(SMALL_MODELS, storage, DEVICE_HOST)
    b = GlobalParameterStorage([LocalHost(s) for s in stores], SMALL_MODELS, storage,
                               DEVICE_HOST, transports=a.transports, holder="writer-b")
    a.load("policy", random_state(SMALL_POLICY, 0))
    yield a, b
    b.close()
    close_gps(a, stores)


def shards(full):
    return {d: expected_shard(full, SMALL_POLICY, TP2, r) for r, d in enumerate((1, 2))}


def test_two_writers_stage_one_version_that_reads_back_exactly(gps_pair):
    a, b = gps_pair
    full = random_state(SMALL_POLICY, 1)
    parts = shards(full)
    ticket = a.begin_write("policy", (1, 2), TP2)
    ticket = pickle.loads(pickle.dumps(ticket))           # crosses a process boundary
    got = [a.write_part(ticket, {1: parts[1]}, only=(1,)),
           b.write_part(ticket, {2: parts[2]}, only=(2,))]
    v = a.finish_write(ticket, got)
    assert v == 1 and a.latest("policy") == 1
    back = a.read("policy", (0,), ParallelLayout.create(SMALL_POLICY))[0]
    assert back.keys() == full.keys() and all(torch.equal(back[k], full[k]) for k in full)


def test_a_missing_part_fails_verification_and_every_host_keeps_the_old_version(gps_pair):
    a, b = gps_pair
    old = a.read("policy", (0,), ParallelLayout.create(SMALL_POLICY))[0]
    parts = shards(random_state(SMALL_POLICY, 2))
    ticket = a.begin_write("policy", (1, 2), TP2)
    got = [a.write_part(ticket, {1: parts[1]}, only=(1,))]   # writer b never staged
    with pytest.raises(StateError, match=r"staged devices \[1\], G is \[1, 2\]"):
        a.finish_write(ticket, got)
    assert a.latest("policy") == 0
    back = a.read("policy", (0,), ParallelLayout.create(SMALL_POLICY))[0]
    assert all(torch.equal(back[k], old[k]) for k in old)
    v = a.write("policy", (1, 2), TP2, parts)                # the next Write goes through
    assert v == 1


def test_a_corrupted_part_fails_the_vote(gps_pair):
    a, b = gps_pair
    parts = shards(random_state(SMALL_POLICY, 4))
    ticket = a.begin_write("policy", (1, 2), TP2, verify=True)
    good = a.write_part(ticket, {1: parts[1]}, only=(1,))
    bad = b.write_part(ticket, {2: parts[2]}, only=(2,))
    h, entries = next((h, e) for h, e in bad.expected.items() if e)
    name, shard, box, want = entries[0]
    bad.expected[h][0] = (name, shard, box, want + 1)         # what the host must find
    with pytest.raises(StateError, match="checksum mismatch"):
        a.finish_write(ticket, [good, bad])
    assert a.latest("policy") == 0


def test_an_aborted_ticket_is_discarded_and_a_part_may_only_stage_devices_of_g(gps_pair):
    a, b = gps_pair
    parts = shards(random_state(SMALL_POLICY, 3))
    ticket = a.begin_write("policy", (1, 2), TP2)
    with pytest.raises(Exception, match="outside G"):
        b.write_part(ticket, {3: parts[1]}, only=(3,))
    b.write_part(ticket, {2: parts[2]}, only=(2,))
    a.abort(ticket, "writer 1 died")
    assert a.latest("policy") == 0 and a.write("policy", (1, 2), TP2, parts) == 1
