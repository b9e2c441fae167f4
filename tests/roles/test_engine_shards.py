"""A TP rank's own shard of a model (pivot/roles/engine/shards.py): which tensors a rank
Reads in part, and the full-shape tensors its vLLM loaders narrow from."""

import pytest
import torch

from pivot.errors import StateError
from pivot.roles.engine.shards import RankShards, ep_expert_owner, vllm_tp_split_dim

Q, K, OPROJ = ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
           "model.layers.0.self_attn.o_proj.weight")
EMB, NORM = "model.embed_tokens.weight", "model.layers.0.input_layernorm.weight"


@pytest.mark.parametrize("name, shape, kv, want", [
    (Q, (256, 128), 2, 0), (K, (64, 128), 2, 0), (OPROJ, (128, 256), 2, 1),
    ("model.layers.0.mlp.down_proj.weight", (128, 512), 2, 1),
    ("model.layers.0.mlp.gate_proj.weight", (512, 128), 2, 0),
    (K, (32, 128), 1, None),              # one KV head on 2 ranks: vLLM replicates it
    ("model.layers.0.self_attn.v_proj.bias", (32,), 1, None),
    ("model.layers.0.self_attn.q_proj.bias", (256,), 1, 0),
    (EMB, (448, 128), 2, None), ("lm_head.weight", (448, 128), 2, None),   # padded ranges
    (NORM, (128,), 2, None)])
def test_a_rank_reads_in_part_only_what_vllm_cuts_evenly(name, shape, kv, want):
    assert vllm_tp_split_dim(name, shape, tp=2, kv_heads=kv) == want


@pytest.mark.parametrize("name, shape, ep, want", [
    # TP alone slices each expert as a dense MLP (intermediate rows / columns) ...
    ("model.layers.0.mlp.experts.3.gate_proj.weight", (64, 128), False, 0),
    ("model.layers.0.mlp.experts.3.down_proj.weight", (128, 64), False, 1),
    # ... EP gives each rank whole experts: every rank Reads them whole, its loader keeps
    # its own; the rest of the layer is cut as before
    ("model.layers.0.mlp.experts.3.gate_proj.weight", (64, 128), True, None),
    ("model.layers.0.mlp.experts.0.down_proj.weight", (128, 64), True, None),
    ("model.layers.0.mlp.gate.weight", (4, 128), True, None),
    (Q, (256, 128), True, 0), (OPROJ, (128, 256), True, 1)])
def test_expert_parallel_ranks_read_experts_whole(name, shape, ep, want):
    assert vllm_tp_split_dim(name, shape, tp=2, kv_heads=2, expert_parallel=ep) == want


@pytest.mark.parametrize("experts, ep", [(4, 2), (8, 4), (6, 3), (4, 1)])
def test_expert_owners_follow_vllms_linear_placement(experts, ep):
    from vllm.model_executor.model_loader.ep_weight_filter import compute_local_expert_ids

    for rank in range(ep):
        want = compute_local_expert_ids(experts, ep, rank) or set(range(experts))
        got = {e for e in range(experts) if ep_expert_owner(
            f"model.layers.1.mlp.experts.{e}.up_proj.weight", experts=experts, ep=ep) == rank}
        assert got == want
    assert ep_expert_owner("model.layers.1.mlp.gate.weight", experts=experts, ep=ep) is None
    assert ep_expert_owner(Q, experts=experts, ep=ep) is None


def test_each_rank_gets_full_shapes_holding_its_own_range():
    full = {Q: torch.arange(8 * 3.).view(8, 3), OPROJ: torch.arange(3 * 8.).view(3, 8),
            NORM: torch.ones(3)}
    dims = {Q: 0, OPROJ: 1, NORM: None}
    for rank in (0, 1):
        shards = {Q: full[Q][4 * rank:4 * rank + 4], OPROJ: full[OPROJ][:, 4 * rank:4 * rank + 4],
                  NORM: full[NORM]}
        st = RankShards(shards, {k: tuple(v.shape) for k, v in full.items()}, dims, rank, 2, 5)
        assert st.version == 5 and sorted(st) == sorted(full) and len(st) == 3
        assert st.nbytes == (12 + 12 + 3) * 4
        q, o = st[Q], st[OPROJ]
        assert q.shape == (8, 3) and o.shape == (3, 8)
        assert torch.equal(q[4 * rank:4 * rank + 4], full[Q][4 * rank:4 * rank + 4])
        assert torch.equal(o[:, 4 * rank:4 * rank + 4], full[OPROJ][:, 4 * rank:4 * rank + 4])
        assert st[NORM] is shards[NORM]


def test_a_read_of_the_wrong_shape_is_refused_naming_the_tensor():
    with pytest.raises(StateError, match=r"q_proj.weight has shape \(8, 3\), expected \(4, 3\)"):
        RankShards({Q: torch.zeros(8, 3)}, {Q: (8, 3)}, {Q: 0}, 0, 2, 1)
