"""The RL loop over in-memory ports (``pivot.testing.rl`` says what is faked and why)."""

import pytest

from pivot.errors import StateError
from pivot.rl import checkpoint
from pivot.rl.staleness import StalenessBound
from pivot.testing.rl import fake_loop

M, N = 3, 4


def make(steps, staleness=2, run_dir=None, stop_after=None, seed=0):
    """(workflow, FakeTrainer, loop) of ``steps`` steps, M prompts of N responses each."""
    return fake_loop(steps, staleness, run_dir, stop_after, seed, prompts_per_step=M,
                     responses=N)


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_every_step_respects_the_staleness_bound(staleness):
    wf, tr, loop = make(7, staleness)
    hist = loop.run()
    assert [m["step"] for m in hist] == list(range(1, 8))
    for b in tr.batches:
        assert max(b["lags"]) <= staleness
        # nothing was released beyond version + staleness when the step trained
        assert b["released"] <= b["version"] + staleness + 1
    assert all(m["staleness_max"] <= staleness for m in hist)


def test_staleness_two_overlaps_rollout_with_training():
    wf, tr, loop = make(6, 2)
    loop.run()
    assert max(max(b["lags"]) for b in tr.batches) == 2
    assert max(b["released"] - b["version"] for b in tr.batches) == 3


def test_every_prompt_reaches_training_with_exactly_n_rewarded_responses():
    wf, tr, loop = make(5)
    loop.run()
    for b in tr.batches:
        assert b["sizes"] == [N] * M


def test_a_batch_with_a_lag_above_the_bound_is_refused():
    b = StalenessBound(2)
    assert b.check_batch(5, 5, [3, 4, 5]) == 2
    with pytest.raises(StateError, match="lag 3"):
        b.check_batch(5, 5, [2, 5])
    with pytest.raises(StateError, match="lag 3"):
        b.check_start(5, 2)


def test_the_data_order_is_the_same_for_a_seed_and_differs_across_seeds():
    orders = []
    for seed in (0, 0, 1):
        wf, tr, loop = make(4, seed=seed)
        loop.run()
        orders.append([b["prompts"] for b in tr.batches])
    assert orders[0] == orders[1] != orders[2]


def test_a_run_stopped_and_resumed_continues_at_the_same_step_with_the_same_data(tmp_path):
    _, full, loop = make(6)
    loop.run()

    wf1, part, loop1 = make(6, run_dir=tmp_path, stop_after=2)
    loop1.run()
    assert [b["step"] for b in part.batches] == [0, 1]
    # rollouts of later steps were in flight: the replay buffer holds finished ones
    state = checkpoint.load(checkpoint.latest(tmp_path))
    assert state["workflow"]["version"] == 2
    assert 3 <= state["workflow"]["released"] <= 2 + 2 + 1
    assert any(t["reward"] is not None for t in state["workflow"]["trajectories"])
    assert state["allocation"] == {"rollout": 2, "reward": 1, "training": 1}

    wf2, rest, loop2 = make(6, run_dir=tmp_path)
    loop2.resume(state)
    hist = loop2.run()
    assert [b["step"] for b in rest.batches] == [2, 3, 4, 5]
    assert [m["step"] for m in hist] == [1, 2, 3, 4, 5, 6]
    assert ([b["prompts"] for b in part.batches + rest.batches]
            == [b["prompts"] for b in full.batches])
    assert all(max(b["lags"]) <= 2 for b in rest.batches)


def test_a_judgement_before_its_response_is_an_error():
    wf, tr, loop = make(2)
    t = wf.release()[0]
    with pytest.raises(StateError, match="before its response"):
        wf.judged(t.traj_id, "Score: 3")


