"""The cluster driver's measurements, one command each (results/local/<what>.json and .png).

    python experiments/local.py throughput [--steps 10]  # colocated, every static split,
                                                         # PivotRL; ratios
    python experiments/local.py trace [--from_throughput [SUMMARY]] # fig. 10
    python experiments/local.py overheads                # fig. 12 / table 3
    python experiments/local.py convergence [--steps 20] # fig. 15, 2 seeds
    python experiments/local.py sensitivity [--H 1 5 60] # fig. 14: PivotRL per H

A run is gin files and bindings: the model group's files (``--gin``, default
gin/tiny_cpu.gin), one deployment's file (``--deployments``: gin files; a bare stem ``X``
is gin/deployments/X.gin), and bindings: ``--gin_param`` for every run, a static split's
for the deployments that take one (``--splits all`` or ``--splits 1/1/2 2/1/1``:
rollout/reward/training slots of disaggregated.gin and the strategies on its split; the
training slots of rr_colocated.gin), the time window of ``sensitivity`` (``--H``), and the
run's steps and seed. Each row is labelled with its ``Deployment.name`` and its split, if
it was given one (``disaggregated_1_2_1``, ``rr_colocated_2``, ``pivotrl_H10``), and
records its files, bindings, training slots and devices (``pivot.cluster.results``), so
analysis reads the summary alone. The whole table of every deployment, 3 seeds x 20 steps:

    python experiments/local.py throughput --out throughput_full \\
        --deployments colocated disaggregated rr_colocated pivotrl pivotrl_train2 \\
        --splits all --seeds 0 1 2 --steps 20

Every run of one command shares ONE ``ClusterStack`` (GPS and the 4 device slots with their
vLLM engines and trainer contexts, started once); between runs the stack is reset (slots
idle, initial weights back in GPS), never restarted, so the deployments run on the same
engines and workload back to back. The summaries (results/local/<what>.json) keep per-step
rows; each run's whole result, with its allocation trace and shift records, is in
results/local/runs/ (not in git). ``overheads`` reads the shift records of the throughput
and trace runs from there (fig. 12's phases per role; table 3's abort/dispatch per migrated
sequence). Plots: ``analysis/local_plots.py``.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pivot.cluster.results import OUT, STATIC_BASELINES, row_name, run_result
from pivot.paths import REPO_ROOT as ROOT

GROUP = ("gin/tiny_cpu.gin",)
THROUGHPUT = ("colocated", "disaggregated", "rr_colocated", "pivotrl")
"""Colocated, every static split of disaggregated and rollout-reward colocated (app. E
searches each baseline's split; ratios are taken against the best), and PivotRL."""
CONVERGENCE = ("colocated", "disaggregated", "pivotrl")
log = logging.getLogger("pivot.experiments.local")


@dataclass(frozen=True)
class Variant:
    """One deployment as a measurement runs it: its gin file and the bindings on top."""

    label: str
    name: str
    file: str
    bindings: tuple[str, ...] = ()
    split: tuple[int | None, int | None, int] | None = None


def parse_split(text: str) -> tuple[int, int, int]:
    """``r/w/t``: rollout, reward and training slots."""
    from pivot.errors import ConfigError
    parts = text.split("/")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ConfigError(f"--splits {text}: use rollout/reward/training slots, each >= 1, "
                          f"e.g. 1/1/2, or 'all'")
    r, w, t = map(int, parts)
    return r, w, t


def variants(deployments: Sequence[str], splits: Sequence[str] | None,
             group: Sequence[str], common: Sequence[str], devices: int,
             H: Sequence[float] = ()) -> list[Variant]:
    """The runs of each deployment file: one, or one per split where ``splits`` is given
    and the deployment takes one (``pivot.gin_files.takes_split``), or one per ``H``."""
    from pivot.errors import ConfigError
    from pivot.gin_files import (all_splits, configured_deployment, deployment_file,
                                 split_bindings, split_label, split_of, takes_split)

    if splits:
        wanted = all_splits(devices) if list(splits) == ["all"] else [
            parse_split(s) for s in splits]
    out: list[Variant] = []
    for d in deployments:
        f = deployment_file(d)
        dep = configured_deployment(f, group, common, carry_planner=False)
        kind = takes_split(dep) if splits else None
        if kind:
            for sp in dict.fromkeys(split_of(kind, s) for s in wanted):
                out.append(Variant(split_label(dep.name, sp), dep.name, f,
                                   tuple(split_bindings(sp)), sp))
        elif H:
            out += [Variant(f"{dep.name}_H{h:g}", dep.name, f, (f"PivotPlanner.H = {h!r}",))
                    for h in H]
        else:
            out.append(Variant(dep.name, dep.name, f))
    labels = [v.label for v in out]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"--deployments {' '.join(deployments)}: two runs share a label "
                          f"({sorted({x for x in labels if labels.count(x) > 1})}); give "
                          f"each file its own Deployment.name")
    return out


