"""The simulated fig. 9 and fig. 11 beside the paper's, point by point, at each batch regime.

    python analysis/compare_paper.py [--tags "" _p512n16]

Reads results/sim/fig9<tag>.json and fig11<tag>.json for each tag (``pivot.sim.experiments.
regime``: "" is 32 prompts x gin n, ``_p512n16`` verl's DAPO batch of 512 x 16), prints
PivotRL's speedup over each baseline per group and regime beside the paper's range (sec.
8.2: per-group labels cannot be read off the paper's figure text, so only the ranges are
compared), and fig. 11's strategies and components over disaggregated with their ordering
beside the paper's (sec. 8.4). Writes results/sim/compare_paper.json and a markdown table
results/sim/compare_paper.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PAPER_FIG9 = {"colocated": (1.81, 2.05), "disaggregated": (1.50, 1.95),
              "rr_colocated": (1.66, 1.97)}
"""PivotRL's speedup ranges over the four model groups (abstract, sec. 8.2)."""

PAPER_FIG11 = {"static": (1.55, 1.27), "rule_based": (1.31, 1.05), "vanilla": (1.79, 1.43),
               "throughput_model": (1.87, 1.53), "full": (1.95, 1.61)}
"""Over disaggregated, the paper's two settings of fig. 11 in order (sec. 8.4), taken to
be the first two model groups (1.5B/9B, 7B/30B) as in launchers/experiments/fig11.py."""

REGIME = {"": "32 prompts x gin n", "_p512n16": "512 x 16"}


def _load(name: str) -> dict | None:
    path = ROOT / "results/sim" / name
    return json.loads(path.read_text()) if path.is_file() else None


def fig9_rows(tags: list[str]) -> list[dict]:
    rows = []
    for tag in tags:
        data = _load(f"fig9{tag}.json")
        if data is None:
            continue
        for group, row in data["table"].items():
            for dep, (lo, hi) in PAPER_FIG9.items():
                x = row[f"speedup_over_{dep}"]
                rows.append({"regime": REGIME.get(tag, tag), "group": group, "over": dep,
                             "sim": round(x, 2), "paper": f"{lo:.2f}-{hi:.2f}",
                             "within_paper_range": lo <= x <= hi})
    return rows


def fig11_rows(tags: list[str]) -> list[dict]:
    rows = []
    for tag in tags:
        data = _load(f"fig11{tag}.json")
        if data is None:
            continue
        for i, (group, row) in enumerate(data["table"].items()):
            sim_order = sorted(PAPER_FIG11, key=lambda d: row[d]["over_disaggregated"])
            paper_order = sorted(PAPER_FIG11, key=lambda d: PAPER_FIG11[d][i])
            for d, paper in PAPER_FIG11.items():
                rows.append({"regime": REGIME.get(tag, tag), "group": group, "variant": d,
                             "sim": round(row[d]["over_disaggregated"], 2),
                             "paper": paper[i], "sim_order": sim_order,
                             "paper_order": paper_order,
                             "same_order": sim_order == paper_order})
    return rows


def markdown(f9: list[dict], f11: list[dict]) -> str:
    out = ["| regime | group | PivotRL over | sim | paper |", "|---|---|---|---|---|"]
    out += [f"| {r['regime']} | {r['group']} | {r['over']} | {r['sim']:.2f}x | "
            f"{r['paper']} |" for r in f9]
    out += ["", "| regime | group | variant (over disaggregated) | sim | paper |",
            "|---|---|---|---|---|"]
    out += [f"| {r['regime']} | {r['group']} | {r['variant']} | {r['sim']:.2f}x | "
            f"{r['paper']:.2f}x |" for r in f11]
    seen = set()
    for r in f11:
        key = (r["regime"], r["group"])
        if key not in seen:
            seen.add(key)
            out.append(f"\n{r['regime']}, {r['group']}: sim order {' < '.join(r['sim_order'])}"
                       f"; paper {' < '.join(r['paper_order'])}")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tags", nargs="*", default=["", "_p512n16"])
    a = p.parse_args()
    f9, f11 = fig9_rows(a.tags), fig11_rows(a.tags)
    (ROOT / "results/sim/compare_paper.json").write_text(
        json.dumps({"fig9": f9, "fig11": f11}, indent=1))
    md = markdown(f9, f11)
    (ROOT / "results/sim/compare_paper.md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
