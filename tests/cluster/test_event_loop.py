"""The RL loop's event loop never blocks on a slot call, and a real local run's console is
the few lines, the bar and the summary (on the session's shared ``ClusterStack``)."""

from __future__ import annotations

import asyncio
import json
import re
import warnings

import pytest

from pivot import console
from pivot.cluster.config import PlannerCosts, RunConfig
from pivot.cluster.driver import ClusterDriver
from pivot.gin_files import configured, configured_deployment
from pivot.rl.data import PromptStream
from pivot.rl.loop import LoopConfig

pytestmark = [pytest.mark.engine, pytest.mark.monarch]

BLOCKING = re.compile(r"event loop")
"""Monarch's warning for a blocking ``Future.get()`` on a running asyncio loop."""

CONSOLE_LINES = 18
"""What a local run prints besides the progress bar: driver, config, models, run folder,
the summary header and its 12 rows, and a line to spare (a warning of ours)."""


def driver(stack, run_dir, steps=3, eval_every=0):
    return ClusterDriver(stack.group, configured_deployment("pivotrl"),
                         PromptStream(prompts_per_step=2, num_val=4), LoopConfig(),
                         run_config=RunConfig(steps=steps, run_dir=str(run_dir),
                                              eval_every=eval_every),
                         costs=configured(PlannerCosts), stack=stack)


def test_no_blocking_monarch_call_on_the_rl_event_loop(stack, tmp_path):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")

        async def blocking():   # the recorder sees Monarch's warning at all
            stack.ctl.describe(0)
        asyncio.run(blocking())
        assert any(BLOCKING.search(str(w.message)) for w in seen), \
            "Monarch's blocking-get warning is not recorded; the check below means nothing"
        seen.clear()
        d = driver(stack, tmp_path)   # validation, checkpoints, publishes, shifts included
        try:
            res = d.run()
        finally:
            d.close()
    assert res.shifts and len(res.steps) == 3
    bad = [w for w in seen if BLOCKING.search(str(w.message))]
    assert not bad, (f"{len(bad)} blocking Monarch calls on the RL loop's event loop, "
                     f"e.g. {bad[0].filename}:{bad[0].lineno}")


def test_local_run_console_is_short_and_bar_agrees_with_summary(stack, tmp_path, capfd):
    run_dir = tmp_path / "run"
    rc = console.run_and_report(driver(stack, run_dir), ["gin/tiny_cpu.gin"], run_dir)
    assert rc == 0
    text = capfd.readouterr()
    shown = (text.out + text.err).replace("\r", "\n").splitlines()
    bar = [s for s in shown if s.startswith("RL steps")]
    lines = [s for s in shown if s.strip() and not s.startswith("RL steps")]
    assert len(lines) <= CONSOLE_LINES, "\n".join(lines)
    out = json.loads((run_dir / "result.json").read_text())
    tp = f"{out['throughput']:,.0f}"
    assert f"{tp} tok/s" in bar[-1], (tp, bar[-1])   # the bar's last reading
    assert any(s.strip().startswith("throughput (tok/s") and s.endswith(tp) for s in lines)
    assert (run_dir / "run.log").read_text().strip()
