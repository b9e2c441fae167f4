"""Fits the decode throughput model of sec. 6.1 (app. A) to the public calibration data and
scales it to the paper's H20 cluster (sec. 8.1): the stand-in path, for a model without an
``Architecture`` (today only the Qwen3.5-122B-A10B GenRM). Models with one use
``pivot.spec.roofline``, which replaced this scaling for them: multiplying the H100 fit's
whole per-sequence slope C by the compute ratio (below) also multiplies the serving host's
per-sequence cost, which does not change with the GPU (roofline.py's docstring).

Samples come from the ML.ENERGY vLLM decode sweeps on H100
(``third_party/calibration/mlenergy_*.json``):
each row gives the mean running batch N_seq and the median inter-token latency. The cached
tokens N_tok of a row are not measured; we take N_tok = N_seq * (prompt + output / 2),
since a sequence's KV cache grows linearly over its decode, with the prompt lengths below
(an assumption: the files give no prompt lengths). The long-output ``gpqa`` rows pin A (the
per-cached-token cost); the short ``lm-arena-chat`` rows pin B and C.

H100 -> H20 (the scaling is a stated assumption, checked end to end by
``benchmarks/calibrate.py`` against verl's step times):
- A (KV-cache reads) and B (weight reads at small batch) are memory bound: x 3.35 / 4.0.
- C (per-sequence FFN cost at large batch) is compute bound: x 989 / 148 (dense bf16 TFLOP/s).
- D (the per-step floor): the fit puts the small-batch weight reads here (B fits to ~0), so
  its memory part, min(D, weight bytes per GPU / 3.35 TB/s), is scaled x 3.35 / 4.0 and by
  the weight ratio; the remainder (launch, sampling, scheduling) x 1.
A stand-in model of a different size is scaled by bytes per device (A by KV bytes per token
per device, B by weight bytes per device, C by active parameters per device).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from pivot.config.validation import check, check_range
from pivot.errors import ConfigError
from pivot.paths import CALIBRATION_DIR
from pivot.scheduler.throughput import (FitReport, LatencySample, ThroughputModel,
                                        fit_throughput_model)

PROMPT_TOKENS = {"gpqa": 300, "lm-arena-chat": 200}
"""Assumed mean prompt tokens per task (not in the files)."""

H100_HBM_TBS, H20_HBM_TBS = 3.35, 4.0          # third_party/calibration/README.md
H100_BF16_TFLOPS, H20_BF16_TFLOPS = 989.0, 148.0  # third_party/calibration/README.md
MEMORY_RATIO = H100_HBM_TBS / H20_HBM_TBS
COMPUTE_RATIO = H100_BF16_TFLOPS / H20_BF16_TFLOPS


@dataclass(frozen=True, slots=True)
class StandIn:
    """A calibrated H100 configuration and how the simulated model differs from it.

    Ratios are simulated / stand-in, per device: ``kv_ratio`` of KV bytes per token,
    ``weight_ratio`` of weight bytes, ``active_ratio`` of active parameters.
    """

    model_ids: tuple[str, ...]
    """Rows of these ids are pooled (e.g. the Instruct and Thinking variants of one model)."""
    num_gpus: int
    weight_bytes_per_gpu: float
    """Weight bytes one GPU of the stand-in reads per step (bf16, TP/EP-sharded)."""
    kv_ratio: float = 1.0
    weight_ratio: float = 1.0
    active_ratio: float = 1.0

    def __post_init__(self) -> None:
        check(isinstance(self.model_ids, tuple) and bool(self.model_ids) and all(
            isinstance(m, str) and m for m in self.model_ids), "StandIn.model_ids",
              self.model_ids, "must be a non-empty tuple of model ids of "
              "third_party/calibration/mlenergy_*.json")
        check_range("StandIn.num_gpus", self.num_gpus, 1, integer=True)
        check_range("StandIn.weight_bytes_per_gpu", self.weight_bytes_per_gpu, 0,
                    open_lo=True, why="bytes")
        for k in ("kv_ratio", "weight_ratio", "active_ratio"):
            check_range(f"StandIn.{k}", getattr(self, k), 0, open_lo=True,
                        why="simulated / stand-in, per device")


def load_samples(model_ids: tuple[str, ...], num_gpus: int, root: Path = CALIBRATION_DIR,
                 gpu: str = "H100") -> list[LatencySample]:
    """Decode-step samples of one model on ``num_gpus`` GPUs from both task files."""
    out = []
    for task, prompt in PROMPT_TOKENS.items():
        path = root / f"mlenergy_{task}.json"
        if not path.is_file():
            raise ConfigError(f"calibration file {path} is missing; it ships with the "
                              f"repository (third_party/calibration/): run from a clone, or "
                              f"pass root= the folder that holds the ML.ENERGY task files")
        for r in json.loads(path.read_text())["configurations"]:
            if r["model_id"] not in model_ids or r["gpu_model"] != gpu or r["num_gpus"] != num_gpus:
                continue
            n = float(r["avg_batch_size"])
            tok = n * (prompt + float(r["avg_output_len"]) / 2)
            out.append(LatencySample(max(1, round(n)), round(tok), r["median_itl_ms"] / 1e3))
    if len(out) < 4:
        raise ConfigError(f"calibration data has {len(out)} rows for {model_ids} on "
                          f"{num_gpus} {gpu}; need >= 4. Pick a model id and GPU count "
                          f"listed in {root}/README.md")
    return out


@functools.lru_cache(maxsize=32)
def fit_h100(model_ids: tuple[str, ...], num_gpus: int) -> tuple[ThroughputModel, FitReport]:
    """The project's fitter on one model's H100 samples."""
    return fit_throughput_model(load_samples(model_ids, num_gpus))


def to_h20(m: ThroughputModel, s: StandIn) -> ThroughputModel:
    """Scales an H100 fit to H20 and to the simulated model (module docstring)."""
    d_mem = min(m.D, s.weight_bytes_per_gpu / (H100_HBM_TBS * 1e12))
    return ThroughputModel(A=m.A * MEMORY_RATIO * s.kv_ratio,
                           B=m.B * MEMORY_RATIO * s.weight_ratio,
                           C=m.C * COMPUTE_RATIO * s.active_ratio,
                           D=d_mem * MEMORY_RATIO * s.weight_ratio + (m.D - d_mem))


def h20_profile(s: StandIn) -> tuple[ThroughputModel, FitReport]:
    """Fit then scale: the decode model the simulator uses for one replica."""
    m, rep = fit_h100(tuple(s.model_ids), s.num_gpus)
    return to_h20(m, s), rep
