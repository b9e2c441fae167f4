"""Fig. 9's groups accumulate across invocations, later figures reuse fig. 9's runs only
when the bindings are the same, and the throughput window past the pipeline fill."""

import pytest

from experiments.fig9 import merge
from pivot.runners.sim_experiments import run_key, run_or_reuse
from pivot.sim.metrics import window_throughput

SETTINGS = {"seeds": 3, "steps": 5, "prompts": 512, "n": 16, "search_steps": 5,
            "no_search": False}


def _file(groups: list[str], tps: float, **settings) -> dict:
    runs = [{"group": g, "deployment": "pivotrl", "events": 10, "wall_s": 1.0} for g in groups]
    return {"settings": {**SETTINGS, **settings, "groups": groups}, "wall_s": 1.0,
            "search_wall_s": 0.5, "table": {g: {"pivotrl": tps} for g in groups},
            "searches": {f"{g}/pivotrl": {} for g in groups}, "runs": runs,
            "walls": {",".join(groups): {"wall_s": 1.0, "search_wall_s": 0.5}}}


def test_merge_keeps_other_groups_and_replaces_the_new_ones():
    old = _file(["qwen7b_30b", "qwen32b_30b"], 1.0)
    new = _file(["qwen1.5b_glm9b", "qwen32b_30b"], 2.0)
    out = merge(old, new)
    assert out["settings"]["groups"] == ["qwen1.5b_glm9b", "qwen7b_30b", "qwen32b_30b"]
    assert out["table"]["qwen7b_30b"]["pivotrl"] == 1.0
    assert out["table"]["qwen32b_30b"]["pivotrl"] == 2.0
    assert sorted(r["group"] for r in out["runs"]) == ["qwen1.5b_glm9b", "qwen32b_30b",
                                                        "qwen7b_30b"]
    assert out["wall_s"] == 2.0


def test_merge_with_other_settings_starts_afresh():
    out = merge(_file(["qwen7b_30b"], 1.0, search_steps=3), _file(["qwen32b_30b"], 2.0))
    assert list(out["table"]) == ["qwen32b_30b"]


def test_reuse_needs_the_same_bindings_in_any_order():
    done = {run_key("g", "pivotrl", ["a = 1", "b = 2"]): {"throughput": 5.0, "group": "g"}}
    jobs = [("g", "full", ("b = 2", "a = 1"), False)]   # full.gin is pivotrl.gin renamed
    (r,) = run_or_reuse(jobs, done)
    assert r["throughput"] == 5.0 and r["deployment"] == "full" and r["reused"]


def test_window_past_the_fill():
    steps = [[0, 0.0, 10.0], [1, 10.0, 12.0], [2, 12.0, 14.0], [3, 20.0, 30.0]]
    processed = [100, 100, 100, 100]
    assert window_throughput(processed, steps, 1) == pytest.approx(300 / 20)
    assert window_throughput(processed, steps, 3) == pytest.approx(100 / 16)
    with pytest.raises(ValueError):
        window_throughput(processed, steps, 4)
