"""Where a local run's device time goes (fig. 3's
throughput headroom, measured on the slots).

For each run it splits slot-seconds, from the end of step 1 to the end of the last step
(the window ``throughput`` is measured over), into:

- ``train``: the training slot(s) while a step runs;
- ``train_wait``: training holds the slot but waits for its next batch;
- ``infer``: a rollout or reward replica with sequences on it;
- ``infer_empty``: a rollout or reward replica with nothing to do (staleness window used
  up, or its role's work done);
- ``idle``: a slot no role holds;
- ``shifting``: a slot inside a shift (from the shift records, exact).

The first five come from the allocation trace (one sample per planner tick, about 0.5-1 s
apart, each sample held until the next), so they are estimates; ``shifting`` is taken out
of them in proportion. Usage:

    python analysis/local_utilization.py [results/local/throughput.json]

Reads each run's ``results/local/runs/<tag>_<deployment>_s<seed>/result.json`` (the
summary's ``tag``, else its ``what``) and writes
``results/local/utilization.json`` (``utilization_<tag>.json`` for another summary).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STATES = ("train", "train_wait", "infer", "infer_empty", "idle", "shifting")


def _state(sample: dict, dev: int) -> str:
    if dev in sample["training"]:
        return "train" if sample["training_busy"] else "train_wait"
    if dev in sample["rollout"] or dev in sample["reward"]:
        return "infer" if sample.get("device_seqs", {}).get(str(dev), 0) > 0 else "infer_empty"
    if dev in sample["idle"]:
        return "idle"
    return "shifting"


def utilization(res: dict) -> dict[str, float]:
    """Fractions of slot-time per state over the throughput window of one run."""
    steps, trace = res["steps"], res.get("trace", [])
    if len(steps) < 2 or not trace or "trace_time_s" not in steps[0]:
        return {}
    t0, t1 = steps[0]["trace_time_s"], steps[-1]["trace_time_s"]
    devs = sorted({d for s in trace for k in ("rollout", "reward", "training", "idle")
                   for d in s[k]})
    acc = dict.fromkeys(STATES, 0.0)
    for a, b in zip(trace, trace[1:] + [{"time_s": t1}]):
        lo, hi = max(a["time_s"], t0), min(b["time_s"], t1)
        if hi <= lo:
            continue
        for d in devs:
            acc[_state(a, d)] += hi - lo
    shifting = 0.0
    for rec in res.get("shift_records", []):
        if t0 <= rec["time_s"] <= t1:
            shifting += sum(x["seconds"] * len(x["devices"])
                            for part in ("down", "up") for x in rec[part])
    total = (t1 - t0) * len(devs)
    rest = total - acc["shifting"]
    take = min(max(shifting - acc["shifting"], 0.0), rest)
    for k in STATES:   # shifting time comes out of the sampled states in proportion
        if k != "shifting" and rest > 0:
            acc[k] -= take * acc[k] / rest
    acc["shifting"] += take
    return {k: v / total for k, v in acc.items()}


def summary_arg(doc: str) -> str:
    """The throughput summary named on the command line (default the main run)."""
    p = argparse.ArgumentParser(description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("summary", nargs="?", default="results/local/throughput.json")
    return p.parse_args().summary


def main() -> None:
    from pivot.cluster.results import load_summary, run_result
    path = summary_arg(__doc__)
    src, tag, suffix = load_summary(path)
    per: dict[str, list[dict[str, float]]] = {}
    for row in src["runs"]:
        u = utilization(run_result(tag, row))
        if u:
            per.setdefault(row["deployment"], []).append(u)
    table = {dep: {k: statistics.fmean(u[k] for u in us) for k in STATES}
             for dep, us in per.items()}
    out = {"source": path, "states": STATES, "mean_over_seeds": table}
    (ROOT / f"results/local/utilization{suffix}.json").write_text(json.dumps(out, indent=1))
    print(f"{'deployment':<20}" + "".join(f"{k:>12}" for k in STATES))
    for dep, row in table.items():
        print(f"{dep:<20}" + "".join(f"{row[k]:>12.1%}" for k in STATES))


if __name__ == "__main__":
    main()
