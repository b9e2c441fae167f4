"""Decode and prefill time of an inference replica from the model's architecture and the
GPU's roofline (sec. 6.1, app. A: tau = A * N_tok + max(B, C * N_seq) + D; sec. 8.1: H20).

Each constant of the paper's throughput model is a physical cost of one decode step on a
replica of ``t`` devices (TP, or TP x EP for an MoE):

- A = KV bytes per token / (t * HBM bandwidth * ETA_KV): attention reads every cached
  token's K and V once per step (memory bound for grouped-query attention).
- B = weight bytes read per step / (t * HBM bandwidth * ETA_WEIGHTS): at small batch the
  linear layers are bound by reading the weights (an MoE reads every expert once the batch
  touches them all; below ~E/k sequences it reads fewer, which this form overestimates).
- C = 2 * per-token compute parameters / (t * bf16 peak * ETA_GEMM) + c_seq: at large batch
  the linear layers are compute bound (active parameters only, for an MoE); c_seq is the
  serving stack's per-sequence cost of a step (scheduling, input preparation, sampling,
  output processing), which does not shrink with devices or faster GPUs.
- D = d_step + layers * d_layer (+ 2 * layers * alpha with t > 1): per-step and per-layer
  kernel latencies that do not depend on the batch, plus two latency-bound all-reduces
  (TP) or dispatch/combine exchanges (EP) per layer.

Where the numbers come from (third_party/calibration/README.md):
- ETA_KV, ETA_WEIGHTS, ETA_GEMM, ETA_PREFILL: kernel measurements on H20 published by
  InferSim (alibaba/InferSim, quoted, not copied).
- d_step, d_layer, alpha, c_seq: a non-negative least-squares fit (``serving_overhead``)
  of the residual median inter-token latency (measured minus the three roofline terms
  above) over every bf16 dense-model row on H100 of the ML.ENERGY vLLM sweeps
  (third_party/calibration/mlenergy_*.json). No MoE row, no B200 row and no H20 number
  enters that fit; ``holdout`` checks the model against them.
"""

from __future__ import annotations

import functools
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import gin
import numpy as np

from pivot.config.validation import check_range
from pivot.errors import ConfigError
from pivot.paths import CALIBRATION_DIR
from pivot.scheduler.throughput import ThroughputModel


# ------------------------------------------------------------------------ hardware
@dataclass(frozen=True, slots=True)
class Hardware:
    """Peak dense bf16 FLOP/s and HBM bytes/s of one GPU (vendor datasheets)."""

    name: str
    bf16_flops: float
    hbm_bytes_s: float


H20 = Hardware("H20", 148e12, 4.0e12)
"""Sec. 8.1 (96 GB); 148 dense bf16 TFLOP/s, 4.0 TB/s HBM3 (third_party/calibration/README.md)."""
H100 = Hardware("H100", 989e12, 3.35e12)
"""H100 SXM: 989 dense bf16 TFLOP/s, 3.35 TB/s (third_party/calibration/README.md)."""
B200 = Hardware("B200", 2250e12, 8.0e12)
"""HGX B200: 2.25 dense bf16 PFLOP/s, 8 TB/s HBM3e (NVIDIA datasheet; used only to check
that the fitted overheads carry over to another GPU, ``holdout``)."""
HARDWARE = {h.name: h for h in (H20, H100, B200)}

ETA_KV = 0.80
"""Attention decode reaches 80% of HBM bandwidth: InferSim's FlashInfer decode benchmark
on H20 (32 query / 4 KV heads x 128, batch 256 x 4096 cached tokens) takes 668.6 us per
layer for 2.15 GB of K and V, 3.21 TB/s of 4.0."""
ETA_WEIGHTS = 0.90
"""Weight-read-bound GEMMs reach 90% of HBM bandwidth: InferSim's DeepGEMM bf16 benchmark on
H20 at m <= 64 (e.g. k=4096, n=24576: 201 MB in 53.4-54.5 us, 3.7 TB/s; k=25600, n=5120:
3.5 TB/s)."""
ETA_GEMM = 0.80
"""Compute-bound GEMMs reach 80% of bf16 peak: InferSim's DeepGEMM benchmark on H20 at
m = 256 gives MFU 0.78-0.87 for the k, n >= 2048 shapes of 7B-72B layers (0.58-0.71 for
the smallest ones, 0.86-0.92 at m >= 1024)."""
ETA_PREFILL = 0.89
"""Prefill reaches 89% of peak on H20: InferSim's measured SGLang prefill of Qwen3-8B-FP8 on
one H20, 15,061 tokens/s at 4096-token prompts (2 x 7.57 G compute parameters per token at
296 fp8 TFLOP/s plus 1.21 GFLOP of attention per token at 148 bf16 TFLOP/s). The same
paper's Qwen3-30B-A3B bf16 prefill (16,594 tokens/s/GPU) is held out (``holdout``)."""
PREFILL_CONTEXT = 4096
"""Prompt length at which ``prefill_rate`` counts attention FLOPs (InferSim's measurement)."""


