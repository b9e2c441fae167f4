"""Runs one PivotRL experiment from gin files: parse, build, run, close.

    python launchers/run.py --gin gin/qwen72b_122b.gin
    python launchers/run.py --gin gin/qwen7b_30b.gin --gin gin/deployments/disaggregated.gin \
        --gin_param SimDriver.seed=1

The driver is whatever ``run.driver`` binds (``@SimDriver`` in gin/base.gin). With no
--gin it runs a small sim config (gin/qwen7b_30b.gin with 3 steps); a later ``local``
driver (gin/tiny_cpu.gin) is meant to become that default. Results go to
``runs/<name>/`` (result.json, operative_config.gin) and to wandb (offline by default).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pivot.paths import REPO_ROOT as ROOT

from pivot.console import (init_wandb, log_no_gpu, progress_bar,
                              setup_logging)
from pivot.config import gin_setup
from pivot.errors import ConfigError

DEFAULT_GIN = ["gin/tiny_cpu.gin"]   # the local driver: real RL on this CPU
DEFAULT_PARAMS: list[str] = []


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gin", action="append", default=None,
                   help="gin file (repeatable; later files override). Default: a small sim "
                        "config, gin/qwen7b_30b.gin with SimDriver.steps = 3")
    p.add_argument("--gin_param", action="append", default=[],
                   help="a binding such as 'SimDriver.seed = 1' (repeatable)")
    p.add_argument("--run_dir", default=None, help="output folder (default runs/<name>)")
    p.add_argument("--no_progress", action="store_true")
    a = p.parse_args(argv)
    setup_logging()
    files = a.gin or DEFAULT_GIN
    params = a.gin_param if a.gin else DEFAULT_PARAMS + a.gin_param
    os.chdir(ROOT)
    try:
        gin_setup.parse(files, params)
        driver = gin_setup.build()
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import gin
    log_no_gpu(type(driver).__name__)
    name = a.run_dir or f"runs/{driver.group.name}_{driver.dep.name}_s{driver.seed}"
    run_dir = Path(name)
    run_dir.mkdir(parents=True, exist_ok=True)
    if hasattr(driver, "run_dir"):
        driver.run_dir = run_dir
    config = gin.operative_config_str()
    (run_dir / "operative_config.gin").write_text(config)
    wb = init_wandb(run_dir, name=run_dir.name, config_str=config)
    try:
        with progress_bar(driver.steps, disable=a.no_progress) as bar:
            result = driver.run(progress=bar)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if hasattr(driver, "close"):
            driver.close()
    out = result.to_dict(trace=True)
    (run_dir / "result.json").write_text(json.dumps(out, indent=1))
    summary = {k: out[k] for k in ("group", "deployment", "throughput", "step_time",
                                   "shifts", "events_per_s", "wall_s")}
    if wb is not None:
        wb.log({f"sim/run/{k}": v for k, v in summary.items() if isinstance(v, (int, float))})
        wb.finish()
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
