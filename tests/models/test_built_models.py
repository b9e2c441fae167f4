"""Checks the default build (the one the engines load); builds it first if missing."""

import pytest

from pivot.data import MathTaskConfig, render_prompt, validation_records
from pivot.data.records import ground_truth, question_of_record
from pivot.models import BuildConfig, ensure_models
from pivot.rewards import accuracy_at_1, build_genrm_prompt, extract_answer, parse_genrm_score

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def models():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = ensure_models()
    tok = AutoTokenizer.from_pretrained(p.tokenizer)
    return (tok, AutoModelForCausalLM.from_pretrained(p.policy),
            AutoModelForCausalLM.from_pretrained(p.genrm))


def test_the_policy_answers_in_format_and_is_neither_hopeless_nor_perfect(models):
    from pivot.models.evaluate import greedy_generate

    tok, policy, _ = models
    recs = validation_records(BuildConfig().task)[:100]
    outs = greedy_generate(policy, tok, [render_prompt(r["prompt"]) for r in recs], 32)
    assert sum(extract_answer(o) is not None for o in outs) >= 90
    acc = accuracy_at_1(outs, [ground_truth(r) for r in recs])
    assert 0.05 < acc < 0.9


def test_the_genrm_ends_with_a_score_line_and_prefers_the_right_answer(models):
    from pivot.models.evaluate import greedy_generate

    tok, _, genrm = models
    recs = [r for r in validation_records(MathTaskConfig()) if r["extra_info"]["level"] == 1]
    prompts = []
    for r in recs[:40]:
        gt = int(ground_truth(r))
        prompts += [build_genrm_prompt(question_of_record(r), f" Answer: {gt}"),
                    build_genrm_prompt(question_of_record(r), f" Answer: {gt + 37}")]
    parsed = [parse_genrm_score(o) for o in greedy_generate(genrm, tok, prompts, 48)]
    assert sum(p.ok for p in parsed) >= 0.9 * len(parsed)
    right = sum(p.score for p in parsed[0::2]) / len(recs[:40])
    wrong = sum(p.score for p in parsed[1::2]) / len(recs[:40])
    assert right > wrong
