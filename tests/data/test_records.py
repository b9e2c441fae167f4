import copy

import pytest

from pivot.data import MathTaskConfig, training_records, validate_record
from pivot.errors import ConfigError

GOOD = training_records(MathTaskConfig(), 1)[0]


@pytest.mark.parametrize("mutate, match", [
    (lambda r: r.pop("ability"), r"missing field\(s\) \['ability'\]"),
    (lambda r: r.update(answer="1"), r"unexpected field\(s\) \['answer'\]"),
    (lambda r: r.update(prompt=[]), "field 'prompt' must be a non-empty list"),
    (lambda r: r["prompt"][0].pop("role"), r"field 'prompt\[0\]' must have exactly"),
    (lambda r: r["reward_model"].pop("ground_truth"), "field 'reward_model'"),
    (lambda r: r["extra_info"].pop("index"), "field 'extra_info'"),
])
def test_a_record_breaking_the_schema_is_refused_with_the_field_named(mutate, match):
    bad = copy.deepcopy(GOOD)
    mutate(bad)
    with pytest.raises(ConfigError, match=match):
        validate_record(bad, "x.parquet", 4)


def test_the_error_names_the_source_and_row():
    with pytest.raises(ConfigError, match=r"^x\.parquet: row 4: "):
        validate_record({}, "x.parquet", 4)
