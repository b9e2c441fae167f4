"""Launcher helpers: logging, the no-GPU notice, tqdm progress, offline wandb."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

log = logging.getLogger("pivot.launch")


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("pivot.shifting").setLevel(logging.WARNING)


def log_no_gpu(driver: str) -> None:
    """Says plainly which driver runs when the machine has no GPU."""
    try:
        import torch
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        gpus = 0
    if gpus == 0 and driver == "LocalDriver":
        log.info("no GPUs on this machine: running the `local` driver, real engines on "
                 "the CPU (Monarch procs stand in for devices)")
    elif gpus == 0:
        log.info("no GPUs on this machine: running the `sim` driver (%s), a discrete-event "
                 "simulation of the cluster in virtual time", driver)
    else:
        log.info("%d GPUs found; running driver %s", gpus, driver)


@contextlib.contextmanager
def progress_bar(steps: int, disable: bool = False):
    """A tqdm bar over RL steps showing simulated time; yields the driver's callback."""
    from tqdm import tqdm
    bar = tqdm(total=steps, unit="step", desc="RL steps", disable=disable)

    def update(version: int, now: float, postfix: str | None = None) -> None:
        bar.n = version
        bar.set_postfix_str(postfix or f"sim {now:,.0f} s")
        bar.refresh()
    try:
        yield update
    finally:
        bar.close()


def init_wandb(run_dir: Path, name: str, config_str: str, group: str | None = None):
    """An offline wandb run (respects an existing WANDB_MODE); None if wandb fails."""
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    try:
        import wandb
        run = wandb.init(project="pivotrl-sim", name=name, group=group, dir=str(run_dir),
                         config={"gin": config_str}, reinit="finish_previous")
        return run
    except Exception as e:  # noqa: BLE001 - wandb is optional for a run's results
        log.warning("wandb disabled: %s", e)
        return None