# ------------------------------------------------------------------------ architecture
@gin.configurable
@dataclass(frozen=True)
class Architecture:
    """The shape fields of a Hugging Face ``config.json`` that decode and prefill cost
    depend on (scoped in gin: ``policy/Architecture``, ``genrm/Architecture``).

    Attributes:
        layers / hidden / heads / kv_heads / head_dim: transformer shape.
        intermediate: dense MLP width (0 for an all-MoE model).
        vocab: vocabulary size; tied_embeddings: the LM head shares the embedding matrix.
        experts / experts_per_token / moe_intermediate: routed experts, top-k and their
            width (0 for a dense model).
    """

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0
    tied_embeddings: bool = False

    def __post_init__(self) -> None:
        for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "vocab"):
            check_range(f"Architecture.{k}", getattr(self, k), 1, integer=True)
        for k in ("intermediate", "experts", "experts_per_token", "moe_intermediate"):
            check_range(f"Architecture.{k}", getattr(self, k), 0, integer=True)
        if self.experts and not (0 < self.experts_per_token <= self.experts
                                 and self.moe_intermediate):
            raise ConfigError(f"Architecture: an MoE with experts={self.experts} needs "
                              f"0 < experts_per_token <= experts and moe_intermediate > 0")
        if not self.experts and not self.intermediate:
            raise ConfigError("Architecture: a dense model needs intermediate > 0")

    @property
    def attention_params(self) -> int:
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        return self.layers * (2 * self.hidden * q + 2 * self.hidden * kv)

    @property
    def expert_params(self) -> int:
        """Routed-expert weights (all experts, all layers)."""
        return self.layers * self.experts * 3 * self.hidden * self.moe_intermediate

    @property
    def total_params(self) -> int:
        emb = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return (self.attention_params + self.layers * 3 * self.hidden * self.intermediate
                + self.expert_params + self.layers * self.hidden * self.experts + emb)

    @property
    def compute_params(self) -> int:
        """Parameters one token multiplies by (2 FLOPs each): attention, dense MLP, its
        top-k experts, the router and the LM head (the input embedding is a lookup)."""
        active_experts = self.layers * self.experts_per_token * 3 * self.hidden * \
            self.moe_intermediate
        return (self.attention_params + self.layers * 3 * self.hidden * self.intermediate
                + active_experts + self.layers * self.hidden * self.experts
                + self.vocab * self.hidden)

    @property
    def read_params(self) -> int:
        """Parameters a decode step reads from HBM: all but the input embedding (rows
        gathered), every expert (touched once the batch exceeds ~experts/top-k)."""
        return self.total_params - (0 if self.tied_embeddings else self.vocab * self.hidden)

    @property
    def kv_bytes_per_token(self) -> int:
        """bf16 K and V of one token over all layers."""
        return self.layers * self.kv_heads * self.head_dim * 2 * 2

    def attention_flops_per_token(self, context: float) -> float:
        """QK^T and PV FLOPs of one query token over ``context`` cached tokens."""
        return 4.0 * self.layers * self.heads * self.head_dim * context


# ------------------------------------------------------------------------ overheads
@dataclass(frozen=True, slots=True)
class ServingOverhead:
    """The serving stack's latency terms (seconds) and how well they fit.

    Attributes:
        d_step / d_layer: per-step and per-layer latency independent of the batch.
        alpha: one latency-bound collective (two per layer on more than one device).
        c_seq: per running sequence per step.
        rows / mean_rel_error / max_rel_error: the fit's sample count and residuals.
    """

    d_step: float
    d_layer: float
    alpha: float
    c_seq: float
    rows: int = 0
    mean_rel_error: float = 0.0
    max_rel_error: float = 0.0


