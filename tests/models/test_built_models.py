"""Checks the default build (the one the engines load); builds it first if missing."""

import pytest

from pivot.data import render_prompt, validation_records
from pivot.data.records import ground_truth
from pivot.models import BuildConfig, ensure_models, read_manifest
from pivot.models.build import GENRM_MAX_NEW_TOKENS, POLICY_MAX_NEW_TOKENS
from pivot.rewards import accuracy_at_1, extract_answer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def models():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = ensure_models()
    return (AutoTokenizer.from_pretrained(p.policy), AutoModelForCausalLM.from_pretrained(p.policy),
            AutoTokenizer.from_pretrained(p.genrm), AutoModelForCausalLM.from_pretrained(p.genrm))


def test_two_architectures_with_their_own_tokenizers(models):
    ptok, policy, gtok, genrm = models
    assert type(policy).__name__ == "Qwen3ForCausalLM"
    assert type(genrm).__name__ == "LlamaForCausalLM"
    n_p = sum(x.numel() for x in policy.parameters())
    n_g = sum(x.numel() for x in genrm.parameters())
    assert n_g >= 2 * n_p
    assert (genrm.config.num_hidden_layers, genrm.config.hidden_size) != (
        policy.config.num_hidden_layers, policy.config.hidden_size)
    assert ptok.eos_token_id != gtok.eos_token_id and len(ptok) != len(gtok)


def test_the_policy_writes_worked_steps_and_is_neither_hopeless_nor_perfect(models):
    from pivot.models.evaluate import greedy_generate

    ptok, policy, _, _ = models
    recs = validation_records(BuildConfig().task)
    outs = greedy_generate(policy, ptok, [render_prompt(r["prompt"]) for r in recs],
                           POLICY_MAX_NEW_TOKENS)
    assert sum(extract_answer(o) is not None for o in outs) >= 0.9 * len(outs)
    acc = accuracy_at_1(outs, [ground_truth(r) for r in recs])
    assert 0.05 < acc < 0.9
    # the build's report is this very measurement (same set, same cap, greedy)
    assert acc == pytest.approx(read_manifest()["results"]["policy"]["accuracy_at_1"], abs=0.03)
    steps = [r["extra_info"]["level"] for r in recs]
    lines = [o.count("=") for o in outs]
    long = [n for n, s in zip(lines, steps) if s >= 5]
    short = [n for n, s in zip(lines, steps) if s == 1]
    assert sum(long) / len(long) > 3 * sum(short) / len(short)


def test_the_genrm_ends_with_a_score_line_and_tracks_the_policys_correctness(models):
    """On the pairs it judges in RL (the policy's own greedy responses to the validation
    problems), the GenRM ends most judgements with a score line and its score correlates
    with correctness. It is weak (docs/results.md, "The workload and the main job"): it
    learns the format, not the arithmetic, and does not check an answer line against the
    steps."""
    from pivot.models.build import evaluate_genrm

    ptok, policy, gtok, genrm = models
    ev = evaluate_genrm(genrm, gtok, BuildConfig(), policy, ptok)["policy_outputs"]
    assert ev["parse_rate"] >= 0.75
    assert ev["pearson"] > 0.1
    assert ev["mean_score_correct"] > ev["mean_score_wrong"]


def test_the_workload_has_the_long_tail_it_claims(models):
    """Reference responses and judgements of a training stream, in each model's own
    tokens: p99 / p50 >= 4 for both (the RL runs report the sampled ones,
    ``pivot.rl.lengths``)."""
    from pivot.data.dataset import training_problems
    from pivot.models.examples import judge_score, target_response
    from pivot.rewards.genrm import format_judgement
    from pivot.rl.lengths import quantiles

    ptok, _, gtok, _ = models
    probs = training_problems(BuildConfig().task, 2000)
    resp = [target_response(p) for p in probs]
    r_len = [len(ptok(r, add_special_tokens=False).input_ids) + 1 for r in resp]
    j_len = [len(gtok(format_judgement(*judge_score(p, r)), add_special_tokens=False)
                 .input_ids) + 1 for p, r in zip(probs, resp)]
    for lens in (r_len, j_len):
        q = quantiles(lens)
        assert q["p99_over_p50"] >= 4, q
    assert max(r_len) <= POLICY_MAX_NEW_TOKENS and max(j_len) <= GENRM_MAX_NEW_TOKENS
