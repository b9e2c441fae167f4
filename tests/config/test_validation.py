"""Configured values are checked at construction with one shared helper
(``pivot.config.validation``): the error names the gin binding, the value and the valid
range, before any engine starts; and each setting has one default, in the class it
configures (layers that forward it take it from there)."""

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import gin
import pytest

from pivot import gin_setup
from pivot.config.validation import check, check_bool, check_range, check_text, default_of
from pivot.errors import ConfigError
from pivot.runners.bad_input import CASES, CLEAR, run_case

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _in_repo_root():
    old = os.getcwd()
    os.chdir(ROOT)
    yield
    os.chdir(old)
    gin.clear_config()


# ---------------------------------------------------------------- the helpers
@pytest.mark.parametrize("value, kw, message", [
    (3.0, dict(lo=0, hi=2), r"X\.y=3\.0: must be a number in \[0, 2\]"),
    (0, dict(lo=0, open_lo=True), r"X\.y=0: must be a number > 0"),
    (1.0, dict(lo=0, hi=1, open_hi=True), r"X\.y=1\.0: must be a number in \[0, 1\)"),
    (1.5, dict(lo=1, integer=True), r"X\.y=1\.5: must be an integer >= 1"),
    (True, dict(lo=0, integer=True), r"X\.y=True: must be an integer"),
    ("3", dict(lo=0), r"X\.y='3': must be a number >= 0"),
    (float("nan"), dict(lo=0), r"X\.y=nan"),
    (float("inf"), dict(lo=0), r"X\.y=inf"),
    (None, dict(lo=1), r"X\.y=None: must be a number >= 1"),
    (-1, dict(lo=0, why="what it is"), r"X\.y=-1: must be a number >= 0 \(what it is\)"),
])
def test_check_range_names_binding_value_and_range(value, kw, message):
    with pytest.raises(ConfigError, match=message):
        check_range("X.y", value, **kw)


def test_valid_values_pass():
    check_range("X.y", 2, 0, 2)
    check_range("X.y", 1, 0, 2, integer=True)
    check_range("X.y", None, 1, optional=True)
    check_range("X.y", 5, 1)
    check_bool("X.b", False)
    check_text("X.s", "name")
    check_text("X.s", None, optional=True)
    check(True, "X.z", 0, "never raised")


def test_bool_text_and_custom_checks():
    with pytest.raises(ConfigError, match=r"X\.b='yes': must be True or False"):
        check_bool("X.b", "yes")
    with pytest.raises(ConfigError, match=r"X\.s='': must be a non-empty string"):
        check_text("X.s", "")
    with pytest.raises(ConfigError, match=r"X\.z=\(1, 2\): need this"):
        check(False, "X.z", (1, 2), "need this")


def test_default_of_reads_signatures_of_classes_dataclasses_and_gin_wrappers():
    from pivot.cluster.config import OptimizerConfig
    from pivot.cluster.driver import ClusterDriver
    from pivot.planner import PivotPlanner
    from pivot.runners.soak import SoakConfig
    assert default_of(OptimizerConfig, "lr") == 1e-4
    assert default_of(PivotPlanner, "H") == 60.0
    assert default_of(SoakConfig, "kill_rate") == SoakConfig.kill_rate
    with pytest.raises(TypeError, match="no default for 'group'"):
        default_of(ClusterDriver, "group")


# ---------------------------------------------------------------- the configurables
GIN_CASES = [c for c in CASES if c.expected == CLEAR and c.category in (
    "sim", "local", "planner", "soak", "resources")]


@pytest.mark.parametrize("case", GIN_CASES, ids=[c.name for c in GIN_CASES])
def test_each_bad_value_fails_at_construction_naming_its_binding(case):
    out = run_case(case)
    assert out.ended == CLEAR, out.detail
    # "<Configurable>.<field>=<value>" (or the scoped / composite name), as gin spells it
    assert re.search(r"\b[A-Za-z_]+\.[A-Za-z_]+[^=]*=", out.detail), out.detail


def test_the_table_holds_a_case_for_every_validated_configurable():
    names = " ".join(c.name for c in GIN_CASES)
    details = " ".join(run_case(c).detail for c in GIN_CASES)
    for configurable in ("ModelGroup", "Deployment", "SimDriver", "ModelProfile", "StandIn",
                         "Architecture", "TrainingProfile", "ShiftCost", "LengthModel",
                         "PivotPlanner", "RuleBasedPlanner", "StaticPlanner",
                         "forced_shift_planner", "ClusterDriver", "ClusterGroup",
                         "RunConfig", "PlannerCosts", "OptimizerConfig", "FaultBudget",
                         "CpuConfig",
                         "PromptStream", "LoopConfig", "ClusterChecker", "SoakConfig"):
        assert f"{configurable}." in details, (configurable, names)