# Architectures of the ML.ENERGY models (Hugging Face config.json of each model id).
QWEN3_30B_A3B = Architecture(48, 2048, 32, 4, 128, 0, 151936, 128, 8, 768)
MLENERGY_ARCHS: dict[str, Architecture] = {
    "Qwen/Qwen3-8B": Architecture(36, 4096, 32, 8, 128, 12288, 151936),
    "Qwen/Qwen3-14B": Architecture(40, 5120, 40, 8, 128, 17408, 151936),
    "Qwen/Qwen3-32B": Architecture(64, 5120, 64, 8, 128, 25600, 151936),
    "meta-llama/Llama-3.1-8B-Instruct": Architecture(32, 4096, 32, 8, 128, 14336, 128256),
    "meta-llama/Llama-3.1-70B-Instruct": Architecture(80, 8192, 64, 8, 128, 28672, 128256),
    "meta-llama/Llama-3.3-70B-Instruct": Architecture(80, 8192, 64, 8, 128, 28672, 128256),
    "Qwen/Qwen3-30B-A3B-Instruct-2507": QWEN3_30B_A3B,
    "Qwen/Qwen3-30B-A3B-Thinking-2507": QWEN3_30B_A3B,
}
DENSE_FIT_MODELS = tuple(m for m, a in MLENERGY_ARCHS.items() if not a.experts)
"""The overhead fit's models: every dense model of the sweeps with a bf16 H100 row."""
MOE_HOLDOUT_MODELS = tuple(m for m, a in MLENERGY_ARCHS.items() if a.experts)

MLENERGY_PROMPT_TOKENS = {"gpqa": 300, "lm-arena-chat": 200}
"""Assumed mean prompt tokens per task (the files give none; as pivot.spec.stand_in)."""


@dataclass(frozen=True, slots=True)
class DecodeRow:
    """One measured decode operating point: mean running batch, mean cached tokens, median
    inter-token latency (seconds)."""

    source: str
    model: str
    gpu: str
    devices: int
    num_seqs: float
    num_tokens: float
    itl_s: float


def mlenergy_rows(models: tuple[str, ...], gpus: tuple[str, ...] = ("H100",),
                  root: Path = CALIBRATION_DIR) -> list[DecodeRow]:
    """bf16 rows of ``models`` on ``gpus`` from both ML.ENERGY task files; cached tokens
    are N * (prompt + output / 2), the mean over a sequence's decode."""
    out = []
    for task, prompt in MLENERGY_PROMPT_TOKENS.items():
        path = root / f"mlenergy_{task}.json"
        if not path.is_file():
            raise ConfigError(f"calibration file {path} is missing; it ships with the "
                              f"repository (third_party/calibration/)")
        for r in json.loads(path.read_text())["configurations"]:
            if (r["model_id"] in models and r["gpu_model"] in gpus
                    and r["weight_precision"] == "bfloat16"):
                n = float(r["avg_batch_size"])
                out.append(DecodeRow(f"mlenergy/{task}", r["model_id"], r["gpu_model"],
                                     int(r["num_gpus"]), n,
                                     n * (prompt + float(r["avg_output_len"]) / 2),
                                     r["median_itl_ms"] / 1e3))
    return out


def _roofline_terms(arch: Architecture, hw: Hardware, devices: int, num_seqs: float,
                    num_tokens: float, weight_bytes: float = 2.0,
                    gemm_flops: float | None = None,
                    attention_dp: bool = False) -> float:
    """Seconds of the three hardware terms of one decode step (module docstring).

    ``weight_bytes`` / ``gemm_flops``: bytes per parameter and GEMM peak (fp8 rows);
    ``attention_dp``: data-parallel attention (SGLang's layout: each device holds the
    non-expert weights and its own sequences' full KV; only experts are sharded)."""
    kv_per_dev = arch.kv_bytes_per_token / min(devices, arch.kv_heads)
    if attention_dp:
        kv_per_dev = arch.kv_bytes_per_token / devices
    att = num_tokens * kv_per_dev / (hw.hbm_bytes_s * ETA_KV)
    read = arch.read_params * weight_bytes / devices
    if attention_dp:
        read = (arch.read_params - arch.expert_params) * weight_bytes + \
            arch.expert_params * weight_bytes / devices
    w = read / (hw.hbm_bytes_s * ETA_WEIGHTS)
    flops = gemm_flops or hw.bf16_flops
    comp = num_seqs * 2.0 * arch.compute_params / (devices * flops * ETA_GEMM)
    return att + max(w, comp)


def _overhead_features(arch: Architecture, devices: int, num_seqs: float) -> list[float]:
    return [1.0, float(arch.layers), 2.0 * arch.layers * (devices > 1), num_seqs]


