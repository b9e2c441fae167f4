"""The architecture-based decode / prefill model (pivot.spec.roofline): parameter counts
from config shapes, the A/B/C/D it gives, the serving-overhead fit on ML.ENERGY's dense H100
rows, and its errors on measurements no fit saw (MoE, B200, H20)."""

import pytest

from pivot.errors import ConfigError
from pivot.spec import roofline as R

QWEN25_7B = R.Architecture(28, 3584, 28, 4, 128, 18944, 152064)


@pytest.mark.parametrize("arch,total_b,active_b", [
    (QWEN25_7B, 7.62, 7.62),                                             # Qwen2.5-7B card
    (R.Architecture(28, 1536, 12, 2, 128, 8960, 151936, tied_embeddings=True), 1.54, 1.54),
    (R.Architecture(64, 5120, 40, 8, 128, 27648, 152064), 32.8, 32.8),
    (R.Architecture(80, 8192, 64, 8, 128, 29568, 152064), 72.7, 72.7),
    (R.QWEN3_30B_A3B, 30.5, 3.3),                            # 30.5 B total, 3.3 B active
    (R.MLENERGY_ARCHS["Qwen/Qwen3-8B"], 8.2, 8.2),
])
def test_parameter_counts_match_the_model_cards(arch, total_b, active_b):
    assert arch.total_params / 1e9 == pytest.approx(total_b, rel=0.02)
    active = arch.compute_params + (0 if arch.tied_embeddings else arch.vocab * arch.hidden)
    assert active / 1e9 == pytest.approx(active_b, rel=0.03)


def test_kv_bytes_per_token_is_layers_kv_heads_head_dim_k_and_v_bf16():
    assert QWEN25_7B.kv_bytes_per_token == 28 * 4 * 128 * 2 * 2 == 57344
    assert R.QWEN3_30B_A3B.kv_bytes_per_token == 98304


def test_bad_architectures_are_refused():
    with pytest.raises(ConfigError):
        R.Architecture(48, 2048, 32, 4, 128, 0, 151936, experts=128)   # no top-k
    with pytest.raises(ConfigError):
        R.Architecture(28, 3584, 28, 4, 128, 0, 152064)                 # dense, no MLP


def test_decode_model_constants_are_the_roofline_terms():
    o = R.ServingOverhead(d_step=1e-4, d_layer=5e-5, alpha=8e-6, c_seq=6e-5)
    m = R.decode_model(QWEN25_7B, 4, overhead=o)
    h = R.H20
    assert m.A == pytest.approx(57344 / 4 / (h.hbm_bytes_s * R.ETA_KV))
    assert m.B == pytest.approx(QWEN25_7B.read_params * 2 / (4 * h.hbm_bytes_s * R.ETA_WEIGHTS))
    assert m.C == pytest.approx(2 * QWEN25_7B.compute_params / (4 * h.bf16_flops * R.ETA_GEMM)
                                + 6e-5)
    assert m.D == pytest.approx(1e-4 + 28 * 5e-5 + 2 * 28 * 8e-6)
    # one device: no collectives; KV heads are not split beyond the KV head count
    assert R.decode_model(QWEN25_7B, 1, overhead=o).D == pytest.approx(1e-4 + 28 * 5e-5)
    assert R.decode_model(QWEN25_7B, 8, overhead=o).A == pytest.approx(m.A)


def test_serving_overhead_fit_on_dense_h100_rows():
    o = R.serving_overhead()
    assert o.rows >= 60                        # every bf16 dense H100 row of both tasks
    assert o.mean_rel_error < 0.08 and o.max_rel_error < 0.25
    assert 0 <= o.d_layer < 2e-4 and 0 <= o.alpha < 5e-5 and 1e-5 < o.c_seq < 2e-4


def test_the_b200_gpqa_sweep_is_anomalous_so_it_is_left_out():
    rows = R.mlenergy_rows(("Qwen/Qwen3-8B",), ("B200",))
    gpqa = min(r.itl_s for r in rows if r.source.endswith("gpqa") and r.num_seqs <= 8)
    chat = min(r.itl_s for r in rows if r.source.endswith("chat") and r.num_seqs <= 8)
    assert gpqa > 5 * chat                     # 32.5 ms against 5.0 ms at N = 8


def test_held_out_moe_and_h20_measurements():
    h = R.holdout()
    # MoE (Qwen3-30B-A3B, H100 1 GPU / EP2, B200): every expert read, N >= 64
    assert h["moe_mlenergy_n64"]["rows"] >= 15
    assert h["moe_mlenergy_n64"]["mean_abs_rel_err"] < 0.15
    # another GPU: the H100-fitted overheads on B200's dense rows
    assert h["dense_b200_lm_arena"]["mean_abs_rel_err"] < 0.2
    # H20 itself: InferSim's MoE decode and prefill, dense fp8 decode
    for p in h["infersim_h20"]:
        assert abs(p["rel_err"]) < 0.2, p


def test_prefill_rate_counts_linear_and_attention_flops():
    r = R.prefill_rate(QWEN25_7B, 4, mfu=0.5, context=0)
    assert r == pytest.approx(4 * 0.5 * R.H20.bf16_flops / (2 * QWEN25_7B.compute_params))
    assert R.prefill_rate(QWEN25_7B, 4, mfu=0.5) < r
