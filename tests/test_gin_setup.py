"""Which driver a set of gin files runs, and why."""

from __future__ import annotations

from pathlib import Path

from pivot.gin_setup import driver_origin
from pivot.console import driver_line
from pivot.cluster.group import ClusterGroup
from pivot.runtime.backend import Backend


def test_the_binding_that_wins_is_found_through_includes_and_overrides(tmp_path):
    base = tmp_path / "base.gin"
    base.write_text("run.driver = @SimDriver  # the simulator\n")
    group = tmp_path / "group.gin"
    group.write_text(f"include '{base}'\nModelGroup.devices = 8\n")
    real = tmp_path / "real.gin"
    real.write_text("# run.driver = @Nothing\nrun.driver = @ClusterDriver\n")
    assert driver_origin([str(group)], []) == ("@SimDriver", str(base))
    assert driver_origin([str(group), str(real)], []) == ("@ClusterDriver", str(real))
    assert driver_origin([str(group)], ["run.driver = @ClusterDriver"]) == (
        "@ClusterDriver", "--gin_param")
    assert driver_origin([str(tmp_path / "none.gin")], []) == ("?", "nowhere")


def test_the_repository_files_say_which_driver_they_run():
    assert driver_origin(["gin/qwen7b_30b.gin"], []) == ("@SimDriver", "gin/base.gin")
    assert driver_origin(["gin/tiny_cpu.gin"], []) == ("@ClusterDriver", "gin/tiny_cpu.gin")
    assert driver_origin(["gin/qwen7b_30b.gin", "gin/backends/cuda.gin"], []) == (
        "@ClusterDriver", "gin/backends/cuda.gin")


class _Driver:
    def __init__(self, group):
        self.group = group


def test_the_console_line_names_driver_backend_and_origin():
    sim = driver_line(_Driver(object()), ("@SimDriver", "gin/base.gin"))
    assert sim.startswith("driver: sim") and "gin/base.gin" in sim
    local = driver_line(_Driver(ClusterGroup(random_if_missing=True, backend=Backend("cpu"))),
                        ("@ClusterDriver", "gin/tiny_cpu.gin"))
    assert local.startswith("driver: local on the cpu backend") and "4 CPU slots" in local


def test_every_deployment_file_parses_over_the_default():
    """Each gin/deployments/*.gin is included after gin/tiny_cpu.gin (run.py's and the
    README's use); the tuned PivotRL file binds the three settings it measured with."""
    import gin

    from pivot import gin_setup
    from pivot.spec.deployment import Deployment

    root = Path(__file__).resolve().parents[1]
    try:
        for f in sorted((root / "gin/deployments").glob("*.gin")):
            gin_setup.parse([str(root / "gin/tiny_cpu.gin"), str(f)], [])
        gin_setup.parse([str(root / "gin/tiny_cpu.gin"),
                         str(root / "gin/deployments/pivotrl_train2.gin")], [])
        d = Deployment()
        assert (d.name, d.training_devices, d.training_home) == ("pivotrl_train2", 2, False)
        assert gin.query_parameter("PivotPlanner.min_replicas") == 0
        assert gin.query_parameter("PivotPlanner.scheduler_rule") is True
    finally:
        gin.clear_config()


def test_a_fitted_constant_left_unbound_is_a_config_error_naming_it(tmp_path, monkeypatch):
    """``TrainingProfile.update_mfu`` has no default (a fit, gin/base.gin binds it): a group
    whose files leave it out fails to build with a ConfigError naming the binding, not
    gin's RuntimeError."""
    import pytest

    from pivot import gin_setup
    from pivot.errors import ConfigError
    from pivot.paths import REPO_ROOT

    monkeypatch.chdir(REPO_ROOT)
    base = tmp_path / "base.gin"
    base.write_text("".join(line for line in (REPO_ROOT / "gin/base.gin").read_text()
                            .splitlines(keepends=True)
                            if not line.startswith("TrainingProfile.update_mfu")))
    group = tmp_path / "group.gin"
    group.write_text((REPO_ROOT / "gin/qwen7b_30b.gin").read_text()
                     .replace("include 'gin/base.gin'", f"include '{base}'"))
    gin_setup.parse([str(group)], [])
    with pytest.raises(ConfigError, match=r"TrainingProfile\.update_mfu: required"):
        gin_setup.build()
