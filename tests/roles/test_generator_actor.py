"""The generator as a real Monarch actor, driven through the replica port by the
scheduler's actions (sec. 6.2): dispatch, abort with tokens kept, resume elsewhere."""

import time

import pytest

from pivot.roles.engine.port import GeneratorPort
from pivot.roles.engine.requests import GenRequest, SampleSpec
from pivot.scheduler.actions import Abort, Dispatch
from pivot.types import POLICY, SequenceState

pytestmark = [pytest.mark.engine, pytest.mark.monarch]

PROMPTS = [[1, 5, 6, 7, 8], [1, 9, 10], [1, 40, 41, 42, 43, 44, 45, 46]]
N = 48
SPEC = SampleSpec(max_tokens=N, ignore_eos=True)


@pytest.fixture(scope="module")
def generators(engine_config):
    from pivot.testing.generator import ActorHandle, spawn_generators

    actors, procs, failures = spawn_generators(2, engine_config)
    yield {rid: ActorHandle(a) for rid, a in actors.items()}, actors, failures
    for p in procs:
        p.stop().get()


def test_migrated_sequences_finish_like_uninterrupted_ones(generators, hf_disk):
    handles, actors, failures = generators
    ref = hf_disk  # the actors serve the weights on disk
    seqs = {i: SequenceState(i, POLICY, len(p), N, prompt_tokens=list(p))
            for i, p in enumerate(PROMPTS)}
    port = GeneratorPort(handles, seqs, spec_for=lambda s: SPEC)
    st = port.apply([Dispatch(i, "slot-0") for i in seqs])
    assert st.dispatched == 3 and st.dispatch_s > 0
    time.sleep(0.2)
    st = port.apply([Abort(0, "slot-0"), Abort(1, "slot-0"),
                     Dispatch(0, "slot-1", resume=True), Dispatch(1, "slot-1", resume=True)])
    assert st.aborted == 2 and st.dispatched == 2
    assert all(seqs[i].num_aborts == 1 and seqs[i].replica_id == "slot-1" for i in (0, 1))
    assert 0 < seqs[0].generated_len < N
    assert st.reprefill_s > 0
    done = {}
    deadline = time.time() + 60
    while len(done) < 3 and time.time() < deadline:
        done.update(port.collect())
        time.sleep(0.05)
    assert set(done) == {0, 1, 2}
    for i, p in enumerate(PROMPTS):
        assert done[i].tokens == ref.greedy(p, N), i
        assert seqs[i].generated_len == N and seqs[i].replica_id is None
    assert not failures


def test_actor_reports_stats_and_rejects_bad_requests_alone(generators):
    handles, actors, _ = generators
    a = actors["slot-1"]
    out = a.generate.call_one([GenRequest(50, PROMPTS[0], SampleSpec(max_tokens=4)),
                               GenRequest(51, PROMPTS[0], SampleSpec(temperature=-2.0))]).get()
    assert len(out[50].tokens) <= 4 and out[50].finish_reason in ("length", "stop")
    assert out[51].finish_reason == "error" and "temperature" in out[51].error
    st = a.stats.call_one().get()
    assert st.running == 0 and st.steps > 0 and st.rss_bytes > 0
