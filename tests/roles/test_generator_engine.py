"""The in-process vLLM generator engine against transformers."""

import json

import pytest

from pivot.errors import ConfigError, StateError
from pivot.roles.engine.config import EngineConfig, check_model_dir
from pivot.roles.engine.requests import GenRequest, SampleSpec

pytestmark = pytest.mark.engine

PROMPTS = [[1, 5, 6, 7, 8], [1, 9, 10], [1, 40, 41, 42, 43, 44, 45, 46], [1, 100]]
N = 16
GREEDY = SampleSpec(max_tokens=N, ignore_eos=True)
LOGPROB_TOL = 1e-4  # fp32; docs/stack.md measured 7e-6 on the same build


def run_greedy(engine, prompts, base=0):
    out = engine.run([GenRequest(base + i, p, GREEDY) for i, p in enumerate(prompts)])
    return [out[base + i] for i in range(len(prompts))]


def test_greedy_after_state_dict_load_equals_transformers(engine, weights, hf):
    engine.load_weights(weights[0])
    ref = hf.load(weights[0])
    for p, res in zip(PROMPTS, run_greedy(engine, PROMPTS, 100)):
        assert res.tokens == ref.greedy(p, N)
        assert res.finish_reason == "length"
        want = ref.logprobs(p, res.tokens)
        assert max(abs(a - b) for a, b in zip(res.logprobs, want)) < LOGPROB_TOL


def test_new_weights_are_served_without_restart(engine, weights, hf):
    engine.load_weights(weights[0])
    old = [r.tokens for r in run_greedy(engine, PROMPTS, 200)]
    seconds = engine.load_weights(weights[1])
    assert seconds < 5
    new = [r.tokens for r in run_greedy(engine, PROMPTS, 300)]
    assert new != old
    ref = hf.load(weights[1])
    assert new == [ref.greedy(p, N) for p in PROMPTS]


def test_aborted_and_resumed_greedy_equals_uninterrupted(engine, weights):
    engine.load_weights(weights[1])
    whole = run_greedy(engine, PROMPTS, 400)
    for i, p in enumerate(PROMPTS):
        engine.submit(GenRequest(500 + i, p, GREEDY))
    for _ in range(6):
        engine.step()
    part = engine.abort([500, 502])
    assert 0 < len(part[500].tokens) < N and part[500].finish_reason == "abort"
    assert part[500].tokens == whole[0].tokens[:len(part[500].tokens)]
    resumed = engine.run([GenRequest(s, PROMPTS[s - 500], GREEDY, r.tokens, r.logprobs)
                          for s, r in part.items()])
    rest = {}
    while engine.live:
        rest.update({r.seq_id: r for r in engine.step()})
    for i in range(len(PROMPTS)):
        res = resumed.get(500 + i) or rest[500 + i]
        assert res.tokens == whole[i].tokens
        assert res.logprobs == pytest.approx(whole[i].logprobs, abs=LOGPROB_TOL)


def test_a_failed_step_keeps_the_tokens_and_they_resume(engine, weights, monkeypatch):
    """A step that raises in the step loop ends the running sequences with reason "error"
    and the tokens of the steps before it; vLLM drops them, and resumed from those tokens
    they finish as an uninterrupted run does (the fleet's retry, greedy)."""
    from pivot.roles.engine.loop import StepLoop

    engine.load_weights(weights[1])
    whole = run_greedy(engine, PROMPTS, 600)
    real, calls = engine.llm.step, []

    def flaky():
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("injected step failure")
        return real()

    monkeypatch.setattr(engine.llm, "step", flaky)
    loop = StepLoop(engine)
    try:
        assert loop.submit([GenRequest(700 + i, p, GREEDY) for i, p in enumerate(PROMPTS)]
                           ) == [None] * len(PROMPTS)
        failed = loop.wait(range(700, 700 + len(PROMPTS)), timeout_s=60)
    finally:
        loop.close()
    assert isinstance(loop.error, RuntimeError)
    assert not engine.live and not engine.llm.has_unfinished_requests()
    for i in range(len(PROMPTS)):
        res = failed[700 + i]
        assert res.finish_reason == "error" and "injected step failure" in res.error
        assert len(res.tokens) == 3 and res.tokens == whole[i].tokens[:3]
    resumed = engine.run([GenRequest(s, PROMPTS[s - 700], GREEDY, r.tokens, r.logprobs)
                          for s, r in failed.items()])
    for i in range(len(PROMPTS)):
        assert resumed[700 + i].tokens == whole[i].tokens


