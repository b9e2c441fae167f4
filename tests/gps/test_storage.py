"""Tests of one host's versioned store (sec. 5.1): atomic installs, GenRM, bad input."""

import os

import pytest
import torch

from pivot.errors import ConfigError, StateError
from pivot.gps.layout import ModelMeta, ParamMeta, plan_storage
from pivot.gps.manifest import checksum
from pivot.gps.storage import HostStore

M = ModelMeta("policy", (ParamMeta("a", (6, 4)), ParamMeta("b", (5,))))
G = ModelMeta("genrm", (ParamMeta("w", (3, 3)),))


@pytest.fixture
def store():
    s = HostStore(0, plan_storage([M, G], 1, 10**6), {"policy": M, "genrm": G})
    yield s
    s.close()


def install(store, model, version, value, initial=False):
    man = store.begin_write(model, version, initial=initial)
    for (name, shard), t in store._staged[(model, version)].tensors.items():
        t.fill_(value)
    store.commit(model, version)
    return man


def test_a_committed_version_replaces_the_old_one_and_drops_it_once_unpinned(store):
    m0 = install(store, "policy", 0, 1.0)
    pinned = store.acquire("policy")
    m1 = install(store, "policy", 1, 2.0)
    assert store.latest("policy") == 1 and store.versions("policy") == [0, 1]
    assert float(store.tensors("policy", 0)[("a", 0)].sum()) == 24.0
    store.release("policy", pinned.version)
    assert store.versions("policy") == [1]
    # The dropped arena is kept as the next Write's staging area, then reused.
    assert os.path.exists(m0.path) and os.path.exists(m1.path)
    m2 = install(store, "policy", 2, 3.0)
    assert m2.path == m0.path and store.versions("policy") == [2]
    assert (store.tensors("policy", 2)[("a", 0)] == 3.0).all()


def test_without_recycling_a_dropped_version_is_unlinked():
    s = HostStore(0, plan_storage([M], 1, 10**6), {"policy": M}, recycle=False)
    try:
        m0 = install(s, "policy", 0, 1.0)
        install(s, "policy", 1, 2.0)
        assert s.versions("policy") == [1] and not os.path.exists(m0.path)
    finally:
        s.close()


def test_the_genrm_may_be_loaded_once_but_never_written(store):
    install(store, "genrm", 0, 1.0, initial=True)
    with pytest.raises(StateError, match="GenRM is frozen"):
        store.begin_write("genrm", 1)
    with pytest.raises(StateError, match="GenRM is frozen"):
        store.begin_write("genrm", 1, initial=True)
    assert store.versions("genrm") == [0]


def test_unknown_models_and_versions_fail_naming_them_and_leave_the_store_untouched(store):
    install(store, "policy", 0, 3.0)
    with pytest.raises(ConfigError, match="unknown model 'reward'"):
        store.acquire("reward")
    with pytest.raises(StateError, match=r"no version 7 \(stored: \[0\]\)"):
        store.acquire("policy", 7)
    with pytest.raises(StateError, match="not newer"):
        store.begin_write("policy", 0)
    assert store.versions("policy") == [0]
    assert (store.tensors("policy", 0)[("a", 0)] == 3.0).all()


def test_a_commit_whose_checksums_do_not_match_installs_nothing(store):
    install(store, "policy", 0, 1.0)
    store.begin_write("policy", 1)
    box = (slice(0, 6), slice(None))
    with pytest.raises(StateError, match="checksum mismatch"):
        store.commit("policy", 1, [("a", 0, box, 12345)])
    assert store.latest("policy") == 0 and store._staged == {}


def test_checksum_sees_strided_views_and_a_single_flipped_bit():
    x = torch.randn(8, 8)
    v = x[:, 2:5]
    c = checksum(v)
    assert c == checksum(v.contiguous())
    x.view(torch.int32)[3, 3] ^= 1
    assert checksum(v) != c


def test_arena_files_of_dead_processes_are_swept_and_live_ones_kept(tmp_path):
    import subprocess
    import sys

    from pivot.gps.storage import sweep_stale_arenas

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (tmp_path / f"pivot-gps-p{dead}-x-h0-policy-v0").write_bytes(b"x")
    (tmp_path / f"pivot-gps-p{os.getpid()}-y-h0-policy-v0").write_bytes(b"y")
    (tmp_path / "other-file").write_bytes(b"z")
    assert sweep_stale_arenas(str(tmp_path)) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "other-file", f"pivot-gps-p{os.getpid()}-y-h0-policy-v0"]


def test_a_store_dropped_without_close_removes_its_files():
    s = HostStore(0, plan_storage([M], 1, 10**6), {"policy": M})
    path = install(s, "policy", 0, 1.0).path
    assert os.path.exists(path)
    s._finalizer()
    assert not os.path.exists(path)
