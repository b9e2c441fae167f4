"""The wandb sweep file parses, has wandb's grid-sweep shape, and equals sweep.py's grid."""

import itertools
from pathlib import Path

import yaml

from launchers import sweep

ROOT = Path(__file__).resolve().parents[2]


def test_sweep_file_is_a_wandb_grid_equal_to_sweep_py():
    cfg = yaml.safe_load((ROOT / "sweeps/h_strategy.yaml").read_text())
    assert cfg["method"] == "grid"
    assert (ROOT / cfg["program"]).is_file()
    assert "${args}" in cfg["command"] and "${program}" in cfg["command"]
    params = {k: v["values"] for k, v in cfg["parameters"].items()}
    assert params == sweep.GRID
    keys = list(params)
    grid = [dict(zip(keys, v)) for v in itertools.product(*params.values())]
    assert grid == sweep.points()


def test_a_point_binds_h_only_for_planners_that_take_it():
    b = sweep.bindings({"group": "qwen7b_30b", "strategy": "full", "H": 5}, 8, 3)
    assert "PivotPlanner.H = 5.0" in b
    b = sweep.bindings({"group": "qwen7b_30b", "strategy": "static", "H": 5}, 8, 3)
    assert not any("PivotPlanner.H" in x for x in b)
