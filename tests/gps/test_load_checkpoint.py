"""Every GPS host loads its own shards of a HF checkpoint folder, as one commit
(sec. 5.1): in-process hosts, a real tiny Qwen3 folder."""

import pytest
import torch
from safetensors.torch import load_file

from pivot.errors import ConfigError
from pivot.gps.checkpoint import checkpoint_meta, load_checkpoint
from pivot.gps.layout import ParallelLayout, plan_storage
from pivot.gps.recovery import host_shards
from pivot.testing.gps import close_gps, local_gps


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from pivot.roles.engine.tiny import make_tiny_qwen3

    root = tmp_path_factory.mktemp("ckpt")
    return [make_tiny_qwen3(root / f"m{s}", seed=s) for s in (0, 1)]


def test_meta_comes_from_the_headers_and_matches_the_tensors(folders):
    meta = checkpoint_meta("policy", folders[0])
    sd = load_file(str(folders[0] / "model.safetensors"))
    assert {p.name: (p.shape, p.dtype) for p in meta.params} == \
        {k: (tuple(t.shape), "float32") for k, t in sd.items()}


def test_each_host_reads_only_its_shards_and_reads_return_the_checkpoint(folders):
    meta = checkpoint_meta("policy", folders[0])
    storage = plan_storage([meta], 2, meta.nbytes * 6 // 10, min_split_bytes=0)
    assert storage.k == 2
    gps, stores = local_gps({"policy": meta}, storage, (0, 1))
    try:
        for want_v, folder in enumerate(folders):
            v, read, _ = load_checkpoint(gps, "policy", folder)
            assert v == want_v
            for h in (0, 1):  # exactly its own rows, about half the model each
                assert read[h] == sum(s.nbytes for s in host_shards(storage, meta, h))
                assert read[h] < 0.6 * meta.nbytes
            sd = load_file(str(folder / "model.safetensors"))
            out = gps.read("policy", (0, 1), ParallelLayout.create(meta, dp=2), verify=True)
            assert all(torch.equal(out[d][k], t) for d in (0, 1) for k, t in sd.items())
        assert all(s.versions("policy") == [1] for s in stores)
    finally:
        close_gps(gps, stores)


def test_a_folder_of_another_model_is_refused_before_any_host_stages(folders, tmp_path):
    from pivot.roles.engine.tiny import make_tiny_qwen3

    meta = checkpoint_meta("policy", folders[0])
    other = make_tiny_qwen3(tmp_path / "wide", hidden=64, layers=1)
    gps, stores = local_gps({"policy": meta}, plan_storage([meta], 1, meta.nbytes * 4), (0,))
    try:
        with pytest.raises(ConfigError, match="differ from GPS model 'policy'"):
            load_checkpoint(gps, "policy", other)
        with pytest.raises(ConfigError, match="no model.safetensors"):
            load_checkpoint(gps, "policy", tmp_path)
        assert stores[0].writing("policy") is None and stores[0].latest("policy") is None
    finally:
        close_gps(gps, stores)
