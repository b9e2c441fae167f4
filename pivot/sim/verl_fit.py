"""End-to-end calibration of the simulator against published step times (calibration/).

The generation model has no parameter fitted to verl: decode and prefill come from the H20
roofline and serving overheads fitted on ML.ENERGY's dense H100 rows (``pivot.spec.roofline``),
the replica shape and engine limits from verl's launch scripts (TP 4, 80% of HBM, 1024
sequences). What is fitted to verl, each to a stated subset of its README table:
1. ``response_median``, one per mode (verl's rows are separate runs whose response lengths
   differ; the README gives none): colocated to the three colocated generation phases,
   fully async to the three fully async steps (least squares in log, one parameter each).
2. ``fit_floor`` / ``fit_amdahl``: the training model's MFU and floor (update) or serial
   fraction (old log-prob) per trainer
   (colocated: update and old log-prob on its three rows; fully async: update on its three
   rows), for each mode's simulated batch. verl's two trainers differ (colocated offloads
   parameters and optimizer, FSDP groups of 32 across hosts; fully async keeps them, FSDP
   groups of 8 within a host): at equal devices the fully async update is 1.2-1.7x faster.
3. ``fit_shift_cost``: effective read bandwidth plus a fixed per-shift constant (engine
   re-initialisation: KV cache, CUDA graphs) by least squares on the paper's fig. 12/13
   overheads (sec. 8.5).
Checked, not fitted: the colocated rows' step times, fig. 12/13's shift-down bounds; the
MoE decode model against measurements no fit saw (``pivot.spec.roofline.holdout``).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace

import numpy as np

from pivot.errors import ConfigError
from pivot.spec.stand_in import H20_BF16_TFLOPS
from pivot.spec.profile import ModelProfile, ShiftCost

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class VerlRow:
    """One row of verl's fully async README table ("Asynchronous Training on 7B Model",
    volcengine/verl verl/experimental/fully_async_policy/README.md;
    third_party/calibration/README.md quotes the 128-card rows). Seconds per step, averaged
    over 400 steps."""

    mode: str
    """'colocated' (colocate sync) or 'disaggregated' (fully_async_policy)."""
    devices: int
    rollout_devices: int
    training_devices: int
    step_s: float
    gen_s: float | None
    old_logprob_s: float | None
    update_s: float


VERL_COLOCATED = VerlRow("colocated", 128, 128, 128, 356.30, 177.85, 53.92, 113.81)
VERL_ASYNC = VerlRow("disaggregated", 128, 64, 64, 150.63, None, None, 113.16)
VERL_HELD_OUT = (
    VerlRow("colocated", 32, 32, 32, 790.10, 357.41, 107.71, 269.80),
    VerlRow("colocated", 64, 64, 64, 365.28, 150.72, 70.26, 133.41),
    VerlRow("disaggregated", 32, 16, 16, 294.77, None, None, 313.81),
    VerlRow("disaggregated", 64, 32, 32, 189.26, None, None, 156.98),
)
"""The same table's other cluster sizes (assuming the same mean lengths in every run, which
the table does not state)."""
VERL_ROWS = (VERL_COLOCATED, VERL_ASYNC) + VERL_HELD_OUT
"""Every row of the table."""
VERL_ASYNC_RERUN = VerlRow("disaggregated", 128, 64, 64, 124.64, None, None, 95.06)
"""The same README's require_batches ablation, row require_batches=4: the 64:64 fully async
setting of ``VERL_ASYNC`` (require_batches 4, trigger_parameter_sync_step 4, staleness 0.5,
partial rollout) in another run: 124.64 s a step against 150.63 s, update 95.06 s against
113.16 s. Not a calibration row: it measures verl's own run-to-run spread."""

VERL_SETTINGS = {
    "rollout_tp": 4, "gpu_memory_utilization": 0.8, "max_num_seqs": 1024,
    "max_prompt_length": 2048, "max_response_length": 28672, "n": 16,
    "train_batch_size": 512, "ppo_mini_batch_size": 32, "use_kl_loss": False,
    "use_kl_in_reward": False, "staleness_threshold": 0.5, "partial_rollout": True,
    "require_batches": 4, "trigger_parameter_sync_step": 4,
    "colocated_trainer": "offload=True (parameters and optimizer), fsdp_size=32, "
                         "gradient checkpointing",
    "async_trainer": "actor_offload=False, fsdp_size=8, use_rollout_log_probs=True",
}
"""What verl's launch scripts set for these rows (recipe/dapo/test_dapo_7b_math.sh for
colocated; verl/experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_64_64.sh and its
16_16 / 32_32 siblings; max_num_seqs is verl's rollout.yaml default). The 16_16 script sets
staleness_threshold 0.1 where the README's experiment list says 0.5 for every row."""


