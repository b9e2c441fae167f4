"""Shared helpers of the simulated experiments: one run from gin, a process pool, the
split search on a model group (``pivot.sim.search``), and offline wandb logging."""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor

from pivot.paths import REPO_ROOT as ROOT

GROUPS = ["qwen1.5b_glm9b", "qwen7b_30b", "qwen32b_30b", "qwen72b_122b"]
SEARCHED = {"disaggregated": dict(free_reward=True),
            "rule_based": dict(free_reward=True),
            "static": dict(free_reward=True),
            "rr_colocated": dict(free_reward=False, shared=True),
            "pivotrl": dict(free_reward=False, shared=True, pivot_initial=True)}
"""Deployments with a split to search and the coordinates that are free (app. E)."""


def dep_file(dep: str) -> str:
    return f"gin/deployments/{dep}.gin"


def run_one(job: tuple) -> dict:
    """(group, deployment, bindings, trace) -> the run's result dict (a worker). A run
    stopped by ``SimDriver.stop_below`` gives ``pruned`` True and, as ``throughput``,
    the bound it was proven under."""
    group, dep, bindings, trace = job
    os.chdir(ROOT)
    from pivot import gin_setup
    from pivot.sim.driver import RunPruned
    gin_setup.parse([f"gin/{group}.gin", dep_file(dep)], list(bindings))
    driver = gin_setup.build()
    t0 = time.perf_counter()
    try:
        res = driver.run().to_dict(trace=trace)
    except RunPruned as e:
        res = {"group": group, "deployment": dep, "pruned": True, "throughput": e.bound,
               "virtual_s": e.virtual_s, "wall_s": time.perf_counter() - t0,
               "events": driver.cluster.events}
    res["bindings"] = list(bindings)
    return res


ALIAS = {"full": "pivotrl"}
"""Deployments whose gin file is another's with only ``Deployment.name`` changed
(gin/deployments/full.gin includes pivotrl.gin): their runs are the other's runs."""


def run_key(group: str, dep: str, bindings) -> tuple:
    """What makes two runs the same run (the simulator is deterministic in its gin files
    and bindings, whatever their order)."""
    return group, ALIAS.get(dep, dep), frozenset(bindings)


def fig9_runs(tag: str = "") -> dict[tuple, dict]:
    """fig. 9's runs at a regime (results/sim/fig9<tag>.json) by ``run_key``."""
    import json
    path = ROOT / f"results/sim/fig9{tag}.json"
    if not path.is_file():
        return {}
    return {run_key(r["group"], r["deployment"], r["bindings"]): r
            for r in json.loads(path.read_text())["runs"]}


def run_or_reuse(jobs: list[tuple], done: dict[tuple, dict], workers: int = 2) -> list[dict]:
    """``run_many``, except that a job (without trace) whose ``run_key`` is in ``done``
    takes that run's result (fig. 11 and 14 reuse fig. 9's disaggregated and PivotRL
    runs) instead of running again. Results keep the job's deployment name."""
    keys = [run_key(g, d, b) for g, d, b, _ in jobs]
    todo = [j for j, k in zip(jobs, keys) if j[3] or k not in done]
    fresh = iter(run_many(todo, workers))
    out = []
    for j, k in zip(jobs, keys):
        r = next(fresh) if (j[3] or k not in done) else {**done[k], "reused": True}
        out.append({**r, "deployment": j[1], "bindings": list(j[2])})
    return out


def run_many(jobs: list[tuple], workers: int = 2) -> list[dict]:
    if workers <= 1:
        return [run_one(j) for j in jobs]
    with ProcessPoolExecutor(workers) as ex:
        return list(ex.map(run_one, jobs))


def split_space(group: str, dep: str):
    """The admissible splits of a group (replica sizes from its gin file)."""
    os.chdir(ROOT)
    from pivot import gin_setup
    from pivot.sim.search import Split, SplitSpace
    gin_setup.parse([f"gin/{group}.gin", dep_file(dep)], [])
    d = gin_setup.build()
    g = d.group
    space = SplitSpace(g.devices, g.policy.devices, (g.genrm or g.policy).devices,
                       g.devices_per_host, **SEARCHED[dep])
    start = Split(d.split[0], d.split[1], d.train_needed)
    return space, start


