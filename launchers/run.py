"""Runs one PivotRL experiment from gin files: parse, build, run, close.

    python launchers/run.py                                   # gin/tiny_cpu.gin: real engines
    python launchers/run.py --gin gin/qwen72b_122b.gin        # a paper model group: sim driver
    python launchers/run.py --gin gin/qwen7b_30b.gin --gin gin/deployments/disaggregated.gin \
        --gin_param SimDriver.seed=1

The driver is whatever ``run.driver`` binds. With no --gin it runs ``gin/tiny_cpu.gin``: the
``cluster`` driver, real RL post-training with resource shifting on this machine's CPU (tiny
models built on first use). The paper's model groups (``gin/qwen*.gin``) bind the ``sim``
driver. Results go to ``runs/<name>/`` (result.json, operative_config.gin, run.log with
every library's log, metrics and checkpoints for the cluster driver) and to wandb (offline by
default). The console shows the driver, the models, the run folder, a progress bar and a
summary; ``--verbose`` shows every log as well.

``--dry_run`` builds the whole driver for a described cluster (``ClusterSpec`` bindings:
hosts, GPUs a host, GPU / host / ``/dev/shm`` GB; the paper's 16 x 8 H20 by default) on any
machine, starts nothing, prints the memory plan (``pivot.cluster.memory_plan``) and exits
2 naming the bindings that do not fit:

    python launchers/run.py --gin gin/qwen7b_30b.gin --gin gin/backends/cuda.gin --dry_run \
        --gin_param "ClusterSpec.gpu_gb = 80"
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pivot import console
from pivot import gin_setup
from pivot.errors import ConfigError
from pivot.paths import REPO_ROOT

DEFAULT_GIN = ["gin/tiny_cpu.gin"]   # the cluster driver: real RL on this CPU


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gin", action="append", default=None,
                   help="gin file (repeatable; later files override). Default: "
                        "gin/tiny_cpu.gin, the cluster driver with real engines on this CPU")
    p.add_argument("--gin_param", action="append", default=[],
                   help="a binding such as 'SimDriver.seed = 1' (repeatable)")
    p.add_argument("--run_dir", default=None, help="output folder (default runs/<name>)")
    p.add_argument("--no_progress", action="store_true", help="no progress bar")
    p.add_argument("--dry_run", action="store_true",
                   help="build the driver for the described cluster (ClusterSpec), print "
                        "its memory plan, start nothing")
    p.add_argument("--verbose", action="store_true",
                   help="every library's log on the console too (always in run.log)")
    a = p.parse_args(argv)
    console.setup_logging(verbose=a.verbose)
    files = a.gin or DEFAULT_GIN
    os.chdir(REPO_ROOT)
    origin = gin_setup.driver_origin(files, a.gin_param)
    try:
        gin_setup.parse(files, a.gin_param)
        if a.dry_run:
            return dry_run(files, a.gin_param)
        driver = gin_setup.build()
    except ConfigError as e:
        print(f"error: {e}\n  (gin files: {' '.join(files)}; run.driver = {origin[0]} from "
              f"{origin[1]})", file=sys.stderr)
        return 2
    run_dir = Path(a.run_dir or f"runs/{driver.group.name}_{driver.dep.name}_s{driver.seed}")
    return console.run_and_report(driver, files, run_dir, verbose=a.verbose,
                                  progress=not a.no_progress, origin=origin)


def dry_run(files: list[str], params: list[str]) -> int:
    """Builds the driver on the described cluster and prints its memory plan."""
    from pivot.cluster.memory_plan import GB, ClusterSpec, plan_of
    from pivot.spec.model_group import ModelGroup

    spec = ClusterSpec()
    gin_setup.parse(files, params + [f"Backend.described_gpus = {spec.gpus_per_host}"])
    driver = gin_setup.build()
    g = getattr(driver, "group", None)
    backend = getattr(g, "backend", None)
    if backend is None or backend.kind != "cuda":
        slots = getattr(g, "devices", 0)
        print(f"dry run: {type(driver).__name__} on {getattr(backend, 'kind', 'no')} "
              f"backend, built and checked (models, slots against this machine's cores and "
              f"memory: {slots} slots x {getattr(g, 'gb_per_slot', 0):g} GB within "
              f"ClusterGroup.memory_budget_gb={getattr(g, 'memory_budget_gb', 0):g}); the GPU "
              f"memory plan is for Backend.kind = 'cuda'. Nothing started.")
        return 0
    p = plan_of(driver, ModelGroup(), spec)
    print(f"dry run: {g.name} on {p.hosts} of {spec.hosts} hosts x {spec.gpus_per_host} "
          f"{spec.gpu_name} {spec.gpu_gb:g} GB (host {spec.host_gb:g} GB, /dev/shm "
          f"{spec.shm_gb:g} GB); nothing started")
    print(f"per GPU (each of {g.devices}): a process per role, GB")
    for role, e in (("policy engine", p.policy), ("GenRM engine", p.genrm)):
        print(f"  {role:14s} {e.model} TP/EP={e.devices}: share {e.share:g} = "
              f"{e.pool / GB:.1f} (weights bf16 {e.weights / GB:.1f}, KV {e.kv / GB:.1f} = "
              f"{e.kv_tokens:,} tokens a replica); max_model_len {e.max_model_len}, "
              f"max_num_seqs {e.max_num_seqs}")
    t = p.trainer
    print(f"  trainer rank   FSDP2 over {t.ranks}: params fp32 {t.params / GB:.1f}, grads "
          f"{t.grads / GB:.1f}, AdamW {t.optimizer / GB:.1f}, gathered bf16 blocks "
          f"{t.gathered / GB:.1f}, activations {t.rows} rows x {t.seq_len} tokens "
          f"{t.activations / GB:,.1f}; total {t.total / GB:,.1f}")
    print(f"  peak (engines at start, or training with engines asleep; 3 CUDA contexts): "
          f"{p.gpu_peak / GB:,.1f} of {spec.gpu_gb:g}")
    print(f"per host (each of {p.hosts}): GPS arenas in /dev/shm (fp32, "
          f"{'full copies' if p.gps_k == 1 else f'split over groups of {p.gps_k} hosts'}): "
          f"{max(p.gps_host) / GB:.1f}; offloaded trainer state + processes "
          f"{p.host_other / GB:.1f}")
    if p.refusals:
        print("refused:", file=sys.stderr)
        for r in p.refusals:
            print(f"  {r}", file=sys.stderr)
        return 2
    print("fits: every GPU, host and /dev/shm")
    return 0


if __name__ == "__main__":
    sys.exit(main())