def batch_tokens(lengths, prompts_per_step: int, n: int, steps: int, seed: int) -> float:
    """Mean prompt + response tokens of a step's batch, drawn exactly as the simulator's
    workflow draws them (same seed, same order), without running a simulation."""
    from pivot.sim.workflow import Workflow
    wf = Workflow(prompts_per_step, n, steps, steps, lengths, np.random.default_rng(seed),
                  genrm=False)
    wf.release()
    return float(np.mean(list(wf.step_tokens.values())))


@dataclass(frozen=True, slots=True)
class ShiftPoint:
    """One shift overhead the paper reports (sec. 8.5, fig. 12/13)."""

    label: str
    role: str
    """'inference' or 'training'."""
    params_b: float
    devices: int
    """Replica devices (inference) or training devices (table 4)."""
    paper_s: float
    source: str


SHIFT_UP_POINTS = (
    ShiftPoint("Qwen2.5-1.5B", "inference", 1.54, 1, 1.0, "fig. 12: ~1 s"),
    ShiftPoint("Qwen2.5-7B", "inference", 7.6, 1, 2.5, "fig. 13: 2-3 s (midpoint)"),
    ShiftPoint("Qwen3-30B-A3B", "inference", 30.5, 4, 3.5, "fig. 13: 3-4 s (midpoint)"),
    ShiftPoint("Qwen3.5-122B-A10B", "inference", 122.0, 8, 9.0, "fig. 12: ~9 s"),
    ShiftPoint("Qwen2.5-1.5B", "training", 1.54, 16, 2.0, "fig. 12: ~2 s (16 devices, table 4)"),
    ShiftPoint("Qwen2.5-72B", "training", 72.7, 64, 8.5, "fig. 12: ~8.5 s (64 devices, table 4)"),
)
SHIFT_DOWN_BOUNDS = {"inference": 2.0, "training": 6.0}
"""Fig. 12: inference shift down < 2 s, training shift down < 6 s (upper bounds)."""


def rel_err(sim: float, ref: float) -> float:
    return (sim - ref) / ref


# ------------------------------------------------------------------------ training
def fit_amdahl(points: list[tuple[int, float]], flops: float) -> tuple[float, float]:
    """MFU and serial fraction of ``TrainingProfile.amdahl`` that fit ``points``
    ((devices, seconds) of one phase whose work is ``flops``) by least squares on
    seconds = F + b / devices; then mfu = flops / (peak * (F + b)), serial = F / (F + b).
    F is clamped at >= 0 (then b alone is refitted)."""
    if len(points) < 2 or len({d for d, _ in points}) < 2:
        raise ConfigError(f"fit_amdahl: need >= 2 distinct device counts, got {points}")
    if flops <= 0 or any(d <= 0 or t <= 0 for d, t in points):
        raise ConfigError(f"fit_amdahl: flops, devices and seconds must be > 0: {points}")
    x = np.array([1.0 / d for d, _ in points])
    y = np.array([t for _, t in points])
    b, f = np.polyfit(x, y, 1)
    if f < 0:
        b, f = float(x @ y / (x @ x)), 0.0
    if b <= 0:
        raise ConfigError(f"fit_amdahl: seconds do not fall with devices: {points}")
    mfu = flops / (H20_BF16_TFLOPS * 1e12 * (f + b))
    if not 0 < mfu <= 1:
        raise ConfigError(f"fit_amdahl: the fit gives MFU {mfu:.3f} (outside (0, 1]); the "
                          f"batch of {flops:.3g} FLOPs cannot take these seconds. Check "
                          f"LengthModel.response_median in the calibration gin file")
    return float(mfu), float(f / (f + b))


def fit_floor(points: list[tuple[int, float]], flops: float) -> tuple[float, float]:
    """MFU and floor fraction of ``TrainingProfile.floored`` that fit ``points`` ((devices,
    seconds) of a phase of ``flops``): seconds = max(F, b / devices) by least squares on
    relative error. The points with the most devices may sit on the floor F and the others
    on b / devices; every split is tried and the best kept. mfu = flops / (peak * b),
    floor = F / b (0: no point is on a floor)."""
    if len(points) < 2 or len({d for d, _ in points}) < 2:
        raise ConfigError(f"fit_floor: need >= 2 distinct device counts, got {points}")
    if flops <= 0 or any(d <= 0 or t <= 0 for d, t in points):
        raise ConfigError(f"fit_floor: flops, devices and seconds must be > 0: {points}")
    pts = sorted(points)
    best = (math.inf, 0.0, 0.0)
    for k in range(len(pts)):            # the k points with the most devices on the floor
        par, flo = pts[:len(pts) - k], pts[len(pts) - k:]
        b = sum(1 / (d * t) for d, t in par) / sum(1 / (d * t) ** 2 for d, t in par)
        f = (sum(1 / t for _, t in flo) / sum(1 / t ** 2 for _, t in flo)) if flo else 0.0
        res = sum(((max(f, b / d) - t) / t) ** 2 for d, t in pts)
        if res < best[0]:
            best = (res, f, b)
    _, f, b = best
    mfu = flops / (H20_BF16_TFLOPS * 1e12 * b)
    if not 0 < mfu <= 1:
        raise ConfigError(f"fit_floor: the fit gives MFU {mfu:.3f} (outside (0, 1]); the "
                          f"batch of {flops:.3g} FLOPs cannot take these seconds. Check "
                          f"LengthModel.response_median in the calibration gin file")
    return float(mfu), float(f / b)