def test_each_step_counts_the_tokens_of_the_batch_it_trained_on():
    wf, tr, loop = make(5)
    hist = loop.run()
    # FakeRollout: prompt + 3 generated tokens; FakeReward: 10 tokens per judgement
    per_step = [sum(n + 3 + 10 for n in b["prompt_lens"]) for b in tr.batches]
    assert [m["batch_tokens"] for m in hist] == per_step
    assert [m["trained_tokens"] for m in hist] == [sum(per_step[:i + 1]) for i in range(5)]
    # work finished ahead for later batches is in ``tokens`` but not yet trained
    assert all(m["tokens"] >= m["trained_tokens"] for m in hist)


def test_training_stays_busy_until_its_weights_are_published():
    # a planner sees idle training devices only after the Write: one taken mid-Write
    # once shifted the writer's ranks down under it
    wf, tr, loop = make(3)
    seen = []
    publish = tr.publish
    tr.publish = lambda v, w: (seen.append(loop.control.busy), publish(v, w))[1]
    loop.run()
    assert seen == [True] * 3
    assert loop.control.busy is False


def test_a_step_starts_only_if_training_is_still_ready_after_the_checkpoint():
    # a shift that takes training down may begin while the loop writes the checkpoint
    # (an await): the loop asks again before the step, and starts none on a "no"
    wf, tr, loop = make(3)
    calls = []
    train = tr.train

    def ready():
        ok = sum(c[0] == "ready" for c in calls) != 1   # the second answer is "no"
        calls.append(("ready", ok))
        return ok

    def train_(groups, version):
        calls.append(("train", True))
        return train(groups, version)

    tr.ready, tr.train = ready, train_
    loop.run()
    steps = [i for i, c in enumerate(calls) if c[0] == "train"]
    assert len(steps) == 3 and all(calls[i - 1] == ("ready", True) for i in steps)
    assert calls[:2] == [("ready", True), ("ready", False)]   # the re-check said no


def test_a_step_lost_with_its_training_replica_trains_the_same_batch_again():
    # TrainingLost: the replica died mid-step, before anything the run keeps changed;
    # the batch stays the next one, and the policy equals an uninterrupted run's
    from pivot.rl.ports import TrainingLost

    _, ref, ref_loop = make(4)
    ref_loop.run()
    wf, tr, loop = make(4)
    train, lost = tr.train, []

    def train_(groups, version):
        if version == 1 and not lost:
            lost.append(groups[0].step)
            raise TrainingLost("slot 3: its process died")
        return train(groups, version)

    tr.train = train_
    loop.run()
    assert lost == [1] and loop.steps_lost == 1 and loop.control.busy is False
    assert [m["step"] for m in loop.history] == [1, 2, 3, 4]
    assert [b["step"] for b in tr.batches] == [0, 1, 2, 3]   # step 1's batch once, after
    assert tr.policy == ref.policy


def test_a_step_lost_while_publishing_trains_the_same_batch_again():
    # the replica died before its Write committed: the trainer is back at its state
    # before the step (as ClusterTrainer goes back to its AdamW state), the workflow has
    # not advanced, and the policy equals an uninterrupted run's
    from pivot.rl.ports import TrainingLost

    _, ref, ref_loop = make(4)
    ref_loop.run()
    wf, tr, loop = make(4)
    train, publish, lost = tr.train, tr.publish, []
    before = {}

    def train_(groups, version):
        before["policy"] = tr.policy
        return train(groups, version)

    def publish_(version, on_written):
        if version == 2 and not lost:
            lost.append(wf.version)
            tr.policy = before["policy"]   # the step's weights died with the slot
            raise TrainingLost("slot 3: its process died mid-Write")
        return publish(version, on_written)

    tr.train, tr.publish = train_, publish_
    loop.run()
    assert lost == [1] and loop.steps_lost == 1 and loop.control.busy is False
    assert [m["step"] for m in loop.history] == [1, 2, 3, 4]
    assert [m["version"] for m in loop.history] == [1, 2, 3, 4]
    assert [b["step"] for b in tr.batches] == [0, 1, 1, 2, 3]   # step 1's batch twice
    assert tr.policy == ref.policy