def run_bindings(v: Variant, common: Sequence[str], seed: int, steps: int,
                 eval_every: int) -> list[str]:
    """Every binding of one run over its files (they reproduce it with launchers/run.py)."""
    return [*common, *v.bindings, f"RunConfig.steps = {steps}", f"RunConfig.seed = {seed}",
            f"PromptStream.seed = {seed}", f"RunConfig.eval_every = {eval_every}"]


def build_driver(files: Sequence[str], bindings: Sequence[str], run_dir: Path | None, stack):
    """The ClusterDriver these files and bindings configure, on the shared ``stack``."""
    from pivot import gin_setup
    from pivot.cluster.driver import ClusterDriver
    from pivot.errors import ConfigError, PivotError

    extra = [] if run_dir is None else [f"RunConfig.run_dir = {str(run_dir)!r}"]
    gin_setup.parse(list(files), [*bindings, *extra])
    try:
        return ClusterDriver(stack=stack)
    except PivotError as e:
        raise ConfigError(f"{' '.join(files)} with {list(bindings)}: {e}") from None


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


def run_one(files: Sequence[str], bindings: Sequence[str], run_dir: Path, stack,
            label: str) -> dict:
    """One run on the shared stack, from a clean ``run_dir`` (no resume); the result is
    labelled ``label``."""
    shutil.rmtree(run_dir, ignore_errors=True)
    d = build_driver(files, bindings, run_dir, stack)
    try:
        res = d.run().to_dict(trace=True)
    finally:
        d.close()
    res["deployment"] = label
    res["training_slots"], res["devices"] = d.train_needed, d.group.devices
    return res


