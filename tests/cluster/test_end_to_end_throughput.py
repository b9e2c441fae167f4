"""The end-to-end throughput readings of a local run (no engine)."""

import pytest

from pivot.cluster.driver import end_to_end_throughput


def steps(*rows):
    return [{"time_s": t, "tokens": f, "trained_tokens": tr} for t, f, tr in rows]


def test_work_done_ahead_counts_when_it_is_trained():
    # two runs that train the same batches at the same times; the second had finished
    # more work ahead at step 1 (staleness), which the finished-token reading punishes
    a = steps((2.0, 1000, 500), (4.0, 2000, 1000), (6.0, 2500, 1500))
    b = steps((2.0, 2000, 500), (4.0, 2400, 1000), (6.0, 2500, 1500))
    ta, tb = end_to_end_throughput(a), end_to_end_throughput(b)
    assert ta["throughput"] == tb["throughput"] == pytest.approx(1000 / 4.0)
    assert ta["throughput_run"] == tb["throughput_run"] == pytest.approx(1500 / 6.0)
    assert ta["throughput_finished"] == pytest.approx(1500 / 4.0)
    assert tb["throughput_finished"] == pytest.approx(500 / 4.0)


def test_too_few_steps_give_no_steady_state_reading():
    one = end_to_end_throughput(steps((2.0, 100, 50)))
    assert one["throughput"] is None and one["throughput_run"] == pytest.approx(25.0)
    assert end_to_end_throughput([]) == {"throughput": None, "throughput_run": None,
                                         "throughput_finished": None}
