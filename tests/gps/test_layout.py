"""Tests of the parallelism layout P and the GPS storage layout (sec. 5.1, app. B.1)."""

import pytest

from pivot.errors import ConfigError
from pivot.gps.layout import (ModelMeta, ParallelLayout, ParamMeta, chunk_bounds, param_stage,
                              plan_storage, qwen3_model, qwen3_split_dim)

QWEN = qwen3_model("policy", layers=4, hidden=64, intermediate=160, heads=4, kv_heads=2,
                   head_dim=16, vocab=128)


def test_qwen3_split_dims_follow_the_megatron_convention():
    dims = dict(ParallelLayout.create(QWEN, tp=2).split_dims)
    for proj in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj",
                 "mlp.up_proj"):
        assert dims[f"model.layers.1.{proj}.weight"] == 0
    assert dims["model.layers.1.self_attn.o_proj.weight"] == 1
    assert dims["model.layers.1.mlp.down_proj.weight"] == 1
    assert dims["model.embed_tokens.weight"] == 0 and dims["lm_head.weight"] == 0
    assert dims["model.norm.weight"] is None
    assert dims["model.layers.0.input_layernorm.weight"] is None
    assert qwen3_split_dim("model.layers.0.self_attn.q_proj.bias", (64,)) == 0


def test_pipeline_stages_split_layers_contiguously_with_embeddings_first_and_head_last():
    stage = {p.name: param_stage(p, QWEN.num_layers, 2) for p in QWEN.params}
    assert stage["model.embed_tokens.weight"] == 0
    assert stage["model.layers.1.mlp.up_proj.weight"] == 0
    assert stage["model.layers.2.mlp.up_proj.weight"] == 1
    assert stage["lm_head.weight"] == 1 and stage["model.norm.weight"] == 1


def test_rank_coordinates_put_tp_innermost():
    lay = ParallelLayout(dp=2, tp=2, pp=2)
    assert [lay.coords(r) for r in (0, 1, 2, 5, 7)] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 1), (1, 1, 1)]


def test_storage_replicates_every_model_when_the_budget_allows():
    genrm = qwen3_model("genrm", layers=2, hidden=32, intermediate=64, heads=2, kv_heads=1,
                        head_dim=16, vocab=64)
    st = plan_storage([QWEN, genrm], hosts=4, budget_bytes=QWEN.nbytes + genrm.nbytes)
    assert st.k == 1 and st.groups == 4
    assert st.host_bytes({"policy": QWEN, "genrm": genrm}) == [QWEN.nbytes + genrm.nbytes] * 4


def test_storage_picks_the_smallest_group_that_fits_and_balances_bytes():
    st = plan_storage([QWEN], hosts=8, budget_bytes=QWEN.nbytes // 3, min_split_bytes=0)
    assert st.k == 4 and st.groups == 2
    per_host = st.host_bytes({"policy": QWEN})
    assert max(per_host) <= QWEN.nbytes // 3
    assert sum(per_host) == 2 * QWEN.nbytes  # two full replicas
    assert max(per_host) - min(per_host) <= QWEN.nbytes // 100


def test_uneven_dims_split_like_array_split():
    assert chunk_bounds(10, 4).tolist() == [0, 3, 6, 8, 10]
    m = ModelMeta("policy", (ParamMeta("w", (10, 3)),))
    st = plan_storage([m], hosts=4, budget_bytes=9 * 4, min_split_bytes=0)
    assert st.k == 4
    assert st.param_shards("policy")["w"].rows == ((0, 3), (3, 6), (6, 8), (8, 10))


def test_small_tensors_stay_whole_on_the_least_loaded_slot():
    st = plan_storage([QWEN], hosts=2, budget_bytes=QWEN.nbytes * 2 // 3)
    norm = st.param_shards("policy")["model.norm.weight"]
    assert norm.rows == ((0, 64),) and len(norm.slots) == 1


def test_a_budget_too_small_for_full_sharding_fails_naming_budget_sizes_and_fix():
    with pytest.raises(ConfigError) as e:
        plan_storage([QWEN], hosts=2, budget_bytes=QWEN.nbytes // 4)
    msg = str(e.value)
    assert "budget" in msg and "policy=" in msg and "add hosts" in msg


def test_bad_layout_and_model_fields_fail_at_once():
    with pytest.raises(ConfigError, match="tp"):
        ParallelLayout(dp=1, tp=0)
    with pytest.raises(ConfigError, match="duplicate"):
        ModelMeta("m", (ParamMeta("w", (2,)), ParamMeta("w", (2,))))
    with pytest.raises(ConfigError, match="shape"):
        ModelMeta("m", (ParamMeta("w", (0, 2)),))
