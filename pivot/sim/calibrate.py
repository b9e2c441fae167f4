"""End-to-end calibration of the simulator against published step times (calibration/).

Three fits, each to public measurements only (never to the paper's speedups):
1. ``fit_length_median``: the median response length of verl's DAPO 7B run, so that the
   simulated colocated generation phase takes verl's 177.85 s (the README gives no lengths;
   this is the one free workload parameter, and the implied median is reported).
2. ``fit_amdahl``: the training model's two parameters per phase (MFU and serial
   fraction, ``TrainingProfile``), by least squares on seconds against 1 / devices over
   every verl row that reports the phase (actor update: all six rows; old log-prob: the
   three colocated rows), for the simulated batch (the fitted lengths' tokens).
3. ``fit_shift_cost``: effective read bandwidth plus a fixed per-shift constant (engine
   re-initialisation: KV cache, CUDA graphs) by least squares on the paper's fig. 12/13
   overheads (sec. 8.5).
Held out (checked, not fitted): every row's step time (e.g. colocated 356.30 s, fully async
64:64 150.63 s), the 32/64-device rows' generation, fig. 12/13's shift-down bounds.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace

import numpy as np

from pivot.errors import ConfigError
from pivot.sim.calibration import H20_BF16_TFLOPS
from pivot.sim.profile import ModelProfile, ShiftCost

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
"""Every row; the training fit uses all of them (``fit_amdahl``)."""


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