def run_all(runs: list[tuple[Variant, int]], group: Sequence[str], common: Sequence[str],
            steps: int, eval_every: int, tag: str, warmup_steps: int = 3,
            report: Callable[[str], None] = print) -> list[dict]:
    """Runs every (variant, seed) on one stack; ``report`` gets a line per run."""
    from pivot.cluster.stack import ClusterStack
    from pivot.gin_files import deployment_file

    def files(v: Variant) -> list[str]:
        return [*group, v.file]

    # a driver's constructor only checks: every run's config fails here, before any
    # engine starts; the first gives the stack its gin-configured settings
    first: dict[Variant, int] = {}
    for v, s in runs:
        first.setdefault(v, s)
    probe = [build_driver(files(v), run_bindings(v, common, s, steps, eval_every), None, None)
             for v, s in first.items()][0]
    stack = ClusterStack(probe.group, probe.seed, probe.lr, probe.cpu_share).start()
    log.info("stack up in %.1f s", stack.startup_s)
    rows = []
    try:
        if warmup_steps > 0:
            # A fresh stack's first run paid 12-15 s more than the same run later (the
            # engines' first batches of each model and size): a
            # discarded PivotRL run (both models on every slot) takes it for all.
            t = time.perf_counter()
            warm = Variant("pivotrl", "pivotrl", deployment_file("pivotrl"))
            run_one(files(warm), run_bindings(warm, common, runs[0][1], warmup_steps, -1),
                    OUT / "runs" / "warmup", stack, "warmup")
            shutil.rmtree(OUT / "runs" / "warmup", ignore_errors=True)
            log.info("warm-up run (%d steps, discarded) in %.1f s", warmup_steps,
                     time.perf_counter() - t)
        for i, (v, seed) in enumerate(runs):
            run_dir = OUT / "runs" / f"{tag}_{v.label}_s{seed}"
            bindings = run_bindings(v, common, seed, steps, eval_every)
            res = run_one(files(v), bindings, run_dir, stack, v.label)
            (run_dir / "result.json").write_text(json.dumps(res))
            row = summarize(res)
            row.update(name=v.name, split=v.split, training_slots=res["training_slots"],
                       devices=res["devices"], gin_files=files(v), bindings=bindings,
                       stack_startup_s=stack.startup_s)
            rows.append(row)
            acc = [x for x in row["val_acc"] if x is not None]
            report(f"[{i + 1}/{len(runs)}] {v.label} seed {seed}: "
                   f"{row['throughput'] or 0:,.0f} tok/s, {row['shifts']} shifts, "
                   f"{row['wall_s']:.0f} s" + (f", val acc@1 {acc[-1]:.3f}" if acc else ""))
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
    rollout-reward colocated: the rows of that ``Deployment.name``), for each throughput
    reading (``pivot.cluster.driver.end_to_end_throughput``)."""
    out: dict = {}
    names = {r["deployment"]: row_name(r) for r in rows}
    for key in ("throughput", "throughput_run", "throughput_finished"):
        per: dict[str, list[float]] = {}
        for r in rows:
            if r.get(key):
                per.setdefault(r["deployment"], []).append(r[key])
        thr = {k: statistics.fmean(v) for k, v in per.items()}
        sfx = key.removeprefix("throughput")
        base = {"colocated": thr.get("colocated")}
        for family in STATIC_BASELINES:
            splits = {k: v for k, v in thr.items() if v and names[k] == family}
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
    p.add_argument("--gin", action="append", default=None,
                   help="the model group's gin file(s), before each deployment's "
                        "(repeatable; default gin/tiny_cpu.gin)")
    p.add_argument("--deployments", nargs="+", default=None,
                   help="deployment gin files; a bare stem X is gin/deployments/X.gin "
                        "(with trace --from_throughput: the label of the summary's run)")
    p.add_argument("--splits", nargs="+", default=None,
                   help="static splits of the deployments that take one: 'all' or "
                        "rollout/reward/training slots such as 1/1/2 (rr_colocated takes "
                        "the training slots); default: every split for throughput without "
                        "--deployments, else the gin files' own")
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
                        "(default throughput.json; the row labelled the first of "
                        "--deployments, default pivotrl, seed of its first run) instead of "
                        "running a new one")
    a = p.parse_args()
    import os
    os.chdir(ROOT)
    from pivot.console import setup_logging
    from pivot.errors import ConfigError
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
    group = tuple(a.gin or GROUP)
    common = list(a.gin_param)
    if a.what in ("throughput", "sensitivity"):
        # A throughput-bound workload: 32 prompts x 4 responses put each replica past the
        # throughput model's knee (24 sequences, results/profile_tiny_share50.json); at
        # the default 8 prompts every deployment is bound by sequence latency instead.
        common = ["PromptStream.prompts_per_step = 32", *common]
    H: list[float] = []
    splits = a.splits
    if a.what == "throughput":
        deps = a.deployments or THROUGHPUT
        splits = splits or (None if a.deployments else ["all"])
        seeds, steps, ev = a.seeds or [0], a.steps or 10, -1
    elif a.what == "sensitivity":
        deps, H = a.deployments or ["pivotrl"], a.H
        seeds, steps, ev = a.seeds or [0], a.steps or 10, -1
    elif a.what == "convergence":
        deps, seeds, steps, ev = a.deployments or CONVERGENCE, a.seeds or [0, 1], a.steps or 20, 5
    else:
        deps, seeds, steps, ev = a.deployments or ["pivotrl"], a.seeds or [0], a.steps or 6, -1
    try:   # a bad file, split or binding fails here, before any engine starts
        devices = build_driver([*group, "gin/deployments/pivotrl.gin"], common, None,
                               None).group.devices
        plan = variants(deps, splits, group, common, devices, H)
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    t = time.perf_counter()
    name = a.out or a.what
    from pivot.console import session
    with session(OUT / "runs" / name, verbose=a.verbose) as con:
        con.line(f"{a.what}: {len(plan)} deployments x {len(seeds)} seeds x {steps} steps "
                 f"on one stack; library logs in {con.log_path}")
        rows = run_all([(v, s) for s in seeds for v in plan], group, common, steps, ev, name,
                       a.warmup_steps, report=con.line)
    if a.what == "trace":   # fig. 10 draws the first run's allocation trace
        rows[0]["trace"] = run_result(name, rows[0])["trace"]
    out = {"what": a.what, "tag": name, "steps": steps, "wall_s": time.perf_counter() - t,
           "gin_files": list(group), "gin_params": common, "devices": devices,
           "runs": rows}
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
