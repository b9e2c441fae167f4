"""Checks the default build (the one the engines load); builds it first if missing."""

import pytest

from pivot.data import render_prompt, validation_records
from pivot.data.records import ground_truth, question_of_record
from pivot.models import BuildConfig, ensure_models, read_manifest
from pivot.models.build import GENRM_MAX_NEW_TOKENS, POLICY_MAX_NEW_TOKENS
from pivot.rewards import accuracy_at_1, build_genrm_prompt, extract_answer, parse_genrm_score

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


def test_the_genrm_ends_with_a_score_line_and_prefers_the_right_answer(models):
    from pivot.data.chains import format_worked
    from pivot.data.arithmetic import Problem
    from pivot.models.evaluate import greedy_generate

    _, _, gtok, genrm = models
    recs = validation_records(BuildConfig().task)[:40]
    prompts = []
    for r in recs:
        gt = int(ground_truth(r))
        q = question_of_record(r)
        p = Problem(q.removeprefix("What is ").removesuffix("?"), gt, r["extra_info"]["level"])
        good = format_worked(p)
        bad = good.rsplit("Answer:", 1)[0] + f"Answer: {gt + 37}"
        prompts += [build_genrm_prompt(q, good), build_genrm_prompt(q, bad)]
    parsed = [parse_genrm_score(o) for o in greedy_generate(genrm, gtok, prompts,
                                                            GENRM_MAX_NEW_TOKENS)]
    assert sum(p.ok for p in parsed) >= 0.9 * len(parsed)
    right = sum(p.score for p in parsed[0::2]) / len(recs)
    wrong = sum(p.score for p in parsed[1::2]) / len(recs)
    assert right > wrong


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
