"""The cluster driver's measurements, one command each (results/local/<what>.json and .png).

    python experiments/local.py throughput [--steps 10]  # 4 deployments, ratios
                                                     # (every static split)
    python experiments/local.py trace [--from_throughput [SUMMARY]] # fig. 10
    python experiments/local.py overheads                # fig. 12 / table 3
    python experiments/local.py convergence [--steps 20] # fig. 15, 2 seeds
    python experiments/local.py sensitivity [--H 1 5 60] # fig. 14: PivotRL per H

Every run of one command shares ONE ``ClusterStack`` (GPS and the 4 device slots with their
vLLM engines and trainer contexts, started once); between runs the stack is reset (slots
idle, initial weights back in GPS), never restarted, so the deployments run on the same
engines and workload back to back. Settings come from gin/tiny_cpu.gin (``--gin_param``
overrides). The summaries (results/local/<what>.json) keep per-step rows; each run's whole
result, with its allocation trace and shift records, is in results/local/runs/ (not in
git). ``overheads`` reads the shift records of the throughput and trace runs from there
(fig. 12's phases per role; table 3's abort/dispatch per migrated sequence). Plots:
``analysis/local_plots.py``.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pivot.paths import REPO_ROOT as ROOT
OUT = ROOT / "results" / "local"

def throughput_deployments(devices: int) -> tuple[str, ...]:
    """Colocated, every static split of disaggregated and rollout-reward colocated on
    ``devices`` slots (app. E searches each baseline's split; ratios are taken against
    the best), and PivotRL."""
    from pivot.cluster.deployments import static_splits
    return ("colocated", *static_splits(devices), "pivotrl")


CONVERGENCE = ("colocated", "disaggregated", "pivotrl")
log = logging.getLogger("pivot.experiments.local")


def deployment_of(dep: str):
    """``pivotrl``, a static split ``disaggregated_<r>_<w>_<t>`` / ``rr_colocated_<t>``
    (``pivot.cluster.deployments.static_splits``), or a PivotRL variant ``pivotrl_H<s>``,
    ``pivotrl_min<k>``, ``pivotrl_H<s>_min<k>``, ``pivotrl_train<k>``, ``pivotrl_rule``,
    ``pivotrl_home``: time window H (sec. 7.3; the sensitivity sweep),
    ``PivotPlanner.min_replicas``, the training replica's slots
    (``Deployment.training_devices``), ``PivotPlanner.scheduler_rule`` (the what-if under
    the engines' batch cap) and ``Deployment.training_home`` (training provisioned on its
    slots at the start, as a static split's, instead of shifting up at its first batch),
    the rest from gin."""
    import dataclasses
    import functools

    from pivot.errors import ConfigError
    from pivot.cluster.deployments import LOCAL_DEPLOYMENTS, SPLIT_VARIANTS, split_deployment
    from pivot.planner.pivot_planner import PivotPlanner

    if dep.startswith("pivotrl_"):
        kw: dict[str, float | int | bool] = {}
        train, home = 0, False
        for part in dep.removeprefix("pivotrl_").split("_"):
            if part.startswith("min") and part[3:].isdigit():
                kw["min_replicas"] = int(part[3:])
            elif part.startswith("H"):
                kw["H"] = float(part[1:])
            elif part == "rule":
                kw["scheduler_rule"] = True
            elif part == "home":
                home = True
            elif part.startswith("train") and part[5:].isdigit():
                train = int(part[5:])   # slots of the training replica (FSDP2 across them)
            else:
                raise ConfigError(f"--deployments {dep}: unknown PivotRL variant {part!r}; "
                                  f"use H<seconds>, min<replicas>, train<slots>, rule, home, "
                                  f"e.g. pivotrl_H10_min1")
        base = LOCAL_DEPLOYMENTS["pivotrl"]
        if home:   # one reward slot, rollout the rest (-1), as at PivotRL's start
            base = dataclasses.replace(base, rollout_devices=-1, training_home=True)
        return dataclasses.replace(base, name=dep, training_devices=train,
                                   planner=functools.partial(PivotPlanner, **kw))
    known = {**LOCAL_DEPLOYMENTS, **SPLIT_VARIANTS}
    if split_deployment(dep) is not None:
        return split_deployment(dep)
    if dep not in known:
        raise ConfigError(f"--deployments {dep}: unknown; use one of {sorted(known)}, a "
                          f"static split such as disaggregated_1_2_1 or rr_colocated_2, "
                          f"or a PivotRL variant such as pivotrl_H10_min1")
    return known[dep]


def build_driver(dep: str, seed: int, steps: int, run_dir: Path, stack, eval_every: int):
    """A gin-configured ClusterDriver (gin/tiny_cpu.gin) for ``dep`` on the shared stack."""
    from pivot.cluster.driver import ClusterDriver
    from pivot.rl.data import PromptStream

    stream = PromptStream(seed=seed)   # the rest of the stream from gin
    deployment = deployment_of(dep)
    return ClusterDriver(deployment=deployment, stream=stream, steps=steps,
                       seed=seed, run_dir=str(run_dir), stack=stack, eval_every=eval_every)


def summarize(res: dict) -> dict:
    steps = res["steps"]
    return {"deployment": res["deployment"], "seed": res["seed"],
            "throughput": res["throughput"], "throughput_run": res.get("throughput_run"),
            "throughput_finished": res.get("throughput_finished"), "wall_s": res["wall_s"],
            "startup_s": res["startup_s"], "shifts": res["shifts"],
            "max_staleness": res["max_staleness"], "tokens": [m["tokens"] for m in steps],
            "reward": [m["reward/mean"] for m in steps], "time_s": [m["time_s"] for m in steps],
            "step_time_s": [m["step_time_s"] for m in steps],
            "trainer_step_s": [m.get("trainer/step_s") for m in steps],
            "gps_write_s": [m.get("gps/write_s") for m in steps],
            "rollout_refresh_s": [m.get("gps/rollout_refresh_s") for m in steps],
            "control_cpu_s": [m.get("control_cpu_s") for m in steps],
            "slot_cpu_s": [sum(m.get("cpu_s", {}).values()) for m in steps],
            "val_acc": [m.get("val/accuracy_at_1") for m in steps],
            "lengths_fed": res.get("lengths_fed"), "migration": res["migration"],
            "lengths": res.get("lengths")}


def run_result(tag: str, row: dict) -> dict:
    """The whole result of a summary row's run (its trace and shift records too), from
    ``results/local/runs/<tag>_<deployment>_s<seed>/result.json``; the summaries keep
    the per-step rows only, so they stay small enough for git."""
    from pivot.errors import ConfigError

    f = OUT / "runs" / f"{tag}_{row['deployment']}_s{row['seed']}" / "result.json"
    if not f.is_file():
        raise ConfigError(f"{f} is missing: run `experiments/local.py {tag}` "
                          f"here first (run folders are not kept in git)")
    return json.loads(f.read_text())


def run_one(dep: str, seed: int, steps: int, run_dir: Path, stack, eval_every: int) -> dict:
    """One run of ``dep`` on the shared stack, from a clean ``run_dir`` (no resume)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    d = build_driver(dep, seed, steps, run_dir, stack, eval_every)
    try:
        return d.run().to_dict(trace=True)
    finally:
        d.close()


def run_all(runs: list[tuple[str, int]], steps: int, eval_every: int, tag: str,
            warmup_steps: int = 3, report: Callable[[str], None] = print) -> list[dict]:
    """Runs every (deployment, seed) on one stack; ``report`` gets a line per run."""
    from pivot.cluster.stack import ClusterStack

    # a driver's constructor only checks; it gives the stack its gin-configured settings
    probe = build_driver(runs[0][0], runs[0][1], steps, OUT / "runs" / "probe", None, -1)
    stack = ClusterStack(probe.group, probe.seed, probe.lr, probe.cpu_share).start()
    log.info("stack up in %.1f s", stack.startup_s)
    rows = []
    try:
        if warmup_steps > 0:
            # A fresh stack's first run paid 12-15 s more than the same run later (the
            # engines' first batches of each model and size; STATUS.md): a
            # discarded PivotRL run (both models on every slot) takes it for all.
            t = time.perf_counter()
            run_one("pivotrl", runs[0][1], warmup_steps, OUT / "runs" / "warmup", stack, -1)
            shutil.rmtree(OUT / "runs" / "warmup", ignore_errors=True)
            log.info("warm-up run (%d steps, discarded) in %.1f s", warmup_steps,
                     time.perf_counter() - t)
        for i, (dep, seed) in enumerate(runs):
            run_dir = OUT / "runs" / f"{tag}_{dep}_s{seed}"
            res = run_one(dep, seed, steps, run_dir, stack, eval_every)
            (run_dir / "result.json").write_text(json.dumps(res))
            row = summarize(res)
            row["stack_startup_s"] = stack.startup_s
            rows.append(row)
            acc = [v for v in row["val_acc"] if v is not None]
            report(f"[{i + 1}/{len(runs)}] {dep} seed {seed}: {row['throughput'] or 0:,.0f} "
                   f"tok/s, {row['shifts']} shifts, {row['wall_s']:.0f} s"
                   + (f", val acc@1 {acc[-1]:.3f}" if acc else ""))
    finally:
        stack.close()
    return rows


def overheads(rows: list[dict]) -> dict:
    """Fig. 12 / table 3 from shift records: per role and direction, the phases' seconds
    (median over shifts), and migration seconds per aborted / dispatched sequence."""
    phases: dict[str, dict[str, list[float]]] = {}
    mig = {"aborted": 0, "dispatched": 0, "abort_s": 0.0, "dispatch_s": 0.0}
    for r in rows:
        for s in r["shift_records"]:
            for direction in ("down", "up"):
                for rec in s[direction]:
                    key = f"{direction}/{rec['role']}"
                    for ph, sec in rec["phases"].items():
                        phases.setdefault(key, {}).setdefault(ph, []).append(sec)
                    phases.setdefault(key, {}).setdefault("total", []).append(rec["seconds"])
            for k in ("migration_down", "migration_up"):
                for f in mig:
                    mig[f] += s[k][f]
    table = {k: {ph: {"median_s": statistics.median(v), "n": len(v), "max_s": max(v)}
                 for ph, v in d.items()} for k, d in phases.items()}
    per_seq = {"abort_s_per_seq": mig["abort_s"] / mig["aborted"] if mig["aborted"] else None,
               "dispatch_s_per_seq": (mig["dispatch_s"] / mig["dispatched"]
                                      if mig["dispatched"] else None), **mig}
    return {"phases": table, "migration": per_seq}


def throughput_table(rows: list[dict]) -> dict:
    """Means over seeds (each seed runs every deployment on the same prompts) and ratios
    against colocated and the best split of each static baseline (disaggregated,
    rollout-reward colocated), for each throughput reading
    (``pivot.cluster.driver.end_to_end_throughput``)."""
    from pivot.cluster.deployments import split_family
    out: dict = {}
    for key in ("throughput", "throughput_run", "throughput_finished"):
        per: dict[str, list[float]] = {}
        for r in rows:
            if r.get(key):
                per.setdefault(r["deployment"], []).append(r[key])
        thr = {k: statistics.fmean(v) for k, v in per.items()}
        sfx = key.removeprefix("throughput")
        base = {"colocated": thr.get("colocated")}
        for family in ("disaggregated", "rr_colocated"):
            splits = {k: v for k, v in thr.items() if v and split_family(k) == family}
            best = max(splits, key=splits.get) if splits else None
            base[family] = splits.get(best)
            out[f"{family}_best_split{sfx}"] = best
        base["best_static"] = max((v for k, v in base.items() if k != "colocated" and v),
                                  default=None)
        out[f"throughput{sfx}_mean"] = thr
        out[f"throughput{sfx}_per_seed"] = per
        out[f"ratios{sfx}"] = {d: {f"vs_{k}": (t / b if t and b else None)
                                   for k, b in base.items()} for d, t in thr.items()}
    return out


def sensitivity(rows: list[dict]) -> dict[str, dict]:
    """Fig. 14 on the local engines: per H, throughput and shifts per RL step (mean over
    seeds, each seed in a list)."""
    per: dict[str, dict] = {}
    for r in rows:
        e = per.setdefault(r["deployment"], {"throughput": [], "throughput_run": [],
                                             "shifts_per_step": []})
        e["throughput"].append(r["throughput"])
        e["throughput_run"].append(r["throughput_run"])
        e["shifts_per_step"].append(r["shifts"] / max(len(r["tokens"]), 1))
    for e in per.values():
        e["throughput_mean"] = statistics.fmean(e["throughput"])
        e["shifts_per_step_mean"] = statistics.fmean(e["shifts_per_step"])
    return per


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("throughput", "convergence", "trace", "overheads",
                                    "sensitivity"))
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--seeds", type=int, nargs="+", default=None)
    p.add_argument("--deployments", nargs="+", default=None)
    p.add_argument("--gin_param", action="append", default=[])
    p.add_argument("--out", default=None,
                   help="write results/local/<out>.json and runs/<out>_* instead of "
                        "<what>.json and runs/<what>_* (no plot)")
    p.add_argument("--warmup_steps", type=int, default=3,
                   help="steps of the discarded PivotRL run that warms a fresh stack's "
                        "engines before the measured runs (0: none)")
    p.add_argument("--H", type=float, nargs="+", default=[1.0, 3.0, 10.0, 60.0],
                   help="sensitivity: the time windows H (s) to run PivotRL with")
    p.add_argument("--verbose", action="store_true",
                   help="every library's log on the console too (always in "
                        "results/local/runs/<out or what>/run.log)")
    p.add_argument("--from_throughput", nargs="?", const="throughput.json", default=None,
                   metavar="SUMMARY",
                   help="trace: take a run of a throughput summary under results/local "
                        "(default throughput.json; the first of --deployments, default "
                        "pivotrl, seed of its first run) instead of running a new one")
    a = p.parse_args()
    import os
    os.chdir(ROOT)
    from pivot.console import setup_logging
    from pivot import gin_setup
    setup_logging()
    OUT.mkdir(parents=True, exist_ok=True)
    if a.what == "overheads":
        rows, sources = [], []
        for f in ("throughput.json", "trace.json"):
            if not (OUT / f).is_file():
                continue
            src = json.loads((OUT / f).read_text())
            if src.get("source") in sources:   # trace --from_throughput: the same runs
                continue
            tag = src.get("tag", src["what"])
            rows += [run_result(tag, r) for r in src["runs"]]
            sources.append(f)
        out = {"what": "overheads", "sources": sources,
               **overheads(rows)}
        (OUT / "overheads.json").write_text(json.dumps(out, indent=1))
        subprocess.run([sys.executable, "analysis/local_plots.py", "overheads"], cwd=ROOT,
                       check=False)
        print(json.dumps(out, indent=1))
        return 0
    if a.what == "trace" and a.from_throughput:
        summary = Path(a.from_throughput).name
        src = json.loads((OUT / summary).read_text())
        dep = (a.deployments or ["pivotrl"])[0]
        rows = [r for r in src["runs"] if r["deployment"] == dep]
        if not rows:
            raise SystemExit(f"--from_throughput {summary}: no {dep} run in it; name one of "
                             f"{sorted({r['deployment'] for r in src['runs']})} with "
                             f"--deployments")
        rows[0] = {**rows[0], "trace": run_result(src.get("tag", "throughput"), rows[0])["trace"]}
        name = a.out or "trace"
        out = {"what": "trace", "steps": src["steps"], "source": summary, "runs": rows}
        (OUT / f"{name}.json").write_text(json.dumps(out, indent=1))
        subprocess.run([sys.executable, "analysis/local_plots.py", "trace", name], cwd=ROOT,
                       check=False)
        return 0
    if a.what in ("throughput", "sensitivity"):
        # A throughput-bound workload: 32 prompts x 4 responses put each replica past the
        # throughput model's knee (24 sequences, results/profile_tiny_share50.json); at
        # the default 8 prompts every deployment is bound by sequence latency instead.
        a.gin_param = ["PromptStream.prompts_per_step = 32", *a.gin_param]
    gin_setup.parse(["gin/tiny_cpu.gin"], a.gin_param)
    if a.what == "throughput":
        from pivot.cluster.group import ClusterGroup
        deps = a.deployments or throughput_deployments(ClusterGroup().devices)
        seeds, steps, ev = a.seeds or [0], a.steps or 10, -1
    elif a.what == "sensitivity":
        deps = a.deployments or [f"pivotrl_H{h:g}" for h in a.H]
        seeds, steps, ev = a.seeds or [0], a.steps or 10, -1
    elif a.what == "convergence":
        deps, seeds, steps, ev = a.deployments or CONVERGENCE, a.seeds or [0, 1], a.steps or 20, 5
    else:
        deps, seeds, steps, ev = a.deployments or ["pivotrl"], a.seeds or [0], a.steps or 6, -1
    for d in deps:   # a bad name fails here, before any engine starts
        deployment_of(d)
    t = time.perf_counter()
    name = a.out or a.what
    from pivot.console import session
    with session(OUT / "runs" / name, verbose=a.verbose) as con:
        con.line(f"{a.what}: {len(deps)} deployments x {len(seeds)} seeds x {steps} steps on "
                 f"one stack; library logs in {con.log_path}")
        rows = run_all([(d, s) for s in seeds for d in deps], steps, ev, name,
                       a.warmup_steps, report=con.line)
    if a.what == "trace":   # fig. 10 draws the first run's allocation trace
        rows[0]["trace"] = run_result(name, rows[0])["trace"]
    out = {"what": a.what, "tag": name, "steps": steps, "wall_s": time.perf_counter() - t,
           "gin_params": a.gin_param, "runs": rows}
    if a.what == "sensitivity":
        out["per_H"] = sensitivity(rows)
    if a.what == "throughput":
        out.update(throughput_table(rows))
    (OUT / f"{name}.json").write_text(json.dumps(out, indent=1))
    if name == a.what or (a.what == "throughput" and name.startswith("throughput_")):
        subprocess.run([sys.executable, "analysis/local_plots.py", name], cwd=ROOT,
                       check=False)
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