CROSS_CHECKS = """
import os, re, sys
from pivot import gin_setup
from pivot.errors import ConfigError
cores = float(os.cpu_count() or 1)
for param, pattern in ((f"CpuConfig.share = {cores}",
                        rf"CpuConfig.share={cores}: 4 slots \\(ClusterGroup.devices\\) x"),
                       ("PivotPlanner.min_replicas = 9",
                        r"PivotPlanner.min_replicas=9: must be an integer in \\[0, 3\\]")):
    gin_setup.parse(["gin/tiny_cpu.gin"], [param])
    try:
        gin_setup.build()
    except ConfigError as e:
        assert re.search(pattern, str(e)), str(e)
    else:
        raise AssertionError(f"{param} was accepted")
assert "vllm" not in sys.modules, "an engine module was imported before the checks"
print("ok")
"""


def test_local_cross_checks_fail_before_any_engine_module_loads():
    # a fresh interpreter: earlier tests in this session may have imported vllm
    out = subprocess.run([sys.executable, "-c", CROSS_CHECKS], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_run_py_exits_2_with_the_binding_before_engines_start():
    share = float((os.cpu_count() or 1) + 1)
    out = subprocess.run([sys.executable, "launchers/run.py", "--gin", "gin/tiny_cpu.gin",
                          "--gin_param", f"CpuConfig.share = {share}", "--no_progress"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"CpuConfig.share={share}: must be a number in [0, " in out.stderr
    assert "Traceback" not in out.stderr and "engines up" not in out.stderr


# ---------------------------------------------------------------- one default per setting
def test_forwarding_layers_keep_no_default_of_their_own():
    from pivot.roles.engine.slot_context import GeneratorFactory
    from pivot.roles.trainer_context import SlotTrainerContext
    from pivot.cluster.stack import ClusterStack
    from pivot.rl.staleness import StalenessBound
    from pivot.roles.trainer import Trainer

    def has_default(cls, name):
        p = inspect.signature(cls).parameters[name]
        return p.default is not inspect.Parameter.empty

    for cls, names in ((ClusterStack, ("seed", "lr", "cpu_share")),
                       (SlotTrainerContext, ("lr", "max_seq_len", "seed")),
                       (GeneratorFactory, ("cores",)), (StalenessBound, ("staleness",)),
                       (Trainer.Optimizer, ("lr",))):
        for n in names:
            assert not has_default(cls, n), f"{cls.__name__}.{n} keeps its own default"


def test_the_local_learning_rate_default_is_the_bound_one():
    from pivot.cluster.config import OptimizerConfig
    gin_setup.parse(["gin/tiny_cpu.gin"], [])
    d = gin_setup.build()
    assert d.lr == d.optimizer.lr == default_of(OptimizerConfig, "lr") == 1e-4


def test_the_ablation_planners_take_pivot_planners_H_binding():
    from pivot.planner import PivotPlanner, ThroughputModelPlanner, VanillaPlanner
    from pivot.scheduler import ThroughputModel
    m = ThroughputModel(1e-6, 1e-2, 1e-4, 0.0)
    gin.parse_config(["PivotPlanner.H = 120.0"])
    for cls in (PivotPlanner, ThroughputModelPlanner, VanillaPlanner):
        assert cls(m, m).H == 120.0, cls.__name__


def test_forced_shift_factory_takes_the_planners_defaults():
    from pivot.reliability.injectors import ForcedShiftPlanner, forced_shift_planner
    for n in ("min_replicas", "donate_p", "feasible_only"):
        assert default_of(forced_shift_planner, n) == default_of(ForcedShiftPlanner, n)


def test_a_model_groups_host_size_reaches_its_shift_costs():
    gin_setup.parse(["gin/qwen7b_30b.gin"], ["ModelGroup.devices_per_host = 4"])
    d = gin_setup.build()
    assert d.group.shift_cost.devices_per_host == 4
    with pytest.raises(ConfigError, match="ShiftCost.*devices_per_host"):
        gin_setup.parse(["gin/qwen7b_30b.gin"], ["ShiftCost.devices_per_host = 4"])
