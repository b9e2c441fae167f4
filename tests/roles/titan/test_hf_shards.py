"""``pivot.roles.titan.hf_shards``: the fused-QKV row map against torchtitan's own merge
hook, a sharded safetensors checkpoint read by slices, the exactly-once check of a Write,
and the same code on the Qwen3 trainer model (its adapter, q/k norms)."""

import json

import pytest
import torch

from pivot.errors import ConfigError, StateError
from pivot.losses.grpo import token_logprobs
from pivot.safetensors_rows import SafetensorsRows
from pivot.roles.titan.hf_shards import (
    HFShard,
    RowSegment,
    StateDictRows,
    fused_qkv_segments,
    hf_shapes,
    hf_shards,
    load_hf_shards,
    merge_hf_shards,
)


@pytest.mark.parametrize("n_kv,hpk,hd", [(2, 2, 4), (1, 3, 2), (4, 1, 3), (3, 7, 5)])
def test_fused_rows_map_to_q_k_v_rows_for_every_shard(n_kv, hpk, hd):
    """Every row range of a fused wqkv, as FSDP2 shards it over 1-5 ranks, maps to the
    q/k/v rows that torchtitan's merge hook (``FusedQKVLinear._merge_qkv_on_load``) puts
    there."""
    from torchtitan.models.common.attention import FusedQKVLinear

    dim = 3
    q = torch.randn(n_kv * hpk * hd, dim)
    k, v = torch.randn(n_kv * hd, dim), torch.randn(n_kv * hd, dim)
    mod = type("Fused", (), {"head_dim": hd, "heads_per_kv": hpk, "r_dim": hpk + 2})()
    sd = {"wq.weight": q, "wk.weight": k, "wv.weight": v}
    FusedQKVLinear._merge_qkv_on_load(mod, sd, "")
    fused = sd["wqkv.weight"]
    src = {"q": q, "k": k, "v": v}
    n = fused.shape[0]
    for world in range(1, 6):
        per = -(-n // world)
        for r in range(world):
            start, stop = min(r * per, n), min(r * per + per, n)
            segs = fused_qkv_segments(mod, ("q", "k", "v"), start, stop)
            local = torch.full((stop - start, dim), float("nan"))
            for s in segs:
                local[s.dst:s.dst + s.rows] = src[s.hf_name][s.src:s.src + s.rows]
            assert torch.equal(local, fused[start:stop])
            assert sum(s.rows for s in segs) == stop - start
    # runs of one tensor are merged: a whole KV group of queries is one segment
    assert fused_qkv_segments(mod, ("q", "k", "v"), 0, (hpk + 2) * hd) == [
        RowSegment("q", 0, 0, hpk * hd), RowSegment("k", 0, hpk * hd, hd),
        RowSegment("v", 0, (hpk + 1) * hd, hd)]


def test_qwen3_loads_through_its_own_adapter(hf_model, hf_logprobs):
    """The trainer's Qwen3 (q/k norms, no bias) filled by hf_shards equals transformers."""
    from pivot.roles.titan.model import (Qwen3Shape, build_qwen3, qwen3_model_config,
                                         state_dict_adapter)

    hf = hf_model(tie=False, seed=4)
    config = qwen3_model_config(Qwen3Shape.from_hf(hf.config.to_dict()), 64)
    model = build_qwen3(config, seed=9)
    adapter = state_dict_adapter(config)
    n = load_hf_shards(model, adapter, StateDictRows(hf.state_dict()))
    assert n == sum(v.numel() * v.element_size() for v in hf.state_dict().values())
    ids = torch.randint(0, 512, (3, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = token_logprobs(model(ids), ids)
    assert float((got - hf_logprobs(hf, ids)).abs().max()) <= 1e-5
    full = merge_hf_shards(hf_shards(model, adapter), hf_shapes(model, adapter))
    assert all(torch.equal(full[k], v) for k, v in hf.state_dict().items())


def test_a_sharded_checkpoint_is_read_by_slices(tmp_path):
    from safetensors.torch import save_file

    a, b = torch.arange(40.0).view(10, 4), torch.arange(6.0)
    save_file({"a": a}, str(tmp_path / "m-1.safetensors"))
    save_file({"b": b}, str(tmp_path / "m-2.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors"}}))
    r = SafetensorsRows(tmp_path)
    assert r.shape("a") == (10, 4) and r.shape("b") == (6,)
    assert torch.equal(r.rows("a", 3, 5), a[3:5]) and torch.equal(r.rows("b", 4, 6), b[4:])
    assert r.bytes_read == (2 * 4 + 2) * 4


def test_a_folder_without_weights_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="no model.safetensors"):
        SafetensorsRows(tmp_path)


def test_a_write_must_cover_every_row_exactly_once():
    t = torch.arange(8.0).view(4, 2)
    shapes = {"w": (4, 2)}
    assert torch.equal(merge_hf_shards([HFShard("w", 0, t[:3]), HFShard("w", 3, t[3:])],
                                       shapes)["w"], t)
    with pytest.raises(StateError, match="exactly once"):
        merge_hf_shards([HFShard("w", 0, t[:3])], shapes)
    with pytest.raises(StateError, match="exactly once"):
        merge_hf_shards([HFShard("w", 0, t[:3]), HFShard("w", 2, t[2:])], shapes)


def test_chunk_rows_serve_only_their_chunk_and_check_its_shape():
    from pivot.roles.titan.hf_shards import ChunkRows

    full = torch.arange(10 * 3, dtype=torch.float32).reshape(10, 3)
    r = ChunkRows({"w": full[5:]}, {"w": (10, 3)}, rank=1, world=2)
    assert r.shape("w") == (10, 3)
    assert torch.equal(r.rows("w", 6, 9), full[6:9])
    with pytest.raises(StateError, match="outside this rank's chunk"):
        r.rows("w", 4, 6)
    with pytest.raises(StateError, match="holds no"):
        r.rows("b", 0, 1)
    with pytest.raises(StateError, match=r"rank 0 of 3 holds rows \[0, 4\)"):
        ChunkRows({"w": full[5:]}, {"w": (10, 3)}, rank=0, world=3)


def test_chunk_of_joins_a_ranks_pieces_into_its_chunk_or_refuses():
    from pivot.roles.titan.hf_shards import HFShard, chunk_of

    full = torch.arange(8 * 2, dtype=torch.float32).reshape(8, 2)
    pieces = [HFShard("w", 6, full[6:8]), HFShard("w", 4, full[4:6])]   # any order
    got = chunk_of(pieces, {"w": (8, 2)}, rank=1, world=2)
    assert torch.equal(got["w"], full[4:8])
    with pytest.raises(StateError, match=r"not its chunk \[4, 8\)"):
        chunk_of(pieces[:1], {"w": (8, 2)}, rank=1, world=2)     # a gap
    with pytest.raises(StateError, match="not its chunk"):
        chunk_of(pieces, {"w": (8, 2)}, rank=0, world=2)         # another rank's rows
