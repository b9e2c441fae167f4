"""The simulated fig. 9, 11 and 14 beside the paper's, point by point, at each batch regime,
with the mechanisms the runs show.

    python analysis/compare_paper.py [--tags "" _p512n16]

Reads results/sim/fig9<tag>.json, fig11<tag>.json, fig14<tag>.json, steady<tag>.json and
fig10<tag>[_<group>]_utilization.json for each tag (``pivot.runners.sim_experiments.regime``: ""
is 32 prompts x gin n, ``_p512n16`` verl's DAPO batch of 512 x 16) and writes
results/sim/compare_paper.json and the markdown tables results/sim/compare_paper.md:

- fig. 9: every deployment's tokens/s and split, PivotRL's speedup over each baseline per
  group beside the paper's (``PAPER_FIG9``, read off fig. 9's bar labels), and the same
  runs measured past the pipeline fill (from the end of step ``staleness``,
  ``pivot.sim.metrics.window_throughput``) where they carry per-step tokens;
- the pipeline-fill check (experiments/steady.py) where it was run;
- fig. 11: strategies and components over disaggregated and their order beside the paper's
  (sec. 8.4; the first setting is Qwen2.5-7B & Qwen3-30B-A3B, as fig. 11's panel titles
  and PivotRL's 1.95x / 1.61x, fig. 9's speedups over disaggregated of those groups, say);
- fig. 14: throughput and shifts per step against H (sec. 8.6);
- mechanisms per group and deployment from the runs: training seconds per step against
  the step (how training-bound a deployment is), shifts per step, and the device-time
  split of fig. 10's traces (analysis/sim_utilization.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from pivot.sim.metrics import window_throughput

ROOT = Path(__file__).resolve().parents[1]
DEPS = ("colocated", "disaggregated", "rr_colocated", "pivotrl")
BASELINES = DEPS[:-1]

PAPER_FIG9 = {
    "qwen1.5b_glm9b": {"colocated": 27184, "disaggregated": 31176, "rr_colocated": 25405,
                       "pivotrl": 50077},
    "qwen7b_30b": {"colocated": 11545, "disaggregated": 11711, "rr_colocated": 14189,
                   "pivotrl": 22822},
    "qwen32b_30b": {"colocated": 9998, "disaggregated": 13681, "rr_colocated": 11343,
                    "pivotrl": 20503},
    "qwen72b_122b": {"colocated": 6915, "disaggregated": 7954, "rr_colocated": 7530,
                     "pivotrl": 12503},
}
"""Fig. 9's bars (tokens/s on 32 / 32 / 64 / 128 H20s). The figure's text gives each group's
four values and three speedup labels; which baseline a value belongs to follows from the
labels (PivotRL / value) and the ranges of sec. 8.2 (colocated 1.81-2.05, disaggregated
1.50-1.95); for 7B/30B the remaining label, rr-colocated's, is 1.61x, below the 1.66 the
text gives as that range's low end, and the text says rr-colocated does best among the
baselines in that group, which 1.61x agrees with."""

PAPER_FIG11 = {
    "qwen7b_30b": {"static": 1.55, "rule_based": 1.31, "pivotrl": 1.95, "vanilla": 1.79,
                   "throughput_model": 1.87, "full": 1.95},
    "qwen1.5b_glm9b": {"static": 1.27, "rule_based": 1.05, "pivotrl": 1.61, "vanilla": 1.43,
                       "throughput_model": 1.53, "full": 1.61},
}
"""Over disaggregated (sec. 8.4 and fig. 11's panels: Qwen2.5-7B & Qwen3-30B-A3B first)."""

STRATEGIES = ("disaggregated", "static", "rule_based", "pivotrl")
COMPONENTS = ("disaggregated", "vanilla", "throughput_model", "full")

PAPER_FIG14 = ("low H: fewer shifts and lower throughput; H 60-120: stable throughput and "
               "shifts; H 600: more shifts, lower throughput (sec. 8.6; 21K-23K tok/s, "
               "4-6 shifts per step for 7B/30B)")

REGIME = {"": "32 prompts x gin n", "_p512n16": "512 x 16"}

STALENESS = {"colocated": 0, "disaggregated": 2, "rr_colocated": 2, "pivotrl": 2}
"""Deployment.staleness of gin/deployments/*.gin: the steps a fill-free window skips."""


def _load(name: str) -> dict | None:
    path = ROOT / "results/sim" / name
    return json.loads(path.read_text()) if path.is_file() else None


def fill_free(runs: list[dict], group: str) -> dict[str, float] | None:
    """Mean tokens/s per deployment of fig. 9's runs from the end of step ``staleness``
    (``pivot.sim.metrics.window_throughput``; None where the runs predate
    ``step_processed``)."""
    out = {}
    for d in DEPS:
        rs = [r for r in runs if r["group"] == group and r["deployment"] == d]
        if not rs or any(not r.get("step_processed") for r in rs):
            return None
        out[d] = statistics.mean(window_throughput(r["step_processed"], r["train_steps"],
                                                   STALENESS[d] + 1) for r in rs)
    return out


def fig9_rows(tags: list[str]) -> list[dict]:
    """One row per regime and group: tokens/s, splits, speedups, the paper's, and the
    same runs measured past the pipeline fill where they carry per-step tokens."""
    rows = []
    for tag in tags:
        data = _load(f"fig9{tag}.json")
        for group, row in (data or {}).get("table", {}).items():
            paper = PAPER_FIG9[group]
            ff = fill_free(data["runs"], group)
            rows.append({
                "fill_free_tps": ff and {d: round(v) for d, v in ff.items()},
                "fill_free_speedup": ff and {d: round(ff["pivotrl"] / ff[d], 2)
                                             for d in BASELINES},
                "regime": REGIME.get(tag, tag), "tag": tag, "group": group,
                "tps": {d: round(row[d]["mean"]) for d in DEPS},
                "std": {d: round(row[d]["std"]) for d in DEPS},
                "split": {d: row[d]["split"] for d in DEPS},
                "speedup": {d: round(row[f"speedup_over_{d}"], 2) for d in BASELINES},
                "paper_tps": paper,
                "paper_speedup": {d: round(paper["pivotrl"] / paper[d], 2) for d in BASELINES},
            })
    return rows


def steady_rows(tags: list[str]) -> list[dict]:
    """PivotRL's speedups over fig. 9's window and past the pipeline fill (steady.py)."""
    rows = []
    for tag in tags:
        data = _load(f"steady{tag}.json")
        for group, row in (data or {}).get("table", {}).items():
            rows.append({"regime": REGIME.get(tag, tag), "group": group,
                         "steps": data["settings"]["steps"],
                         "tps": {d: [round(row[d]["fig9_window"]), round(row[d]["steady"])]
                                 for d in DEPS},
                         "speedup": {d: [round(row[f"speedup_over_{d}"][k], 2)
                                         for k in ("fig9_window", "steady")]
                                     for d in BASELINES}})
    return rows


def fig11_rows(tags: list[str]) -> list[dict]:
    """One row per regime and group: each variant over disaggregated, both orders."""
    rows = []
    for tag in tags:
        data = _load(f"fig11{tag}.json")
        for group, row in (data or {}).get("table", {}).items():
            paper = PAPER_FIG11.get(group)
            if paper is None:
                continue
            sim = {d: round(row[d]["over_disaggregated"], 2) for d in paper}
            shifts = {d: round(row[d]["shifts_per_step"], 1) for d in paper}
            out = {"regime": REGIME.get(tag, tag), "group": group, "sim": sim,
                   "paper": paper, "shifts_per_step": shifts}
            for name, variants in (("strategies", STRATEGIES), ("components", COMPONENTS)):
                vs = [v for v in variants if v != "disaggregated"]
                out[f"{name}_sim_order"] = sorted(vs, key=sim.__getitem__)
                out[f"{name}_paper_order"] = sorted(vs, key=paper.__getitem__)
            rows.append(out)
    return rows


def fig14_rows(tags: list[str]) -> list[dict]:
    rows = []
    for tag in tags:
        data = _load(f"fig14{tag}.json")
        if data:
            rows.append({"regime": REGIME.get(tag, tag), "group": data["group"],
                         "rows": [{k: r[k] for k in ("H", "throughput", "std",
                                                     "shifts_per_step")}
                                  for r in data["rows"]]})
    return rows


def mechanism_rows(tags: list[str]) -> list[dict]:
    """Per regime, group and deployment: mean training seconds per step, the step time,
    their ratio (1.0: the step is training; a static split then cannot go faster by
    moving inference devices), shifts per step, and fig. 10's device-time split."""
    rows = []
    for tag in tags:
        data = _load(f"fig9{tag}.json")
        if data is None:
            continue
        for group in data["table"]:
            util = _load(f"fig10{tag}_utilization.json") if group == "qwen7b_30b" else \
                _load(f"fig10{tag}_{group}_utilization.json")
            for dep in DEPS:
                rs = [r for r in data["runs"] if r["group"] == group and r["deployment"] == dep]
                train = statistics.mean(statistics.mean(e - b for _, b, e in r["train_steps"])
                                        for r in rs)
                step = statistics.mean(r["step_time"] for r in rs)
                rows.append({"regime": REGIME.get(tag, tag), "group": group, "deployment": dep,
                             "train_s": round(train), "step_s": round(step),
                             "train_over_step": round(train / step, 2),
                             "shifts_per_step": round(statistics.mean(
                                 r["shifts_per_step"] for r in rs), 1),
                             "utilization": {k: round(v, 3) for k, v in
                                             (util or {}).get(dep, {}).items()}})
    return rows


def markdown(f9: list[dict], steady: list[dict], f11: list[dict], f14: list[dict],
             mech: list[dict]) -> str:
    out = ["## Fig. 9: tokens/s (split rollout/reward/training) and PivotRL's speedups", "",
           "| regime | group | colocated | disaggregated | rr-colocated | PivotRL | "
           "over col / dis / rr (sim) | paper |", "|---|---|---|---|---|---|---|---|"]
    for r in f9:
        cells = [f"{r['tps'][d]:,} ({'/'.join(map(str, r['split'][d]))})"
                 if d != "colocated" else f"{r['tps'][d]:,}" for d in DEPS]
        sim = " / ".join(f"{r['speedup'][d]:.2f}" for d in BASELINES)
        paper = " / ".join(f"{r['paper_speedup'][d]:.2f}" for d in BASELINES)
        out.append(f"| {r['regime']} | {r['group']} | {' | '.join(cells)} | {sim} | {paper} |")
    ff = [r for r in f9 if r["fill_free_tps"]]
    if ff:
        out += ["", "Fig. 9's runs measured past the pipeline fill (from the end of step "
                "`staleness`: steps 3-4 of 5 for the stale deployments, 1-4 for colocated):",
                "", "| regime | group | colocated | disaggregated | rr-colocated | PivotRL | "
                "over col / dis / rr |", "|---|---|---|---|---|---|---|"]
        for r in ff:
            out.append(f"| {r['regime']} | {r['group']} | " + " | ".join(
                f"{r['fill_free_tps'][d]:,}" for d in DEPS) + " | " + " / ".join(
                f"{r['fill_free_speedup'][d]:.2f}" for d in BASELINES) + " |")
    out += ["", "Paper's bars (tokens/s): " + "; ".join(
        f"{g} " + " / ".join(f"{v:,}" for v in p.values()) for g, p in PAPER_FIG9.items()),
        "(colocated / disaggregated / rr-colocated / PivotRL)."]
    if steady:
        out += ["", "## Pipeline fill: fig. 9's window (from the end of step 0) against a "
                "window from the end of step `staleness`", "",
                "| regime | group | steps | col | dis | rr | PivotRL | speedup col / dis / rr "
                "(fig. 9 window -> past the fill) |", "|---|---|---|---|---|---|---|---|"]
        for r in steady:
            cells = [f"{a:,} -> {b:,}" for a, b in (r["tps"][d] for d in DEPS)]
            sp = " / ".join(f"{a:.2f} -> {b:.2f}" for a, b in (r["speedup"][d]
                                                                for d in BASELINES))
            out.append(f"| {r['regime']} | {r['group']} | {r['steps']} | {' | '.join(cells)} "
                       f"| {sp} |")
    out += ["", "## Fig. 11: over disaggregated, and the order of the variants", "",
            "| regime | group | " + " | ".join(v for v in PAPER_FIG11["qwen7b_30b"])
            + " |", "|---|---|" + "---|" * len(PAPER_FIG11["qwen7b_30b"])]
    for r in f11:
        out.append(f"| {r['regime']} | {r['group']} | " + " | ".join(
            f"{r['sim'][v]:.2f} ({r['paper'][v]:.2f})" for v in r["paper"]) + " |")
    out.append("\n(sim (paper); shifts per step: " + "; ".join(
        f"{r['regime']} {r['group']} " + ", ".join(f"{k} {v}" for k, v in
                                                   r["shifts_per_step"].items())
        for r in f11) + ")")
    for r in f11:
        for name in ("strategies", "components"):
            out.append(f"\n{r['regime']}, {r['group']}, {name}: sim "
                       f"{' < '.join(r[name + '_sim_order'])}; paper "
                       f"{' < '.join(r[name + '_paper_order'])}"
                       f"{' (same)' if r[name + '_sim_order'] == r[name + '_paper_order'] else ''}")
    out += ["", "## Fig. 14: PivotRL against H", "", f"Paper: {PAPER_FIG14}.", "",
            "| regime | group | " + " | ".join(f"H={x['H']}" for x in (f14[0]["rows"]
                                                                        if f14 else [])) + " |",
            "|---|---|" + "---|" * (len(f14[0]["rows"]) if f14 else 0)]
    for r in f14:
        out.append(f"| {r['regime']} | {r['group']} | " + " | ".join(
            f"{x['throughput']:,.0f} ±{x['std']:,.0f}, {x['shifts_per_step']:.1f} sh"
            for x in r["rows"]) + " |")
    out += ["", "## Mechanisms: training seconds per step against the step, shifts, "
            "device-time (fig. 10 traces, seed 0)", "",
            "| regime | group | deployment | train s / step s | shifts/step | train | "
            "train wait | infer busy | infer empty | shifting |", "|---|---|---|---|---|---|---|"
            "---|---|---|"]
    for r in mech:
        u = r["utilization"]
        us = " | ".join(f"{u[k]:.1%}" if k in u else "-" for k in
                        ("train", "train_wait", "infer", "infer_empty", "shifting"))
        out.append(f"| {r['regime']} | {r['group']} | {r['deployment']} | {r['train_s']:,} / "
                   f"{r['step_s']:,} ({r['train_over_step']:.2f}) | {r['shifts_per_step']} | "
                   f"{us} |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tags", nargs="*", default=["", "_p512n16"])
    a = p.parse_args()
    f9, st, f11 = fig9_rows(a.tags), steady_rows(a.tags), fig11_rows(a.tags)
    f14, mech = fig14_rows(a.tags), mechanism_rows(a.tags)
    (ROOT / "results/sim/compare_paper.json").write_text(json.dumps(
        {"fig9": f9, "steady": st, "fig11": f11, "fig14": f14, "mechanisms": mech}, indent=1))
    md = markdown(f9, st, f11, f14, mech)
    (ROOT / "results/sim/compare_paper.md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