def _nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares by exhaustive active sets (a handful of columns)."""
    n = x.shape[1]
    best, coef = np.inf, np.zeros(n)
    for k in range(1, n + 1):
        for cols in itertools.combinations(range(n), k):
            c, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            if (c < 0).any():
                continue
            r = float(np.sum((x[:, cols] @ c - y) ** 2))
            if r < best:
                best, coef = r, np.zeros(n)
                coef[list(cols)] = c
    return coef


@functools.lru_cache(maxsize=4)
def serving_overhead(models: tuple[str, ...] = DENSE_FIT_MODELS,
                     gpu: str = "H100") -> ServingOverhead:
    """d_step, d_layer, alpha, c_seq by non-negative least squares on relative error:
    measured ITL minus the roofline terms, over the bf16 rows of ``models`` on ``gpu``."""
    rows = mlenergy_rows(models, (gpu,))
    if len(rows) < 8:
        raise ConfigError(f"serving_overhead: {len(rows)} rows for {models} on {gpu}")
    hw = HARDWARE[gpu]
    x = np.array([_overhead_features(MLENERGY_ARCHS[r.model], r.devices, r.num_seqs)
                  for r in rows])
    hwt = np.array([_roofline_terms(MLENERGY_ARCHS[r.model], hw, r.devices, r.num_seqs,
                                    r.num_tokens) for r in rows])
    itl = np.array([r.itl_s for r in rows])
    coef = _nnls(x / itl[:, None], (itl - hwt) / itl)
    rel = (hwt + x @ coef - itl) / itl
    return ServingOverhead(*map(float, coef), rows=len(rows),
                           mean_rel_error=float(np.abs(rel).mean()),
                           max_rel_error=float(np.abs(rel).max()))


def step_latency(arch: Architecture, hw: Hardware, devices: int, num_seqs: float,
                 num_tokens: float, overhead: ServingOverhead | None = None,
                 schedulers: int = 1, **kw) -> float:
    """Seconds of one decode step (roofline terms plus the serving overheads);
    ``schedulers``: engine schedulers sharing the replica's sequences (SGLang's data-
    parallel attention runs one per device)."""
    o = overhead or serving_overhead()
    f = _overhead_features(arch, devices, num_seqs / schedulers)
    return _roofline_terms(arch, hw, devices, num_seqs, num_tokens, **kw) + float(
        np.dot([o.d_step, o.d_layer, o.alpha, o.c_seq], f))


def decode_model(arch: Architecture, devices: int, hw: Hardware = H20,
                 overhead: ServingOverhead | None = None) -> ThroughputModel:
    """The paper's A, B, C, D for one replica of ``devices`` GPUs (module docstring)."""
    o = overhead or serving_overhead()
    kv_per_dev = arch.kv_bytes_per_token / min(devices, arch.kv_heads)
    return ThroughputModel(
        A=kv_per_dev / (hw.hbm_bytes_s * ETA_KV),
        B=arch.read_params * 2.0 / (devices * hw.hbm_bytes_s * ETA_WEIGHTS),
        C=2.0 * arch.compute_params / (devices * hw.bf16_flops * ETA_GEMM) + o.c_seq,
        D=o.d_step + arch.layers * o.d_layer + (2 * arch.layers * o.alpha
                                                 if devices > 1 else 0.0))


def prefill_rate(arch: Architecture, devices: int, mfu: float = ETA_PREFILL,
                 hw: Hardware = H20, context: float = PREFILL_CONTEXT,
                 gemm_flops: float | None = None) -> float:
    """Prefill tokens per second of one replica: linear layers at ``gemm_flops`` (bf16
    peak by default) plus causal attention over ``context / 2`` tokens on average."""
    lin = 2.0 * arch.compute_params / (gemm_flops or hw.bf16_flops)
    att = arch.attention_flops_per_token(context / 2) / hw.bf16_flops
    return devices * mfu / (lin + att)


# ------------------------------------------------------------------------ held out
@dataclass(frozen=True, slots=True)
class HeldOutPoint:
    """A published measurement on H20 that no fit used (InferSim README, alibaba/InferSim:
    SGLang, 4096-token prompts, 2048-token outputs)."""

    label: str
    kind: str
    """'decode' (seconds per output token) or 'prefill' (tokens/s per GPU)."""
    measured: float
    predicted: float

    @property
    def rel_err(self) -> float:
        return (self.predicted - self.measured) / self.measured


