"""Started slot calls and a dead process (``pivot.runtime.pending``): a watched call fails
as soon as its process is reported dead, whether Monarch's future hangs (a call in flight
at the death) or raises Monarch's ``SupervisionError``; a slow answer is not lost to the
slicing. The futures here are stand-ins with Monarch's ``get(timeout)`` contract (a
timeout does not consume the future); tests/runtime/test_faults.py kills a real slot."""

import asyncio
import time

import pytest

from pivot.compat.monarch import supervision_error
from pivot.runtime import pending
from pivot.runtime.pending import Pending, SlotProcessDied


class Future:
    """Answers ``value`` after ``after_s`` (None: never), or raises ``error`` at once."""

    def __init__(self, value=None, after_s=None, error=None):
        self.value, self.error = value, error
        self.at = None if after_s is None else time.monotonic() + after_s

    def get(self, timeout=None):
        if self.error is not None:
            raise self.error
        wait = None if self.at is None else max(0.0, self.at - time.monotonic())
        if wait is None or (timeout is not None and wait > timeout):
            time.sleep(timeout or 0)
            raise TimeoutError()
        time.sleep(wait)
        return self.value

    def __await__(self):
        if self.error is not None:
            raise self.error
        if self.at is None:
            yield from asyncio.sleep(3600).__await__()
        yield from asyncio.sleep(max(0.0, self.at - time.monotonic())).__await__()
        return self.value


@pytest.fixture(autouse=True)
def fast_slices(monkeypatch):
    monkeypatch.setattr(pending, "DEATH_POLL_S", 0.05)


def dies_after(s):
    t = time.monotonic() + s
    return lambda: time.monotonic() >= t


@pytest.mark.parametrize("form", ["get", "wait"])
def test_a_call_that_never_answers_fails_once_its_process_is_reported_dead(form):
    p = Pending(Future(), 60.0, dies_after(0.3), "slot 1 (c0slot1)")
    t = time.monotonic()
    with pytest.raises(SlotProcessDied, match=r"slot 1 \(c0slot1\): its process died"):
        p.get() if form == "get" else asyncio.run(p.wait())
    assert 0.3 <= time.monotonic() - t < 2.0


@pytest.mark.parametrize("form", ["get", "wait"])
def test_monarchs_supervision_error_becomes_ours(form):
    p = Pending(Future(error=supervision_error()("actor c0slot3r1 failed")), 60.0,
                lambda: False, "slot 3")
    with pytest.raises(SlotProcessDied) as err:
        p.get() if form == "get" else asyncio.run(p.wait())
    assert isinstance(err.value.__cause__, supervision_error())


@pytest.mark.parametrize("form", ["get", "wait"])
def test_a_slow_answer_of_a_live_process_survives_the_slices_and_the_timeout_holds(form):
    p = Pending(Future("ok", after_s=0.4), 60.0, lambda: False)
    assert (p.get() if form == "get" else asyncio.run(p.wait())) == "ok"
    late = Pending(Future("late", after_s=5.0), 0.3, lambda: False)
    with pytest.raises(TimeoutError):
        late.get() if form == "get" else asyncio.run(late.wait())


def test_a_bounded_get_gives_up_within_its_bound_and_a_fast_answer_still_comes():
    # ClusterTrainer._all waits a bounded time for the other ranks once one rank failed
    p = Pending(Future(), timeout=60.0, died=lambda: False, what="slot 1")
    t = time.monotonic()
    with pytest.raises(TimeoutError):
        p.get(within=0.3)
    assert time.monotonic() - t < 2.0
    assert Pending(Future(7, after_s=0.1), 60.0, lambda: False).get(within=5.0) == 7
    assert Pending(Future(8, after_s=0.1), 60.0).get(within=5.0) == 8   # unwatched
