import pytest

from pivot.rl.lengths import length_report, quantiles


def test_quantiles_and_the_tail_ratio():
    q = quantiles([10] * 98 + [100, 200])
    assert q["p50"] == 10 and q["max"] == 200 and q["n"] == 100
    assert q["p99_over_p50"] == pytest.approx(q["p99"] / 10) and q["p99"] > 100
    assert quantiles([]) is None


def test_the_report_takes_the_first_and_last_steps():
    steps = [{"rollout/response_lens": [s] * 4, "reward/judge_lens": [2 * s] * 4}
             for s in range(1, 11)]
    r = length_report(steps, window=3)
    assert r["response"]["start"]["max"] == 3 and r["response"]["end"]["p50"] == 9
    assert r["judgement"]["end"]["max"] == 20
