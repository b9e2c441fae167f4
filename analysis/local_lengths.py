"""The long tail of a local measurement's runs (sec. 3's long tail, on the local slots): the
length distributions of responses and judgements over the first and the last steps of
every run (``pivot.rl.lengths.length_report``, in each run's result), and their range over
runs.

    python analysis/local_lengths.py [results/local/throughput.json]

Takes each row's ``lengths`` from the summary, or from its run's
``results/local/runs/<tag>_<deployment>_s<seed>/result.json`` where the summary predates
them; writes ``results/local/lengths.json`` (``lengths_<tag>.json`` for another summary)
and prints one line per kind and window.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ("p50", "p90", "p99", "max", "mean", "p99_over_p50")


def lengths_of(tag: str, row: dict) -> dict:
    if row.get("lengths"):
        return row["lengths"]
    from pivot.cluster.results import run_result
    return run_result(tag, row)["lengths"]


def ranges(reports: list[dict]) -> dict:
    """kind -> window -> field -> [min, max] over the runs' reports (windows with data)."""
    out: dict = {}
    for kind in ("response", "judgement"):
        for window in ("start", "end"):
            qs = [r[kind][window] for r in reports if r.get(kind, {}).get(window)]
            if qs:
                out.setdefault(kind, {})[window] = {
                    f: [min(q[f] for q in qs), max(q[f] for q in qs)] for f in FIELDS
                    if all(q.get(f) is not None for q in qs)} | {"runs": len(qs)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("summary", nargs="?", default=str(ROOT / "results/local/throughput.json"))
    ap.add_argument("--out", default=None, help="default: results/local/lengths[_<tag>].json")
    a = ap.parse_args()
    src = json.loads(Path(a.summary).read_text())
    tag = src.get("tag", src["what"])
    runs = [{"deployment": r["deployment"], "seed": r["seed"], "lengths": lengths_of(tag, r)}
            for r in src["runs"]]
    out = {"source": Path(a.summary).name, "window_steps": runs[0]["lengths"]["window_steps"],
           "range_over_runs": ranges([r["lengths"] for r in runs]), "runs": runs}
    name = "lengths.json" if tag == "throughput" else f"lengths_{tag.replace('/', '_')}.json"
    dest = Path(a.out) if a.out else ROOT / "results" / "local" / name
    dest.write_text(json.dumps(out, indent=1))
    print(f"{len(runs)} runs of {out['source']}, first and last {out['window_steps']} steps "
          f"each; range over runs (tokens of each model):")
    for kind, windows in out["range_over_runs"].items():
        for window, q in windows.items():
            cells = ", ".join(f"{f} {lo:.0f}-{hi:.0f}" if f != "p99_over_p50" else
                              f"p99/p50 {lo:.1f}-{hi:.1f}" for f, (lo, hi) in
                              ((f, q[f]) for f in FIELDS if f in q and f != "mean"))
            print(f"  {kind:9s} {window:5s}: {cells}")
    print(f"wrote {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
