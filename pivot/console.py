"""What a user sees when a launcher runs: a few lines, a progress bar, a summary table.

Everything else (vLLM's and Monarch's logs from every device slot, library warnings, the
control plane's per-shift lines) goes to ``run.log`` in the run folder. Without
``--verbose`` the launcher's process points its file descriptors 1 and 2 at that file, so
whatever any library or child process (a slot proc inherits them) writes lands there; the
console keeps a duplicate of the terminal's descriptor for the lines below. With
``--verbose`` nothing is redirected and every log goes to the terminal as well.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

log = logging.getLogger("pivot.launch")

CONSOLE_INFO = ("pivot.launch", "pivot.cluster.group", "pivot.cluster.stack",
                "pivot.cluster.driver", "pivot.models.build")
"""Loggers whose INFO lines reach the console (which driver, the model build, engine
start-up, where the run folder is); other loggers reach it from WARNING on, and only
``pivot``'s: a library's warnings go to run.log."""

LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s: %(message)s"


class _ConsoleFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name
        if record.levelno >= logging.WARNING:
            return name == "pivot" or name.startswith("pivot.") or name == "root"
        return any(name == p or name.startswith(p + ".") for p in CONSOLE_INFO)


def setup_logging(verbose: bool = False, stream: TextIO | None = None) -> None:
    """Root logging for a launcher: the console lines above, or everything with
    ``verbose``. Replaces handlers an earlier call installed."""
    root = logging.getLogger()
    for h in [h for h in root.handlers if getattr(h, "_pivot", False)]:
        root.removeHandler(h)
    h = logging.StreamHandler(stream or sys.stderr)
    h._pivot = True  # type: ignore[attr-defined]
    if verbose:
        h.setFormatter(logging.Formatter(LOG_FORMAT))
    else:
        h.setFormatter(logging.Formatter("%(message)s"))
        h.addFilter(_ConsoleFilter())
    root.addHandler(h)
    root.setLevel(logging.INFO)


@dataclass
class Console:
    """The terminal while a run's output is redirected (``session``)."""

    out: TextIO
    log_path: Path | None = None
    verbose: bool = False
    _saved: list[int] = field(default_factory=list)

    def line(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)


@contextlib.contextmanager
def session(run_dir: Path, verbose: bool = False) -> Iterator[Console]:
    """Sends fds 1 and 2 (and Python's logging) to ``run_dir/run.log`` for the block,
    unless ``verbose``; yields the console. Restores both descriptors on exit, even on
    an error, so a traceback after the block reaches the terminal."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "run.log"
    file_handler = logging.FileHandler(path)
    file_handler.setFormatter(logging.Formatter(LOG_FORMAT))
    file_handler._pivot_file = True  # type: ignore[attr-defined]
    root = logging.getLogger()
    root.addHandler(file_handler)
    if verbose:
        try:
            yield Console(sys.stdout, path, verbose=True)
        finally:
            root.removeHandler(file_handler)
            file_handler.close()
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    terminal = os.fdopen(os.dup(saved[0]), "w", buffering=1)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    streams = sys.stdout, sys.stderr
    # Python's own streams write to the redirected descriptors too (they may have been
    # replaced, e.g. by a test runner's capture)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    setup_logging(verbose=False, stream=terminal)
    try:
        yield Console(terminal, path, verbose=False, _saved=saved)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = streams
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for s in saved:
            os.close(s)
        setup_logging(verbose=False)
        root.removeHandler(file_handler)
        file_handler.close()
        terminal.close()


def driver_line(driver: Any, origin: tuple[str, str] | None = None) -> str:
    """Which driver runs, on what, and why (the binding that chose it)."""
    why = f" ({origin[0]} from {origin[1]})" if origin else ""
    backend = getattr(getattr(driver, "group", None), "backend", None)
    if backend is None:
        return (f"driver: sim, a discrete-event simulation of the cluster in virtual "
                f"time{why}; real engines: add --gin gin/backends/cuda.gin")
    where = ("GPU slots" if backend.kind == "cuda" else
             "CPU slots capped by cgroup quotas (Monarch procs stand in for devices)")
    return (f"driver: local on the {backend.kind} backend, real engines and trainer on "
            f"{driver.group.devices} {where} over {backend.hosts} host(s){why}")


@contextlib.contextmanager
def progress_bar(steps: int, disable: bool = False, file: TextIO | None = None):
    """A tqdm bar over RL steps; yields the driver's callback ``(version, now, postfix)``
    (without a postfix it shows the simulated time)."""
    from tqdm import tqdm
    bar = tqdm(total=steps, unit="step", desc="RL steps", disable=disable,
               file=file or sys.stderr, dynamic_ncols=True)

    def update(version: int, now: float, postfix: str | None = None) -> None:
        bar.n = version
        bar.set_postfix_str(postfix or f"sim {now:,.0f} s")
        bar.refresh()
    try:
        yield update
    finally:
        bar.close()


def table(rows: Sequence[tuple[str, Any]]) -> str:
    """Two aligned columns, numbers with thousands separators."""
    def fmt(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
        if isinstance(v, int):
            return f"{v:,}"
        return str(v)
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {fmt(v)}" for k, v in rows)


def summary_rows(out: dict[str, Any], run_dir: Path) -> list[tuple[str, Any]]:
    """The end-of-run summary of a run's ``result.json`` (local or sim)."""
    rows: list[tuple[str, Any]] = [("model group", out.get("group")),
                                   ("deployment", out.get("deployment"))]
    steps = out.get("steps")
    if isinstance(steps, list):   # the cluster driver: real steps
        rows += [("steps", len(steps)),
                 ("throughput (tok/s, steps 2..N)", out.get("throughput")),
                 ("throughput incl. pipeline fill", out.get("throughput_run"))]
        if steps:
            rows += [("reward, first -> last step",
                      f"{steps[0]['reward/mean']:.3f} -> {steps[-1]['reward/mean']:.3f}")]
            acc = steps[-1].get("val/accuracy_at_1")
            if acc is not None:
                rows.append(("validation accuracy@1", f"{acc:.3f}"))
        for kind in ("response", "judgement"):
            q = (out.get("lengths") or {}).get(kind, {}).get("end")
            if q:
                rows.append((f"{kind} tokens p50 / p99 / max",
                             f"{q['p50']:.0f} / {q['p99']:.0f} / {q['max']:.0f}"))
        rows += [("shifts", out.get("shifts")), ("start-up (s)", out.get("startup_s"))]
        failed = out.get("failed_shifts") or []
        if failed:   # the run went on past them (ClusterControl._survive)
            lost = sorted({d for f in failed for d in f["lost"]} -
                          {d for f in failed for d in f["restored"]})
            rows.append(("failed shifts (devices still lost)", f"{len(failed)} ({lost})"))
        deaths = out.get("slot_deaths") or []
        if deaths:   # the run went on past them (pivot.cluster.faults)
            devs = sorted({d for x in deaths for d in x["devices"]})
            rows.append(("slot processes died (replaced)",
                         f"{len(deaths)} (slots {devs}, "
                         f"{sum(x['requeued'] for x in deaths)} sequences requeued)"))
    else:
        rows += [("throughput (tok/s)", out.get("throughput")),
                 ("step time (simulated s)", out.get("step_time")),
                 ("shifts", out.get("shifts")), ("events/s", out.get("events_per_s"))]
    rows += [("wall time (s)", out.get("wall_s")), ("run folder", str(run_dir))]
    return rows


