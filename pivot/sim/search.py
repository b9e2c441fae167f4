"""Best static split per baseline (app. E, table 4: "For each baseline, we tune its
resource configuration to achieve the best end-to-end throughput").

A split is (rollout, reward, training) devices, each a multiple of its replica size
(training: of a host). ``search_split`` runs a coordinate search from a starting split:
for each free coordinate in turn it tries every admissible value with the others fixed
(the remainder goes to rollout), keeps the best, and repeats for ``rounds``; every tried
split and its throughput is recorded, and the best tried one is returned.

Which coordinates are free depends on the deployment: disaggregated, rule-based, static
(reward and training; rollout takes the rest), rollout-reward colocated and PivotRL
(training only: rollout and reward share the rest / the whole pool).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from pivot.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, order=True)
class Split:
    """Devices per role; ``reward`` 0 with a shared pool means rollout and reward share."""

    rollout: int
    reward: int
    training: int

    def bindings(self) -> list[str]:
        """Gin bindings that set this split on a model group + deployment."""
        return [f"DISAGG_ROLLOUT = {self.rollout}", f"DISAGG_REWARD = {self.reward}",
                f"PIVOT_ROLLOUT = {self.rollout}", f"PIVOT_REWARD = {self.reward}",
                f"TrainingProfile.devices = {self.training}"]


@dataclass(frozen=True, slots=True)
class SplitSpace:
    """The admissible splits of one group and deployment.

    Attributes:
        devices: cluster devices.
        rollout_size / reward_size: devices per rollout / reward replica (TP x EP).
        host: devices per host (training moves in whole hosts).
        free_reward: whether the reward count is searched (static-split baselines).
        shared: rollout and reward share the non-training pool (rr-colocated, PivotRL):
            the split is (pool, 0, training) for rr-colocated, (pool/2, pool/2) for
            PivotRL's initial placement (``pivot_initial``).
        pivot_initial: PivotRL starts with the pool split evenly (table 4's 0-N ranges).
    """

    devices: int
    rollout_size: int
    reward_size: int
    host: int = 8
    free_reward: bool = True
    shared: bool = False
    pivot_initial: bool = False

    def training_values(self) -> list[int]:
        step = max(self.host, self.devices // 8 // self.host * self.host)
        return [t for t in range(step, self.devices * 3 // 4 + 1, step)]

    def reward_values(self, training: int) -> list[int]:
        pool = self.devices - training
        step = max(self.reward_size, pool // 8 // self.reward_size * self.reward_size)
        return [r for r in range(self.reward_size, pool - self.rollout_size + 1, step)
                if (pool - r) % self.rollout_size == 0]

    def make(self, reward: int, training: int) -> Split | None:
        pool = self.devices - training
        if self.shared:
            if self.pivot_initial:  # training is not home: the whole cluster is the pool
                half = self.devices // 2 // self.reward_size * self.reward_size
                return Split(self.devices - half, half, training)
            return Split(-1, 0, training)
        ro = pool - reward
        if ro < self.rollout_size or reward < 0 or ro % self.rollout_size:
            return None
        return Split(ro, reward, training)


@dataclass
class SearchResult:
    """The chosen split, every split's throughput and, for splits whose run was stopped
    once proven below the best so far (``pivot.runners.sim_experiments.search``'s ``prune``),
    the upper bound it was stopped at (in ``tried`` too, where the search compares it)."""

    best: Split
    best_throughput: float
    tried: dict[Split, float] = field(default_factory=dict)
    pruned: dict[Split, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """``tried``: measured throughputs; ``pruned``: [rollout, reward, training, upper
        bound] of the stopped runs."""
        return {"best": [self.best.rollout, self.best.reward, self.best.training],
                "best_throughput": self.best_throughput,
                "tried": [[s.rollout, s.reward, s.training, t]
                          for s, t in sorted(self.tried.items()) if s not in self.pruned],
                "pruned": [[s.rollout, s.reward, s.training, t]
                           for s, t in sorted(self.pruned.items())]}


def search_split(space: SplitSpace, start: Split, evaluate: Callable[[Split], float],
                 rounds: int = 2) -> SearchResult:
    """Coordinate search over ``space`` from ``start``; ``evaluate`` gives a split's
    end-to-end throughput (tokens/s). Returns the best split of those tried."""
    tried: dict[Split, float] = {}
    # an evaluator that can run a sweep's splits together (in parallel) gets each sweep
    # first; the scores and so the search are the same, only the wall time shrinks
    prefetch = getattr(evaluate, "prefetch", lambda splits: None)

    def score(s: Split) -> float:
        if s not in tried:
            tried[s] = evaluate(s)
            log.info("split %s -> %.0f tokens/s", s, tried[s])
        return tried[s]

    cur = space.make(start.reward, start.training)
    if cur is None:
        raise ConfigError(f"search_split: start {start} is not admissible in {space}")
    # the start runs together with the first training sweep
    prefetch([cur] + [s for s in training_sweep(space, cur) if s is not None and s != cur])
    score(cur)
    for _ in range(rounds):
        before = cur
        options = training_sweep(space, cur)
        prefetch([s for s in options if s is not None and s not in tried])
        for s in filter(None, options):
            score(s)
        cur = max(tried, key=tried.__getitem__)
        if space.free_reward:
            sweep = [space.make(r, cur.training) for r in space.reward_values(cur.training)]
            prefetch([s for s in sweep if s is not None and s not in tried])
            for s in filter(None, sweep):
                score(s)
            cur = max(tried, key=tried.__getitem__)
        if cur == before:
            break
    best = max(tried, key=tried.__getitem__)
    return SearchResult(best, tried[best], tried)


def training_sweep(space: SplitSpace, cur: Split) -> list[Split | None]:
    """Every admissible training share with the rest as in ``cur`` (app. E): the same rule
    for every deployment; a static split keeps reward's share of the pool, a shared pool
    (rr-colocated, PivotRL) has nothing else to keep."""
    if not space.free_reward:
        return [space.make(cur.reward, t) for t in space.training_values()]
    share = cur.reward / max(1, space.devices - cur.training)
    return [space.make(_round(share * (space.devices - t), space.reward_size), t)
            for t in space.training_values()]


def _round(x: float, size: int) -> int:
    return max(size, int(round(x / size)) * size)