def implied_mfu(points: list[tuple[int, float]], flops: float) -> float:
    """The parallel-part MFU ``fit_floor`` would give, unchecked: above 1 means no trainer
    on those devices could process ``flops`` in those seconds (a bound on the batch)."""
    b = min(d * t for d, t in points)   # the fastest seconds x devices of any point
    return float(flops / (H20_BF16_TFLOPS * 1e12 * b))


def training_points(rows=VERL_ROWS) -> dict[str, list[tuple[int, float]]]:
    """(training devices, seconds) of each phase over the rows that report it."""
    return {"update": [(r.training_devices, r.update_s) for r in rows],
            "logprob": [(r.training_devices, r.old_logprob_s) for r in rows
                        if r.old_logprob_s is not None]}


# ------------------------------------------------------------------------ shift cost
def _bytes_per_host(p: ShiftPoint, per_host: int) -> float:
    hosts = max(1, math.ceil(p.devices / per_host))
    per_param = 2.0 if p.role == "inference" else 16.0  # bf16 weights; weights+grads+Adam
    return p.params_b * 1e9 * per_param / hosts


def fit_line(x: list[float], y: list[float]) -> tuple[float, float]:
    """Least-squares slope and intercept (intercept clamped at >= 0, then refit)."""
    a, b = np.polyfit(np.asarray(x), np.asarray(y), 1)
    if b < 0:
        a, b = float(np.dot(x, y) / np.dot(x, x)), 0.0
    return float(a), float(b)


def fit_shift_cost(base: ShiftCost, points=SHIFT_UP_POINTS) -> ShiftCost:
    """Effective read GB/s (1 / slope) and the fixed per-shift seconds (intercept) of
    inference and training shift up, fitted to the paper's overheads per host's bytes."""
    out = {}
    for role, gbs_key, const_key in (("inference", "inference_read_gbs", "inference_up_s"),
                                     ("training", "training_read_gbs", "training_up_s")):
        pts = [p for p in points if p.role == role]
        if len(pts) < 2:
            raise ConfigError(f"fit_shift_cost: need >= 2 {role} points, got {len(pts)}")
        x = [_bytes_per_host(p, base.devices_per_host) / 1e9 for p in pts]
        slope, icept = fit_line(x, [p.paper_s for p in pts])
        if slope <= 0:
            raise ConfigError(f"fit_shift_cost: {role} overheads do not grow with bytes")
        out[gbs_key], out[const_key] = 1.0 / slope, icept
    return replace(base, **out)


def shift_comparison(cost: ShiftCost, points=SHIFT_UP_POINTS) -> list[dict]:
    """Modelled shift up / down of each paper point next to the paper's number."""
    rows = []
    for p in points:
        m = ModelProfile(p.label, p.params_b, p.params_b, 1.0, p.devices if p.role ==
                         "inference" else 8, throughput=_DUMMY_TM)
        if p.role == "inference":
            up, down = cost.inference_up(m), cost.inference_down(m)
        else:
            up, down = cost.training_up(m, p.devices), cost.training_down(m, p.devices)
        up_s, down_s = sum(up.values()), sum(down.values())
        rows.append({"model": p.label, "role": p.role, "devices": p.devices,
                     "sim_up_s": up_s, "paper_up_s": p.paper_s, "source": p.source,
                     "up_rel_err": rel_err(up_s, p.paper_s), "sim_down_s": down_s,
                     "paper_down_bound_s": SHIFT_DOWN_BOUNDS[p.role],
                     "down_within_bound": down_s < SHIFT_DOWN_BOUNDS[p.role]})
    return rows


def _dummy():
    from pivot.scheduler.throughput import ThroughputModel
    return ThroughputModel(A=0.0, B=0.0, C=0.0, D=1e-3)


_DUMMY_TM = _dummy()