def run_and_report(driver: Any, files: Sequence[str], run_dir: Path, verbose: bool = False,
                   progress: bool = True, origin: tuple[str, str] | None = None) -> int:
    """Runs a built driver inside a console ``session``: the lines that matter, a progress
    bar, result.json, operative_config.gin, wandb, and the summary table. Returns the exit
    code (2 for a ConfigError raised by the run)."""
    import json

    import gin

    from pivot.errors import ConfigError

    with session(run_dir, verbose=verbose) as con:
        con.line(driver_line(driver, origin))
        backend = getattr(getattr(driver, "group", None), "backend", None)
        if backend is not None and backend.warning:
            con.line(backend.warning)
        con.line(f"config: {' '.join(files)}; model group {driver.group.name}, deployment "
                 f"{driver.dep.name}, {driver.steps} steps, seed {driver.seed}")
        models = [f"{k} {getattr(driver.group, k + '_dir')}" for k in ("policy", "genrm")
                  if hasattr(driver.group, k + "_dir")]
        if models:
            con.line(f"models: {', '.join(models)}")
        con.line(f"run folder: {run_dir} (logs: {run_dir / 'run.log'})")
        if hasattr(driver, "run_dir"):
            driver.run_dir = run_dir
        config = gin.operative_config_str()
        (run_dir / "operative_config.gin").write_text(config)
        wb = init_wandb(run_dir, name=run_dir.name, config_str=config)
        try:
            if hasattr(driver, "prepare"):
                driver.prepare()
            with progress_bar(driver.steps, disable=not progress, file=con.out) as bar:
                result = driver.run(progress=bar)
        except ConfigError as e:
            con.line(f"error: {e}")
            return 2
        finally:
            if hasattr(driver, "close"):
                driver.close()
        out = result.to_dict(trace=True)
        (run_dir / "result.json").write_text(json.dumps(out, indent=1))
        if wb is not None:
            keys = ("throughput", "step_time", "shifts", "events_per_s", "wall_s")
            wb.log({f"run/{k}": out[k] for k in keys if isinstance(out.get(k), (int, float))})
            wb.finish()
        con.line("summary:")
        con.line(table(summary_rows(out, run_dir)))
    return 0


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
