"""Parses gin files strictly and builds the driver that ``run.driver`` names.

Parsing uses ``skip_unknown=False``: an unknown configurable or binding fails before any
work, with the file and binding in the message and the fix. This module is the top of the
package graph (docs/design.md, "Layering"): ``register`` imports every module whose classes
gin files may name, so only the entry points (``launchers/``, ``experiments/``,
``benchmarks/``, tests) import it, and the three runners under ``pivot/`` that the doc
lists as exceptions until they move above it.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import gin

from pivot.config.validation import build_required
from pivot.errors import ConfigError, PivotError

log = logging.getLogger(__name__)


def register() -> None:
    """Imports every module whose classes gin files may name."""
    import pivot.planner  # noqa: F401  (PivotPlanner, NoShiftPlanner, ...)
    import pivot.sim  # noqa: F401
    import pivot.spec.deployment  # noqa: F401  (Deployment)
    import pivot.spec.model_group  # noqa: F401  (ModelGroup, ModelProfile, ...)
    import pivot.cluster.driver  # noqa: F401  (ClusterDriver, ClusterGroup, PromptStream, LoopConfig)
    import pivot.cluster.model_groups  # noqa: F401  (cluster_group, cluster_stream)
    import pivot.cluster.memory_plan  # noqa: F401  (ClusterSpec: --dry_run)
    import pivot.runtime.backend  # noqa: F401  (Backend)
    import pivot.gps  # noqa: F401  (GPS settings: WriteLeaseConfig)
    import pivot.gps.hosts  # noqa: F401  (HostJob)
    import pivot.reliability.injectors  # noqa: F401  (forced_shift_planner)
    import pivot.reliability.cluster_checks  # noqa: F401  (ClusterChecker)


@gin.configurable("run")
def build_driver(driver=gin.REQUIRED):
    """``run.driver = @SimDriver`` (or a later ``@ClusterDriver``): the driver to build."""
    return driver()


def parse(gin_files: list[str], bindings: list[str]) -> None:
    """Parses files then ``--gin_param`` overrides; raises ConfigError naming the problem
    (and leaves no partial config behind: configurables built later in the same process,
    e.g. by tests, see none of a failed parse's bindings)."""
    register()
    gin.clear_config()
    for f in gin_files:
        if not Path(f).is_file():
            raise ConfigError(f"gin file {f} does not exist; pass one of gin/*.gin "
                              f"(e.g. gin/qwen7b_30b.gin)")
    try:
        gin.parse_config_files_and_bindings(gin_files, bindings, skip_unknown=False)
    except (ValueError, KeyError, ImportError, NameError, SyntaxError) as e:
        gin.clear_config()
        raise ConfigError(f"bad gin config in {', '.join(gin_files) or '(none)'} / bindings "
                          f"{bindings}: {e}. Fix the named binding (see gin/base.gin for "
                          f"the configurables and their parameters)") from None


def build() -> object:
    """Builds the driver, turning gin's wrapped errors into ConfigError with the binding."""
    try:
        return build_required(build_driver, "bind it in the model group's gin file (gin/base.gin "
                                            "binds the simulator's fitted constants)")
    except PivotError as e:
        raise ConfigError(f"{e}") from None
    except (ValueError, TypeError) as e:
        raise ConfigError(f"building the driver failed: {e}. Check the gin bindings it "
                          f"names") from None


_INCLUDE = re.compile(r"^\s*include\s+['\"](.+?)['\"]")
_DRIVER = re.compile(r"^\s*run\.driver\s*=\s*(\S+)")


def driver_origin(gin_files: list[str], bindings: list[str]) -> tuple[str, str]:
    """Where ``run.driver`` was bound: ``(value, source)`` of the binding that wins (the
    last one, following ``include`` in place, then ``--gin_param``), for the console line
    that says which driver runs and why. ``("?", "nowhere")`` if none."""
    found = ("?", "nowhere")

    def walk(path: str, seen: tuple[str, ...]) -> None:
        nonlocal found
        if path in seen or not Path(path).is_file():
            return
        for line in Path(path).read_text().splitlines():
            line = line.split("#", 1)[0]
            if m := _INCLUDE.match(line):
                walk(m.group(1), seen + (path,))
            elif m := _DRIVER.match(line):
                found = (m.group(1), path)

    for f in gin_files:
        walk(f, ())
    for b in bindings:
        if m := _DRIVER.match(b):
            found = (m.group(1), "--gin_param")
    return found
