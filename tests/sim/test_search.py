"""The split search returns the best split it tried, and only admissible splits."""

from pivot.sim.search import Split, SplitSpace, search_split


def test_returns_the_best_of_the_splits_it_tried():
    space = SplitSpace(32, rollout_size=1, reward_size=4, host=8)
    # a throughput peaked at reward 8, training 16 (unknown to the search)
    def f(s: Split) -> float:
        return 1000 - abs(s.reward - 8) * 10 - abs(s.training - 16) * 7 + s.rollout * 0.1

    res = search_split(space, Split(12, 12, 8), f)
    assert res.best_throughput == max(res.tried.values())
    assert res.tried[res.best] == f(res.best)
    assert res.best == Split(8, 8, 16)
    for s in res.tried:
        assert s.rollout + s.reward + s.training == 32
        assert s.reward % 4 == 0 and s.training % 8 == 0 and s.rollout >= 1


def test_shared_pool_searches_training_only():
    space = SplitSpace(64, 4, 4, host=8, free_reward=False, shared=True, pivot_initial=True)
    res = search_split(space, Split(32, 32, 32), lambda s: -abs(s.training - 24))
    assert res.best.training == 24
    assert {s.reward for s in res.tried} == {32}


def test_prefetching_sweeps_changes_nothing_the_search_finds():
    """An evaluator with ``prefetch`` is handed each sweep first (fig. 9 runs it in
    parallel); the splits tried, their scores and the best are the same."""
    space = SplitSpace(64, rollout_size=1, reward_size=4, host=8)

    def f(s: Split) -> float:
        return 1000 - abs(s.reward - 20) * 9 - abs(s.training - 24) * 5 + s.rollout * 0.1

    class Batched:
        def __init__(self):
            self.cache, self.batches = {}, []

        def __call__(self, s):
            self.cache.setdefault(s, f(s))
            return self.cache[s]

        def prefetch(self, splits):
            self.batches.append(list(splits))
            for s in splits:
                self(s)

    ev = Batched()
    plain, batched = search_split(space, Split(32, 16, 16), f), \
        search_split(space, Split(32, 16, 16), ev)
    assert batched.tried == plain.tried and batched.best == plain.best
    assert list(batched.tried) == list(plain.tried)
    # every split handed over is one the search tries (no wasted run), the start included
    assert {s for b in ev.batches for s in b} == set(plain.tried)


def _run(dep: str, binds: list[str]):
    from pivot import gin_setup
    from pivot.paths import REPO_ROOT
    import os
    os.chdir(REPO_ROOT)
    files = ["gin/qwen7b_30b.gin"] + ([f"gin/deployments/{dep}.gin"] if dep != "pivotrl"
                                      else [])
    gin_setup.parse(files, ["ModelGroup.prompts_per_step = 16", "SimDriver.steps = 3"]
                    + binds)
    return gin_setup.build()


def test_planned_tokens_are_the_runs_and_the_bound_holds():
    """``Workflow.planned`` replays the length draws: the window's tokens and the training
    batches are the run's; the throughput bound is never below the run's throughput."""
    drv = _run("disaggregated", ["SimDriver.stop_below = 1.0"])
    processed, batch = drv.workflow.planned()
    bounds = []
    orig = drv._check_bound

    def watch():
        bounds.append(drv.throughput_bound())
        orig()

    drv._check_bound = watch
    res = drv.run()
    assert processed == res.step_processed
    assert batch == [drv.workflow.step_tokens[s] for s in range(3)]
    assert min(bounds) >= res.throughput


def test_stop_below_prunes_only_runs_below_it_and_changes_nothing_else():
    """A run given a threshold just under its throughput is the same run; one given a
    threshold above it stops with a bound under that threshold (the search's pruning
    never discards a split that would have won)."""
    import pytest

    from pivot.sim.driver import RunPruned
    full = _run("disaggregated", []).run().to_dict(trace=True)
    tput = full["throughput"]
    same = _run("disaggregated", [f"SimDriver.stop_below = {tput * 0.999!r}"]).run()
    volatile = ("wall_s", "events_per_s", "planner")
    assert {k: v for k, v in same.to_dict(trace=True).items() if k not in volatile} == \
        {k: v for k, v in full.items() if k not in volatile}
    with pytest.raises(RunPruned) as e:
        _run("disaggregated", [f"SimDriver.stop_below = {tput * 1.2!r}"]).run()
    assert tput <= e.value.bound < tput * 1.2
