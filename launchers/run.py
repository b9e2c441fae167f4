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
    p.add_argument("--verbose", action="store_true",
                   help="every library's log on the console too (always in run.log)")
    a = p.parse_args(argv)
    console.setup_logging(verbose=a.verbose)
    files = a.gin or DEFAULT_GIN
    os.chdir(REPO_ROOT)
    origin = gin_setup.driver_origin(files, a.gin_param)
    try:
        gin_setup.parse(files, a.gin_param)
        driver = gin_setup.build()
    except ConfigError as e:
        print(f"error: {e}\n  (gin files: {' '.join(files)}; run.driver = {origin[0]} from "
              f"{origin[1]})", file=sys.stderr)
        return 2
    run_dir = Path(a.run_dir or f"runs/{driver.group.name}_{driver.dep.name}_s{driver.seed}")
    return console.run_and_report(driver, files, run_dir, verbose=a.verbose,
                                  progress=not a.no_progress, origin=origin)


if __name__ == "__main__":
    sys.exit(main())
