"""Bad gin fails before the run with a message naming the file, binding and fix."""

import subprocess
import sys
from pathlib import Path

import pytest

from pivot import gin_setup
from pivot.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def cwd(monkeypatch):
    monkeypatch.chdir(ROOT)


def test_unknown_model_group_file():
    with pytest.raises(ConfigError, match="gin/qwen999b.gin does not exist"):
        gin_setup.parse(["gin/qwen999b.gin"], [])


def test_unknown_binding_names_it():
    with pytest.raises(ConfigError, match="SimDriver.stepz"):
        gin_setup.parse(["gin/qwen7b_30b.gin"], ["SimDriver.stepz = 3"])


def test_tp_that_does_not_divide_the_cluster():
    gin_setup.parse(["gin/qwen7b_30b.gin"], ["genrm/ModelProfile.devices = 3"])
    with pytest.raises(ConfigError, match="does not divide ModelGroup.devices"):
        gin_setup.build()


def test_more_training_devices_than_the_cluster():
    gin_setup.parse(["gin/qwen7b_30b.gin"], ["TrainingProfile.devices = 64"])
    with pytest.raises(ConfigError, match="TrainingProfile.devices=64 exceeds"):
        gin_setup.build()


@pytest.mark.parametrize("name", ["qwen1.5b_glm9b", "qwen7b_30b", "qwen32b_30b",
                                  "qwen72b_122b"])
def test_every_group_builds(name):
    gin_setup.parse([f"gin/{name}.gin"], [])
    d = gin_setup.build()
    assert d.group.name == name


def test_run_py_reports_bad_binding_without_running():
    p = subprocess.run([sys.executable, "launchers/run.py", "--gin", "gin/qwen7b_30b.gin",
                        "--gin_param", "Nope.x = 1"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and "Nope" in p.stderr
