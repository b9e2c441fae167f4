"""Calibrates the simulator against verl's DAPO 7B step times and the paper's shift costs.

    python launchers/calibrate.py                    # writes results/sim/calibration.json
    python launchers/calibrate.py --gin_param ModelGroup.prompts_per_step=64   # smaller

Fits (``pivot.sim.calibrate``): the response-length median to verl's colocated generation
(177.85 s), the update / old-log-prob MFU and serial fraction (Amdahl, two parameters per
phase) by least squares to every verl row's actor update (6 rows) and old log-prob (3
colocated rows), the shift-up bandwidth and fixed constant to fig. 12/13. Then prints every
verl row's simulated step and phase times beside verl's with the relative errors, and the
shift-cost comparison.
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

from pivot.sim import calibrate as cal

log = logging.getLogger("pivot.calibrate")
GIN = "gin/calibration/verl_dapo7b.gin"


def simulate(row: cal.VerlRow, bindings: list[str], gin_file: str = GIN, steps: int = 2):
    """One simulated run of a verl row: its deployment, devices and split."""
    from pivot.config import gin_setup
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
             # the fully async trainer takes old log-probs from the rollout ("\" in verl)
             "TrainingProfile.old_logprob = False"]
    gin_setup.parse(files, b + [f"SimDriver.steps = {steps}"] + bindings)
    driver = gin_setup.build()
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


def fit_length_median(target_s: float, bindings: list[str], gin_file: str = GIN,
                      lo: float = 100.0, hi: float = 12000.0, iters: int = 12,
                      steps: int = 4) -> float:
    """Bisection (log scale) on ``LengthModel.response_median`` so that the simulated
    colocated generation takes ``target_s``."""
    for _ in range(iters):
        mid = math.sqrt(lo * hi)
        d, r = simulate(cal.VERL_COLOCATED, bindings + [f"LengthModel.response_median = {mid}"],
                        gin_file, steps)
        gen = generation_seconds(d, r)
        log.info("response median %.0f -> generation %.1f s", mid, gen)
        lo, hi = (mid, hi) if gen < target_s else (lo, mid)
    return math.sqrt(lo * hi)


def calibrate(bindings: list[str] | None = None, gin_file: str = GIN, iters: int = 12,
              steps: int = 4) -> dict:
    """Every fit and check; returns the JSON-ready report."""
    from pivot.sim.profile import ShiftCost
    bindings = list(bindings or [])
    verl = cal.VERL_COLOCATED
    median = fit_length_median(verl.gen_s, bindings, gin_file, iters=iters, steps=steps)
    fitted = bindings + [f"LengthModel.response_median = {median:.1f}"]
    d, r = simulate(verl, fitted, gin_file, steps)
    tokens = statistics.mean(d.workflow.step_tokens.values())
    p = d.group.policy.active_params_b
    pts = cal.training_points()
    upd, upd_s = cal.fit_amdahl(pts["update"], 6.0 * p * 1e9 * tokens)
    lp, lp_s = cal.fit_amdahl(pts["logprob"], 2.0 * p * 1e9 * tokens)
    fitted += [f"TrainingProfile.update_mfu = {upd!r}",
               f"TrainingProfile.update_serial = {upd_s!r}",
               f"TrainingProfile.logprob_mfu = {lp!r}",
               f"TrainingProfile.logprob_serial = {lp_s!r}"]
    shift = cal.fit_shift_cost(ShiftCost())
    fitted += [f"ShiftCost.{k} = {getattr(shift, k):.4f}" for k in
               ("inference_read_gbs", "inference_up_s", "training_read_gbs", "training_up_s")]
    checks = []
    for row in cal.VERL_ROWS:
        d, r = simulate(row, fitted, gin_file, steps=steps)
        sim = {"step_s": r.step_time, **r.training_phases}
        if row.mode == "colocated":
            sim["gen_s"] = generation_seconds(d, r)
        ref = {"step_s": row.step_s, "gen_s": row.gen_s, "old_log_prob": row.old_logprob_s,
               "update_actor": row.update_s}
        errs = {k: cal.rel_err(sim[k], v) for k, v in ref.items() if v and k in sim}
        checks.append({"mode": row.mode, "devices": row.devices,
                       "split": f"{row.rollout_devices}:{row.training_devices}",
                       "fitted_row": row is cal.VERL_COLOCATED, "sim": sim, "verl": ref,
                       "rel_err": errs, "events_per_s": r.events_per_s})
    return {"fits": {"response_median": median, "batch_tokens": tokens,
                     "mean_response_tokens": tokens / (d.group.prompts_per_step * d.group.n)
                     - d.group.lengths.prompt_median,
                     "update_mfu": upd, "update_serial": upd_s,
                     "logprob_mfu": lp, "logprob_serial": lp_s,
                     "training_points": pts,
                     "shift_cost": {k: getattr(shift, k) for k in
                                    ("inference_read_gbs", "inference_up_s",
                                     "training_read_gbs", "training_up_s", "pcie_gbs",
                                     "inference_down_s", "training_down_s")}},
            "bindings": fitted, "checks": checks,
            "shift_cost": cal.shift_comparison(shift)}


def print_report(rep: dict) -> None:
    f = rep["fits"]
    print(f"fitted: response median {f['response_median']:.0f} tokens (mean response "
          f"~{f['mean_response_tokens']:.0f}); update MFU {f['update_mfu']:.3f} serial "
          f"{f['update_serial']:.4f}; old-log-prob MFU {f['logprob_mfu']:.3f} serial "
          f"{f['logprob_serial']:.4f}")
    print("verl DAPO 7B (H20)       quantity       sim (s)   verl (s)  rel. err")
    for c in rep["checks"]:
        tag = f"{c['mode']:<13} {c['devices']:>3} {c['split']:>7}"
        for k, e in c["rel_err"].items():
            fit = (" (fitted)" if c["fitted_row"] and k == "gen_s" else
                   " (in the LSQ fit)" if k in ("update_actor", "old_log_prob") else "")
            print(f"{tag}  {k:<13} {c['sim'][k]:9.1f}  {c['verl'][k]:9.2f}  {e:+8.1%}{fit}")
    s = rep["fits"]["shift_cost"]
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
    ap.add_argument("--iters", type=int, default=12, help="bisection steps for the median")
    ap.add_argument("--steps", type=int, default=4, help="RL steps of each checked run")
    ap.add_argument("--out", default="results/sim/calibration.json")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    rep = calibrate(a.gin_param, iters=a.iters, steps=a.steps)
    out = ROOT / a.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rep, indent=1))
    print_report(rep)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