def search(group: str, dep: str, base: list[str], workers: int = 2, rounds: int = 2,
           runs: dict | None = None, prune: bool = True):
    """Coordinate split search for one group and deployment; evaluates the candidates
    of each coordinate sweep in parallel. ``runs``, if given, receives the result dict
    of every split it ran (a caller may reuse the best one's rather than run it again:
    the simulator is deterministic in its bindings).

    ``prune``: each run gets the best throughput measured so far as
    ``SimDriver.stop_below`` (with one worker, the best before each run; with more, before
    each sweep), so a split proven unable to beat it stops early and is recorded in
    ``SearchResult.pruned`` with its bound. The chosen split and every score the search
    compares against the best are the same as without pruning: a pruned split's
    throughput is below a throughput already measured, so it is never the best."""
    from pivot.sim import search as S
    space, start = split_space(group, dep)

    class Batched:
        """Evaluates a sweep's splits together so that the pool stays busy."""

        def __init__(self) -> None:
            self.cache: dict = {}
            self.pruned: dict = {}

        def _job(self, split) -> tuple:
            best = max((t for s, t in self.cache.items() if s not in self.pruned),
                       default=0.0)
            stop = [f"SimDriver.stop_below = {best!r}"] if prune and best > 0 else []
            return group, dep, tuple(base + split.bindings() + stop), False

        def __call__(self, split) -> float:
            if split not in self.cache:
                self._keep(split, run_one(self._job(split)))
            return self.cache[split]

        def prefetch(self, splits) -> None:
            todo = [s for s in dict.fromkeys(splits) if s is not None and s not in self.cache]
            if workers <= 1:
                for s in todo:
                    self(s)
                return
            for s, r in zip(todo, run_many([self._job(s) for s in todo], workers)):
                self._keep(s, r)

        def _keep(self, split, result: dict) -> None:
            self.cache[split] = result["throughput"]
            if result.get("pruned"):
                self.pruned[split] = result["throughput"]
            elif runs is not None:
                runs[split] = result

    evaluate = Batched()
    res = S.search_split(space, start, evaluate, rounds=rounds)
    res.pruned = dict(evaluate.pruned)
    return res


def wandb_log(name: str, config: dict, metrics: dict, group: str | None = None) -> None:
    """One offline wandb run per experiment record (WANDB_MODE is respected)."""
    from pivot.console import init_wandb
    run_dir = ROOT / "runs" / "wandb"
    run_dir.mkdir(parents=True, exist_ok=True)
    wb = init_wandb(run_dir, name=name, config_str=config.get("gin", ""), group=group)
    if wb is None:
        return
    wb.config.update({k: v for k, v in config.items() if k != "gin"},
                     allow_val_change=True)
    wb.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))})
    wb.finish()


def regime(prompts: int, n: int | None) -> tuple[list[str], str]:
    """The bindings of a batch regime (prompts per step, responses per prompt; ``n`` None:
    the group's gin value) and the suffix of its result files: none for the first
    regime the figures were measured at (32 prompts, gin n), ``_p512n16`` for verl's
    DAPO batch (512 x 16), and so on."""
    binds = [f"ModelGroup.prompts_per_step = {prompts}"]
    if n is not None:
        binds.append(f"ModelGroup.n = {n}")
    tag = "" if prompts == 32 and n is None else f"_p{prompts}" + ("" if n is None else f"n{n}")
    return binds, tag


def chosen_split(group: str, dep: str, tag: str = "") -> list[str]:
    """Bindings of the split fig. 9's search chose (results/sim/fig9<tag>.json, ``tag``
    from ``regime``), else [] (table 4's split from the group's gin file)."""
    import json
    path = ROOT / f"results/sim/fig9{tag}.json"
    if not path.is_file():
        return []
    found = json.loads(path.read_text()).get("searches", {}).get(f"{group}/{dep}")
    if not found:
        return []
    from pivot.sim.search import Split
    return Split(*found["best"]).bindings()