def test_bad_requests_fail_alone(engine, weights):
    engine.load_weights(weights[0])
    good = run_greedy(engine, PROMPTS[:2], 600)
    reqs = [GenRequest(700, PROMPTS[0], GREEDY),
            GenRequest(701, [1] * (engine.cfg.max_model_len + 5), GREEDY),
            GenRequest(702, PROMPTS[1], SampleSpec(temperature=-1.0)),
            GenRequest(703, PROMPTS[1], SampleSpec(top_p=0.0)),
            GenRequest(704, PROMPTS[1], SampleSpec(max_tokens=0)),
            GenRequest(705, PROMPTS[1], GREEDY)]
    out = engine.run(reqs)
    assert "do not fit" in out[701].error
    assert "temperature" in out[702].error
    assert "top_p" in out[703].error
    assert "max_tokens" in out[704].error
    assert {s for s, r in out.items() if r.finish_reason == "error"} == {701, 702, 703, 704}
    assert out[700].tokens == good[0].tokens and out[705].tokens == good[1].tokens


def test_missing_or_malformed_model_folder_is_a_clear_error(tmp_path, engine_config):
    from pivot.roles.engine.vllm_engine import VllmEngine

    with pytest.raises(ConfigError, match="does not exist"):
        VllmEngine(EngineConfig(str(tmp_path / "nope")))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="malformed"):
        check_model_dir(bad)
    (bad / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    with pytest.raises(ConfigError, match="safetensors"):
        check_model_dir(bad)


def test_release_frees_kv_and_a_shift_up_serves_again(engine, weights, hf):
    engine.load_weights(weights[0])
    rep = engine.release()
    assert rep.kv_bytes == engine.cfg.num_blocks * 2 * 2 * 2 * 32 * engine.cfg.block_size * 4
    assert rep.packed_linears > 0 and rep.weight_bytes > 0
    with pytest.raises(StateError, match="shifted down"):
        engine.submit(GenRequest(800, PROMPTS[0], GREEDY))
    engine.load_weights(weights[1])
    engine.reallocate_kv()
    ref = hf.load(weights[1])
    assert [r.tokens for r in run_greedy(engine, PROMPTS, 900)] == [ref.greedy(p, N)
                                                                     for p in PROMPTS]


def test_stats_report_running_and_kv_use(engine, weights):
    engine.load_weights(weights[0])
    for i, p in enumerate(PROMPTS):
        engine.submit(GenRequest(1000 + i, p, GREEDY))
    engine.step()
    st = engine.stats()
    assert st.running + st.waiting == len(PROMPTS)
    assert st.num_tokens >= sum(len(p) for p in PROMPTS) and 0 < st.kv_usage < 1
    assert st.last_step_s > 0
    engine.abort(range(1000, 1000 + len(PROMPTS)))
    assert engine.stats().running == 0


def test_a_tied_head_model_shifted_down_and_up_serves_transformers_greedy(engine, weights, hf):
    """Tied embeddings (Qwen3 tiny models): HF checkpoints and GPS Reads omit
    ``lm_head.weight``, so the shift up must repack the head from the reloaded embedding;
    twice, so a second round trip serves the second weights too."""
    for state in weights:
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
        engine.load_weights(state)
        engine.release()
        with pytest.raises(StateError, match="shifted down"):
            engine.submit(GenRequest(950, PROMPTS[0], GREEDY))
        engine.load_weights(state)
        engine.reallocate_kv()
        ref = hf.load(state)
        assert [r.tokens for r in run_greedy(engine, PROMPTS, 960)] == [
            ref.greedy(p, N) for p in PROMPTS]


def test_seeded_sampling_survives_prompts_that_outgrow_one_step_budget(engine, weights):
    """Per-sequence seeds (deterministic sampling) with more prompt tokens at once than one
    engine step takes: with chunked prefill, vLLM (0.32, CPU) rewinds a partially
    prefilled request's generator by ``set_offset``, which a CPU generator does not have,
    and the whole step failed ("CPU Generator does not use offset"). The engine schedules
    whole prompts only (``enable_chunked_prefill=False``)."""
    engine.load_weights(weights[0])
    budget = engine.llm.vllm_config.scheduler_config.max_num_batched_tokens
    n = budget // 200 + 4     # prompts of 200 tokens that together exceed one step's budget
    reqs = [GenRequest(700 + i, [1] + [3 + (i * 7 + j) % 200 for j in range(199)],
                       SampleSpec(max_tokens=4, temperature=1.0, ignore_eos=True,
                                  seed=11 + i)) for i in range(n)]
    out = engine.run(reqs)
    assert all(out[r.seq_id].finish_reason != "error" for r in reqs), \
        {r.seq_id: out[r.seq_id].error for r in reqs if out[r.seq_id].finish_reason == "error"}
    assert all(len(out[r.seq_id].tokens) == 4 for r in reqs)
