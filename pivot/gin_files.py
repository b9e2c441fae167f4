"""The repository's gin files as values: a deployment's file by name, a static split as
bindings, and the ``Deployment`` that a model group's files, a deployment's file and
bindings configure (sec. 8.2, 8.4).

Each deployment or strategy of the paper is one file under ``gin/deployments/``; a static
split (app. E searches each baseline's) is bindings on ``disaggregated.gin`` or
``rr_colocated.gin``, never a file or a name of its own::

    dep = configured_deployment("disaggregated", bindings=split_bindings((1, 2, 1)))
    ClusterDriver(group, dep, costs=configured(PlannerCosts), ...)   # or launchers/run.py

Like ``pivot.gin_setup`` (which it uses to parse) this is the top of the package graph:
entry points and tests import it, the product's modules do not.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Sequence
from pathlib import Path

import gin

from pivot import gin_setup
from pivot.errors import ConfigError
from pivot.paths import REPO_ROOT
from pivot.spec.deployment import Deployment

DEPLOYMENTS = Path("gin/deployments")
"""Where the deployment files are, relative to the repository root."""
DEFAULT_GROUP = ("gin/tiny_cpu.gin",)
"""The embedded default model group (the cluster driver on this CPU)."""

Split = tuple[int | None, int | None, int]
"""(rollout, reward, training) devices of a static split; rollout and reward None where
they take turns on one pool (rollout-reward colocated)."""


def deployment_file(name: str) -> str:
    """The gin file ``name`` stands for: a path as given if it names a file, else the bare
    stem ``X`` as ``gin/deployments/X.gin`` (a file lookup, no name parsing)."""
    if name.endswith(".gin"):
        if not (Path(name).is_file() or (REPO_ROOT / name).is_file()):
            raise ConfigError(f"deployment file {name} does not exist")
        return name
    f = DEPLOYMENTS / f"{name}.gin"
    if not (REPO_ROOT / f).is_file():
        known = sorted(p.stem for p in (REPO_ROOT / DEPLOYMENTS).glob("*.gin"))
        raise ConfigError(f"deployment {name!r}: no {f}; use one of {known} or a gin file "
                          f"path (a split is bindings: --splits, or split_bindings)")
    return str(f)


def takes_split(dep: Deployment) -> str | None:
    """What static split a deployment takes: ``"full"`` (rollout, reward and training
    devices: disaggregated and the strategies that start from its split), ``"training"``
    (rollout and reward take turns on the rest: rollout-reward colocated), or None
    (training shifts or holds every device: colocated, PivotRL)."""
    if not dep.training_home or dep.training_devices == -1:
        return None
    return "training" if dep.rollout_devices == -1 else "full"


def all_splits(devices: int) -> list[tuple[int, int, int]]:
    """Every static split of ``devices`` slots with each role on >= 1 slot, as
    (rollout, reward, training), fewest training slots first (app. E's search space)."""
    return [(r, devices - t - r, t) for t in range(1, devices - 1)
            for r in range(1, devices - t)]


def split_of(kind: str, split: tuple[int, int, int]) -> Split:
    """``split`` as a deployment of ``kind`` (``takes_split``) takes it."""
    r, w, t = split
    return (r, w, t) if kind == "full" else (None, None, t)


def split_bindings(split: Split) -> list[str]:
    """The ``Deployment`` bindings of a split (``Split``)."""
    r, w, t = split
    out = [] if r is None else [f"Deployment.rollout_devices = {r}",
                                f"Deployment.reward_devices = {w}"]
    return out + [f"Deployment.training_devices = {t}"]


def split_label(name: str, split: Split | None) -> str:
    """A result row's label: the deployment's name, then its split if it was given one
    (``disaggregated_1_2_1``, ``rr_colocated_2``)."""
    if split is None:
        return name
    r, w, t = split
    return f"{name}_{t}" if r is None else f"{name}_{r}_{w}_{t}"


def _bound_planner(planner):
    """``planner`` with the gin bindings it has now, so it builds the same after the
    config is cleared. A planner that takes another configurable's bindings when built
    (``ThroughputModelPlanner`` takes ``PivotPlanner``'s through its ``__init__``) cannot
    carry them: refused while such bindings exist."""
    own = gin.get_bindings(planner)
    for base in getattr(planner, "__mro__", ())[1:]:
        inherited = {k: v for k, v in gin.get_bindings(base).items()
                     if k not in inspect.signature(planner).parameters} \
            if _registered(base) else {}
        if inherited:
            raise ConfigError(
                f"{planner.__name__} takes {base.__name__}'s bindings {sorted(inherited)} "
                f"when it is built, which a Deployment value cannot carry: build the "
                f"driver under these gin files (pivot.gin_setup.parse, then build) instead")
    return functools.partial(planner, **own) if own else planner


def _registered(cls) -> bool:
    try:
        gin.get_bindings(cls)
    except ValueError:
        return False
    return True


def configured_deployment(deployment: str, group: Sequence[str] = DEFAULT_GROUP,
                          bindings: Sequence[str] = (), carry_planner: bool = True
                          ) -> Deployment:
    """The ``Deployment`` that ``group``'s files, then ``deployment``'s file
    (``deployment_file``), then ``bindings`` configure, with its planner's bindings of
    those files carried along (``_bound_planner``; ``carry_planner`` False: the planner as
    the file names it, for reading the other fields). Leaves no gin config behind."""
    files = [*group, deployment_file(deployment)]
    gin_setup.parse(files, list(bindings))
    try:
        dep = Deployment()
        if carry_planner:
            dep = dataclasses.replace(dep, planner=_bound_planner(dep.planner))
        return dep
    finally:
        gin.clear_config()


def configured(configurable, files: Sequence[str] = DEFAULT_GROUP,
               bindings: Sequence[str] = ()):
    """``configurable()`` as ``files`` and ``bindings`` configure it, e.g.
    ``configured(PlannerCosts)``: gin/tiny_cpu.gin's decode-latency fits. Leaves no gin
    config behind."""
    gin_setup.parse(list(files), list(bindings))
    try:
        return configurable()
    finally:
        gin.clear_config()