def infersim_points(overhead: ServingOverhead | None = None) -> list[HeldOutPoint]:
    """The two H20 measurements of InferSim's README beside this model's prediction.

    - Qwen3-30B-A3B bf16, 4 H20, decode batch 100 per GPU (data-parallel attention, EP4):
      2,749 tokens/s per GPU, so 100 / 2749 s a step; context 4096 + 1024 on average.
      Predicted with one scheduler per GPU (SGLang's layout); prefill 16,594 tokens/s/GPU.
    - Qwen3-8B fp8, 1 H20, decode batch 64: 2,682 tokens/s (64 / 2682 s a step), fp8
      weights (1 byte) at 296 fp8 TFLOP/s. Its prefill set ETA_PREFILL, so only decode
      is held out.
    """
    o = overhead or serving_overhead()
    q8 = MLENERGY_ARCHS["Qwen/Qwen3-8B"]
    ctx = 4096 + 2048 / 2
    moe = step_latency(QWEN3_30B_A3B, H20, 4, 400, 400 * ctx, o, schedulers=4,
                       attention_dp=True)
    dense = step_latency(q8, H20, 1, 64, 64 * ctx, o, weight_bytes=1.0, gemm_flops=296e12)
    return [HeldOutPoint("Qwen3-30B-A3B bf16, 4 H20, decode batch 100/GPU", "decode",
                         100 / 2749, moe),
            HeldOutPoint("Qwen3-30B-A3B bf16, 4 H20, prefill", "prefill", 16594.0,
                         prefill_rate(QWEN3_30B_A3B, 1)),
            HeldOutPoint("Qwen3-8B fp8, 1 H20, decode batch 64", "decode", 64 / 2682, dense)]


def _without_b200_gpqa(rows: list[DecodeRow]) -> list[DecodeRow]:
    """Drops the B200 gpqa sweep: its latencies do not fall with batch size (Qwen3-8B at
    N = 8: 32.5 ms against 5.0 ms on lm-arena-chat on the same GPU, 9.7 ms on H100), a
    different setup from every other sweep (checked in tests/sim/test_roofline.py)."""
    return [r for r in rows if not (r.gpu == "B200" and r.source.endswith("gpqa"))]


def holdout(overhead: ServingOverhead | None = None) -> dict:
    """Relative errors of the model on every measurement the overhead fit did not see:
    ML.ENERGY's Qwen3-30B-A3B rows (MoE) on H100 and B200, its dense B200 rows (another
    GPU; lm-arena-chat only, ``_without_b200_gpqa``), and InferSim's H20 points. MoE rows
    are also summarised for N >= 64, where every expert is read each step as the model
    assumes (below, B overestimates the weights read: +40-100% at N = 8)."""
    o = overhead or serving_overhead()

    def errs(rows):
        return [(r, (step_latency(MLENERGY_ARCHS[r.model], HARDWARE[r.gpu], r.devices,
                                  r.num_seqs, r.num_tokens, o) - r.itl_s) / r.itl_s)
                for r in rows]

    def summary(pairs):
        e = np.abs([x for _, x in pairs])
        return {"rows": len(pairs), "mean_abs_rel_err": float(e.mean()) if len(e) else 0.0,
                "max_abs_rel_err": float(e.max()) if len(e) else 0.0}

    moe = errs(_without_b200_gpqa(mlenergy_rows(MOE_HOLDOUT_MODELS, ("H100", "B200"))))
    dense_b200 = errs(_without_b200_gpqa(mlenergy_rows(DENSE_FIT_MODELS, ("B200",))))
    return {
        "overhead": {"d_step_s": o.d_step, "d_layer_s": o.d_layer, "alpha_s": o.alpha,
                     "c_seq_s": o.c_seq, "fit_rows": o.rows,
                     "fit_mean_rel_err": o.mean_rel_error, "fit_max_rel_err": o.max_rel_error},
        "moe_mlenergy_all": summary(moe),
        "moe_mlenergy_n64": summary([p for p in moe if p[0].num_seqs >= 64]),
        "moe_mlenergy_rows": [{"model": r.model, "gpu": r.gpu, "devices": r.devices,
                               "num_seqs": r.num_seqs, "itl_ms": r.itl_s * 1e3,
                               "rel_err": e} for r, e in moe],
        "dense_b200_lm_arena": summary(dense_b200),
        "infersim_h20": [{"label": p.label, "kind": p.kind, "measured": p.measured,
                          "predicted": p.predicted, "rel_err": p.rel_err}
                         for p in infersim_points(o)],
    }
