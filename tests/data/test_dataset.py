import itertools

from pivot.data import (MathTaskConfig, iterate_prompts, question_of_record, render_prompt,
                        training_records, validate_record, validation_records)
from pivot.data.records import ground_truth


def test_validation_is_disjoint_from_every_training_batch():
    """Every held-out problem (chains: of two steps or more, ``held_out_keys``) stays out
    of every training batch."""
    from pivot.data.dataset import held_out_keys
    for cfg in (MathTaskConfig(seed=5, num_val=200),
                MathTaskConfig(seed=5, num_val=200, kind="levels")):
        val = {question_of_record(r) for r in validation_records(cfg)}
        held = {f"What is {k}?" for k in held_out_keys(cfg)}
        train = [question_of_record(r) for b in itertools.islice(iterate_prompts(cfg, 64), 30)
                 for r in b]
        assert len(val) == 200 and held <= val
        assert not held & set(train)
    assert held == val   # the one-operation task holds out all of it


def test_the_stream_is_deterministic_and_resumable():
    cfg = MathTaskConfig(seed=1)
    a = list(itertools.islice(iterate_prompts(cfg, 8), 4))
    b = list(itertools.islice(iterate_prompts(cfg, 8, start_batch=2), 2))
    assert a[2:] == b
    assert a == list(itertools.islice(iterate_prompts(cfg, 8), 4))
    assert a[0] != a[1]


def test_generated_records_follow_the_dapo_schema_and_render_to_a_prompt():
    for rec in training_records(MathTaskConfig(), 20) + validation_records(MathTaskConfig()):
        validate_record(rec)
        text = render_prompt(rec["prompt"])
        assert text.endswith("Response:")
        assert question_of_record(rec) in text
        assert int(ground_truth(rec)) == eval(question_of_record(rec)[len("What is "):-1])
    assert [r["extra_info"]["index"] for r in training_records(MathTaskConfig(), 3, offset=2)] \
        == [6, 7, 8]
