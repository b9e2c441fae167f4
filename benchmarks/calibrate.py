"""Calibrates the simulator against verl's DAPO 7B step times and the paper's shift costs.

    python benchmarks/calibrate.py                    # writes results/sim/calibration.json
    python benchmarks/calibrate.py --gin_param ModelGroup.prompts_per_step=64   # smaller

Generation is not fitted to verl (``pivot.spec.roofline``: H20 roofline, serving overheads
from ML.ENERGY's dense H100 rows; replica shape and limits from verl's launch scripts).
Fitted (``pivot.sim.verl_fit``): the response-length median of each mode (colocated: the
three colocated generation phases; fully async: the three fully async steps; least squares
in log),
each trainer's MFU and floor / serial fraction (two parameters per phase) on its own rows'
phase columns, the shift-up bandwidth and constant to fig. 12/13. Then every verl row's
simulated step and phase times beside verl's with the relative errors, the held-out checks
of the decode model (MoE, another GPU, H20), and the shift-cost comparison.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys

from pivot.paths import REPO_ROOT as ROOT

from pivot.errors import ConfigError
from pivot.sim import verl_fit as cal

log = logging.getLogger("pivot.calibrate")
GIN = "gin/calibration/verl_dapo7b.gin"
COLOCATED = tuple(r for r in cal.VERL_ROWS if r.mode == "colocated")
ASYNC = tuple(r for r in cal.VERL_ROWS if r.mode == "disaggregated")


FITTED = {"colocated": "gin/calibration/verl_colocated_fitted.gin",
          "disaggregated": "gin/calibration/verl_async_fitted.gin"}
"""The fitted constants of each mode as the last calibration wrote them."""


def _parse(row: cal.VerlRow, bindings: list[str], gin_file: str, steps: int,
           extra_files: tuple[str, ...] = ()):
    from pivot import gin_setup
    os.chdir(ROOT)
    if row.mode == "colocated":
        files = [gin_file, "gin/deployments/colocated.gin"]
        b = [f"ModelGroup.devices = {row.devices}", f"TrainingProfile.devices = {row.devices}"]
    else:
        files = [gin_file, "gin/deployments/disaggregated.gin"]
        b = [f"ModelGroup.devices = {row.devices}", f"DISAGG_ROLLOUT = {row.rollout_devices}",
             "DISAGG_REWARD = 0", f"TrainingProfile.devices = {row.training_devices}",
             # verl fully async: staleness_threshold 0.5 with partial rollout; the nearest
             # integer policy-version lag the simulator has is 1.
             "Deployment.staleness = 1",
             # the fully async trainer takes old log-probs from the rollout
             # (use_rollout_log_probs=True: "\\" in verl's table)
             "TrainingProfile.old_logprob = False"]
    gin_setup.parse(files + list(extra_files), b + [f"SimDriver.steps = {steps}"] + bindings)
    return gin_setup.build()


def simulate(row: cal.VerlRow, bindings: list[str], gin_file: str = GIN, steps: int = 2,
             extra_files: tuple[str, ...] = ()):
    """One simulated run of a verl row: its deployment, devices and split (plus gin files,
    e.g. ``FITTED[row.mode]``, after the row's own)."""
    driver = _parse(row, bindings, gin_file, steps, extra_files)
    return driver, driver.run()


def generation_seconds(driver, res) -> float:
    """Mean colocated generation phase: last response of step s minus the phase's start
    (0, or the end of training s-1 plus the training-down / rollout-up switch)."""
    g = driver.group
    switch = (sum(g.shift_cost.training_down(g.policy, driver.train_needed).values())
              + sum(g.shift_cost.inference_up(g.policy).values()))
    ends = dict((s, t) for s, t in res.rollout_end)
    spans = []
    for s, start, end in res.train_steps:
        begin = 0.0 if s == 0 else res.train_steps[s - 1][2] + switch
        spans.append(ends[s] - begin)
    return statistics.mean(spans)


def batch_tokens(row: cal.VerlRow, bindings: list[str], gin_file: str, steps: int) -> float:
    """The mean training batch (prompt + response tokens) the run of ``row`` will draw."""
    d = _parse(row, bindings, gin_file, steps)
    g = d.group
    return cal.batch_tokens(g.lengths, g.prompts_per_step, g.n, steps, d.seed)


def _median(m: float) -> str:
    return f"LengthModel.response_median = {m:.1f}"


def training_fit(mode: str, tokens: float, params_b: float) -> tuple[dict, list[str]]:
    """MFU and floor (update) or serial fraction (old log-prob, Amdahl) of ``mode``'s
    trainer on its own rows (colocated: update and old log-prob; fully async: update), for
    a batch of ``tokens``."""
    rows = COLOCATED if mode == "colocated" else ASYNC
    pts = cal.training_points(rows)
    upd, upd_s = cal.fit_floor(pts["update"], 6.0 * params_b * 1e9 * tokens)
    fit = {"update_mfu": upd, "update_serial": upd_s}
    if pts["logprob"]:
        fit["logprob_mfu"], fit["logprob_serial"] = cal.fit_amdahl(
            pts["logprob"], 2.0 * params_b * 1e9 * tokens)
    return fit, [f"TrainingProfile.{k} = {v!r}" for k, v in fit.items()]


def golden_log(f, lo: float, hi: float, iters: int) -> float:
    """Minimiser of ``f`` over [lo, hi] by golden-section search on a log scale."""
    a, b = math.log(lo), math.log(hi)
    r = (math.sqrt(5) - 1) / 2
    c, d = b - r * (b - a), a + r * (b - a)
    fc, fd = f(math.exp(c)), f(math.exp(d))
    for _ in range(iters):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - r * (b - a)
            fc = f(math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + r * (b - a)
            fd = f(math.exp(d))
    return math.exp((a + b) / 2)


def fit_colocated_median(bindings: list[str], gin_file: str = GIN, iters: int = 12,
                         steps: int = 4, lo: float = 200.0, hi: float = 8000.0) -> float:
    """The response median minimising the squared log errors of the three colocated rows'
    simulated generation phases against verl's (the phase does not depend on training)."""
    def loss(m: float) -> float:
        err = 0.0
        for row in COLOCATED:
            d, r = simulate(row, bindings + [_median(m)], gin_file, steps)
            gen = generation_seconds(d, r)
            log.info("colocated %d: response median %.0f -> generation %.1f s (verl %.1f)",
                     row.devices, m, gen, row.gen_s)
            err += math.log(gen / row.gen_s) ** 2
        return err
    return golden_log(loss, lo, hi, iters)


def fit_async_median(bindings: list[str], gin_file: str = GIN, iters: int = 12,
                     steps: int = 4, lo: float = 100.0, hi: float = 8000.0) -> float:
    """The response median minimising the squared log errors of the three fully async
    rows' simulated steps against verl's, the trainer refitted to each median's batch. A
    median whose batch the fully async trainer cannot process at MFU <= 1 is infeasible
    (its loss is infinite): verl's update times bound the runs' batch."""
    p = _group(bindings, gin_file).policy.active_params_b

    def loss(m: float) -> float:
        b = bindings + [_median(m)]
        try:
            _, tb = training_fit("disaggregated", batch_tokens(ASYNC[0], b, gin_file, steps), p)
        except ConfigError:
            return math.inf
        err = 0.0
        for row in ASYNC:
            _, r = simulate(row, b + tb, gin_file, steps)
            log.info("fully async %s: response median %.0f -> step %.1f s (verl %.1f)",
                     f"{row.rollout_devices}:{row.training_devices}", m, r.step_time,
                     row.step_s)
            err += math.log(r.step_time / row.step_s) ** 2
        return err
    return golden_log(loss, lo, hi, iters)


def _group(bindings: list[str], gin_file: str):
    return _parse(cal.VERL_COLOCATED, bindings, gin_file, 2).group


def calibrate(bindings: list[str] | None = None, gin_file: str = GIN, iters: int = 12,
              steps: int = 4) -> dict:
    """Every fit and check; returns the JSON-ready report."""
    from pivot.spec import roofline
    bindings = list(bindings or [])
    group = _group(bindings, gin_file)
    p = group.policy.active_params_b
    med = {"colocated": fit_colocated_median(bindings, gin_file, iters, steps),
           "disaggregated": fit_async_median(bindings, gin_file, iters, steps)}
    fits, mode_bindings, tokens = {}, {}, {}
    for mode, m in med.items():
        row = COLOCATED[0] if mode == "colocated" else ASYNC[0]
        tokens[mode] = batch_tokens(row, bindings + [_median(m)], gin_file, steps)
        fits[mode], tb = training_fit(mode, tokens[mode], p)
        mode_bindings[mode] = [_median(m)] + tb
    # the fully async trainer on the colocated runs' batch: the MFU it would need
    shared = cal.implied_mfu(cal.training_points(ASYNC)["update"],
                             6.0 * p * 1e9 * tokens["colocated"])
    # the fit replaces the bound shift cost's four fitted fields (gin/base.gin)
    shift = cal.fit_shift_cost(group.shift_cost)
    shift_b = [f"ShiftCost.{k} = {getattr(shift, k):.4f}" for k in
               ("inference_read_gbs", "inference_up_s", "training_read_gbs", "training_up_s")]
    checks = []
    for row in cal.VERL_ROWS:
        d, r = simulate(row, bindings + mode_bindings[row.mode] + shift_b, gin_file, steps)
        sim = {"step_s": r.step_time, **r.training_phases}
        if row.mode == "colocated":
            sim["gen_s"] = generation_seconds(d, r)
        ref = {"step_s": row.step_s, "gen_s": row.gen_s, "old_log_prob": row.old_logprob_s,
               "update_actor": row.update_s}
        errs = {k: cal.rel_err(sim[k], v) for k, v in ref.items() if v and k in sim}
        fitted = (["gen_s", "update_actor", "old_log_prob"] if row.mode == "colocated" else
                  ["update_actor", "step_s"])
        checks.append({"mode": row.mode, "devices": row.devices,
                       "split": f"{row.rollout_devices}:{row.training_devices}",
                       "fitted": [k for k in fitted if k in errs],
                       "sim": sim, "verl": ref, "rel_err": errs,
                       "events_per_s": r.events_per_s})
    n = d.group.prompts_per_step * d.group.n
    prompt = d.group.lengths.prompt_median
    return {"fits": {"response_median": med,
                     "batch_tokens": tokens,
                     "mean_response_tokens": {k: v / n - prompt for k, v in tokens.items()},
                     "training": fits,
                     "async_trainer_mfu_on_colocated_batch": shared,
                     "training_points": {"colocated": cal.training_points(COLOCATED),
                                         "disaggregated": cal.training_points(ASYNC)},
                     "shift_cost": {k: getattr(shift, k) for k in
                                    ("inference_read_gbs", "inference_up_s",
                                     "training_read_gbs", "training_up_s", "pcie_gbs",
                                     "inference_down_s", "training_down_s")}},
            "decode_model": {"policy": _asdict(d.models[next(iter(d.models))]),
                             "holdout": roofline.holdout()},
            "verl_settings": cal.VERL_SETTINGS,
            "verl_run_to_run": {"row": "fully async 64:64, require_batches=4, two runs",
                                "step_s": [cal.VERL_ASYNC.step_s, cal.VERL_ASYNC_RERUN.step_s],
                                "update_s": [cal.VERL_ASYNC.update_s,
                                             cal.VERL_ASYNC_RERUN.update_s]},
            "bindings": {"shared": bindings + shift_b, **mode_bindings},
            "checks": checks, "shift_cost": cal.shift_comparison(shift)}


def _asdict(m) -> dict:
    return {k: getattr(m, k) for k in ("A", "B", "C", "D")}


def print_report(rep: dict) -> None:
    f = rep["fits"]
    for mode, m in f["response_median"].items():
        t = f["training"][mode]
        extra = (f", old-log-prob MFU {t['logprob_mfu']:.3f} serial {t['logprob_serial']:.4f}"
                 if "logprob_mfu" in t else "")
        print(f"{mode:<13} fitted: response median {m:.0f} tokens (mean response "
              f"~{f['mean_response_tokens'][mode]:.0f}); update MFU {t['update_mfu']:.3f} "
              f"floor {t['update_serial']:.4f}{extra}")
    print(f"the fully async trainer would need MFU {f['async_trainer_mfu_on_colocated_batch']:.2f}"
          f" on the colocated runs' batch")
    print("verl DAPO 7B (H20)       quantity       sim (s)   verl (s)  rel. err")
    for c in rep["checks"]:
        tag = f"{c['mode']:<13} {c['devices']:>3} {c['split']:>7}"
        for k, e in c["rel_err"].items():
            fit = " (fitted)" if k in c["fitted"] else ""
            print(f"{tag}  {k:<13} {c['sim'][k]:9.1f}  {c['verl'][k]:9.2f}  {e:+8.1%}{fit}")
    h = rep["decode_model"]["holdout"]
    o = h["overhead"]
    print(f"serving overheads (ML.ENERGY dense H100, {o['fit_rows']} rows, mean |err| "
          f"{o['fit_mean_rel_err']:.1%}): d_layer {o['d_layer_s'] * 1e6:.1f} us, alpha "
          f"{o['alpha_s'] * 1e6:.1f} us, c_seq {o['c_seq_s'] * 1e6:.1f} us")
    for k in ("moe_mlenergy_n64", "moe_mlenergy_all", "dense_b200_lm_arena"):
        print(f"held out {k}: {h[k]['rows']} rows, mean |err| {h[k]['mean_abs_rel_err']:.1%}, "
              f"max {h[k]['max_abs_rel_err']:.1%}")
    for pt in h["infersim_h20"]:
        print(f"held out {pt['label']} ({pt['kind']}): {pt['rel_err']:+.1%}")
    s = f["shift_cost"]
    print(f"shift cost fit: inference read {s['inference_read_gbs']:.1f} GB/s + "
          f"{s['inference_up_s']:.2f} s; training read {s['training_read_gbs']:.1f} GB/s + "
          f"{s['training_up_s']:.2f} s")
    print("shift                         up sim (s)  paper (s)  rel. err  down sim (s) (< bound)")
    for r in rep["shift_cost"]:
        print(f"{r['role']:<9} {r['model']:<18} {r['sim_up_s']:9.2f}  {r['paper_up_s']:9.2f}  "
              f"{r['up_rel_err']:+8.1%}  {r['sim_down_s']:8.2f} (< {r['paper_down_bound_s']:.0f}: "
              f"{r['down_within_bound']})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gin_param", action="append", default=[])
    ap.add_argument("--iters", type=int, default=12, help="search steps for each median")
    ap.add_argument("--steps", type=int, default=4, help="RL steps of each checked run")
    ap.add_argument("--out", default="results/sim/calibration.json")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    rep = calibrate(a.gin_param, iters=a.iters, steps=a.steps)
    out = ROOT / a.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rep, indent=1))
    print_report(rep)
    print(f"wrote {a.out}; copy the fitted bindings into {FITTED['colocated']} and "
          f"{FITTED['disaggregated']} to make them the checked-in calibration")
    return 0


if __name__ == "__main__":
    sys.exit(main())
