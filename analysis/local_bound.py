"""How fast could any allocation of the slots run the local workload? A fluid bound from
the work the throughput runs measured (where the time goes and what would change it: the
headroom of sec. 3 / fig. 3, on the local slots).

Every RL step must

- train once, ``T_k`` seconds on ``k`` slots, one step after another (step t+1 trains on
  step t's policy, sec. 4), and
- roll out and judge the step's ``Q`` tokens: ``W = Q / e`` slot-seconds of inference at
  efficiency ``e``, the most tokens per busy inference slot-second any deployment of the
  same run reached (a role with work on few slots batches more per engine step).

On ``N`` slots a step then takes at least ``P_k = max(T_k, (W + k T_k) / N)``; a planner
that trains on ``a`` slots for a fraction of the steps and ``b`` for the rest averages
the two lines, so the bound takes the best such mix too. Shifts, pipeline fill, the
staleness window and the split of ``W`` between rollout and reward are all left out, so
no planner reaches it: what a deployment loses against it is what those cost it.

    python analysis/local_bound.py [results/local/throughput.json]

Reads the summary (its runs' throughput, step times, trainer step times and training
slots, ``pivot.cluster.results``; a summary older than the recorded slots gives them by
its labels) and the utilization file ``analysis/local_utilization.py`` wrote for it; writes
``results/local/bound.json`` (``bound_<tag>.json`` for another summary).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

from pivot.cluster.results import (STATIC_BASELINES, load_summary, row_name,
                                   row_training_slots, summary_devices,
                                   summary_training_default)

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Bound:
    """The smallest step period any allocation of ``devices`` slots allows.

    period_s: the bound on the mean step period; mix: {training slots: fraction of
    steps} that reaches it; per_k: each single k's bound; limit: ``"training"`` when the
    serial training step sets it, ``"slot-time"`` when the pool's slot-seconds do,
    ``"both"`` for a mix (it sits where the two meet).
    """

    period_s: float
    mix: dict[int, float]
    per_k: dict[int, float]
    limit: str


def step_bound(devices: int, inference_slot_s: float, train_s: dict[int, float]) -> Bound:
    """The fluid bound (module docstring) for ``inference_slot_s`` = W per step and the
    measured training step ``train_s[k]`` on k slots (k < devices keeps a slot for
    inference; colocated's k = devices runs the stages in turn and is a line too)."""
    if devices < 1 or inference_slot_s < 0 or not train_s:
        raise ValueError("need devices >= 1, inference slot-seconds >= 0 and a training time")

    def lines(k: int) -> tuple[float, float]:  # (training's period, slot-time's period)
        return train_s[k], (inference_slot_s + k * train_s[k]) / devices

    per_k = {k: max(lines(k)) for k in sorted(train_s)}
    best = min(per_k, key=per_k.__getitem__)
    period, mix = per_k[best], {best: 1.0}
    for a in train_s:            # a mix of two slot counts: both lines linear in the share
        for b in train_s:
            if a >= b:
                continue
            (ta, sa), (tb, sb) = lines(a), lines(b)
            # share x of steps on a: max(x ta + (1-x) tb, x sa + (1-x) sb), least where
            # the two cross inside (0, 1)
            den = (ta - tb) - (sa - sb)
            if den == 0:
                continue
            x = (sb - tb) / den
            if 0 < x < 1:
                p = x * ta + (1 - x) * tb
                if p < period - 1e-12:
                    period, mix = p, {a: x, b: 1 - x}
    t_mean = sum(share * train_s[k] for k, share in mix.items())
    slot = sum(share * lines(k)[1] for k, share in mix.items())
    limit = ("both" if abs(t_mean - slot) < 1e-9 else
             "training" if t_mean > slot else "slot-time")
    return Bound(period, mix, per_k, limit)


def measure(summary: dict, utilization: dict) -> dict:
    """The bound for one throughput summary, with each deployment's distance from it."""
    devices = summary_devices(summary)
    default_k = summary_training_default(summary)
    util = utilization["mean_over_seeds"]
    per: dict[str, dict] = {}
    for run in summary["runs"]:
        d = run["deployment"]
        t = run["time_s"]
        per.setdefault(d, {"tok_s": [], "period_s": [], "train_s": [],
                           "k": row_training_slots(run, devices, default_k),
                           "static": row_name(run) in STATIC_BASELINES})
        per[d]["tok_s"].append(run["throughput"])
        per[d]["period_s"].append((t[-1] - t[0]) / (len(t) - 1))
        per[d]["train_s"].append(statistics.median(run["trainer_step_s"][1:]))
    rows, train_by_k = {}, {}
    for d, v in per.items():
        tok_s = statistics.fmean(v["tok_s"])
        busy = util[d]["infer"] * devices if d in util else None
        k = v["k"]
        train_by_k.setdefault(k, []).extend(v["train_s"])
        rows[d] = {"tok_s": tok_s, "period_s": statistics.fmean(v["period_s"]),
                   "tokens_per_step": tok_s * statistics.fmean(v["period_s"]),
                   "training_slots": k, "train_step_s": statistics.fmean(v["train_s"]),
                   "busy_inference_slots": busy,
                   "tokens_per_busy_slot_s": tok_s / busy if busy else None}
    eff_dep = max((d for d in rows if rows[d]["tokens_per_busy_slot_s"]),
                  key=lambda d: rows[d]["tokens_per_busy_slot_s"])
    e = rows[eff_dep]["tokens_per_busy_slot_s"]
    q = statistics.fmean(r["tokens_per_step"] for r in rows.values())
    train_s = {k: statistics.median(v) for k, v in sorted(train_by_k.items())}
    b = step_bound(devices, q / e, train_s)
    ceiling = q / b.period_s
    best = max((d for d in rows if per[d]["static"]), key=lambda d: rows[d]["tok_s"],
               default=None)
    for r in rows.values():
        r["of_bound"] = r["tok_s"] / ceiling
    return {"devices": devices, "tokens_per_step": q, "inference_efficiency": e,
            "efficiency_from": eff_dep, "inference_slot_s": q / e, "train_step_s": train_s,
            "bound": dataclasses.asdict(b), "bound_tok_s": ceiling,
            "best_static": best,
            "bound_over_best_static": ceiling / rows[best]["tok_s"] if best else None,
            "deployments": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("summary", nargs="?", default="results/local/throughput.json")
    path = p.parse_args().summary
    src, _, suffix = load_summary(path)
    util_f = ROOT / f"results/local/utilization{suffix}.json"
    if not util_f.is_file():
        raise SystemExit(f"local_bound.py: {util_f.relative_to(ROOT)} is missing; the bound "
                         f"reads each deployment's busy inference slot-time from it: run "
                         f"`.venv/bin/python analysis/local_utilization.py {path}` first")
    out = {"source": path, **measure(src, json.loads(util_f.read_text()))}
    (ROOT / f"results/local/bound{suffix}.json").write_text(json.dumps(out, indent=1))
    b = out["bound"]
    mix = ", ".join(f"{share:.0%} of steps on {k}" for k, share in b["mix"].items())
    print(f"per step: {out['tokens_per_step']:,.0f} tokens, inference "
          f"{out['inference_slot_s']:.2f} slot-s at {out['inference_efficiency']:,.0f} "
          f"tok per busy slot-s ({out['efficiency_from']}), training "
          + ", ".join(f"{t:.2f} s on {k}" for k, t in out["train_step_s"].items()))
    print(f"bound: {b['period_s']:.2f} s a step ({mix}; {b['limit']} sets it) = "
          f"{out['bound_tok_s']:,.0f} tok/s, {out['bound_over_best_static']:.2f}x the best "
          f"static split ({out['best_static']})")
    print(f"{'deployment':<28}{'tok/s':>8}{'step s':>8}{'train':>6}{'train s':>9}"
          f"{'busy inf':>9}{'tok/busy-s':>11}{'of bound':>9}")
    for d, r in out["deployments"].items():
        busy = r["busy_inference_slots"]
        eff = r["tokens_per_busy_slot_s"]
        print(f"{d:<28}{r['tok_s']:>8,.0f}{r['period_s']:>8.2f}{r['training_slots']:>6}"
              f"{r['train_step_s']:>9.2f}{busy if busy is not None else float('nan'):>9.2f}"
              f"{eff if eff is not None else float('nan'):>11,.0f}{r['of_bound']:>9.0%}")


if __name__ == "__main__":
    main()
