import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pivot.data import (load_aime_parquet, load_dapo_parquet, question_of_record,
                        render_prompt)
from pivot.errors import ConfigError

DAPO_PROMPT = ("Solve the following math problem step by step. The last line of your "
               "response should be of the form Answer: $Answer (without quotes) where $Answer "
               "is the answer to the problem.\n\nWhat is 2+3?\n\nRemember to put your answer on "
               "its own line after \"Answer:\".")


def dapo_rows(n=3):
    return [{"data_source": "math_dapo",
             "prompt": [{"content": DAPO_PROMPT, "role": "user"}],
             "ability": "MATH",
             "reward_model": {"ground_truth": str(5 + i), "style": "rule-lighteval/MATH_v2"},
             "extra_info": {"index": f"uuid-{i}"}} for i in range(n)]


def write(tmp_path, rows, name="f.parquet"):
    path = tmp_path / name
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_a_dapo_file_in_the_real_schema_loads(tmp_path):
    recs = load_dapo_parquet(write(tmp_path, dapo_rows()))
    assert len(recs) == 3 and recs[1]["reward_model"]["ground_truth"] == "6"
    assert "What is 2+3?" in render_prompt(recs[0]["prompt"])


def test_a_dapo_file_missing_a_column_names_the_file_and_the_column(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "reward_model"} for r in dapo_rows()]
    path = write(tmp_path, rows, "broken.parquet")
    with pytest.raises(ConfigError,
                       match=r"broken\.parquet.*missing column\(s\) \['reward_model'\]"):
        load_dapo_parquet(path)


def test_a_dapo_file_with_an_extra_column_is_refused_with_the_fix(tmp_path):
    rows = [{**r, "answer": "5"} for r in dapo_rows()]
    with pytest.raises(ConfigError, match=r"unexpected column\(s\) \['answer'\].*load_aime"):
        load_dapo_parquet(write(tmp_path, rows))


def test_a_dapo_row_with_an_empty_ground_truth_names_the_row_and_field(tmp_path):
    rows = dapo_rows()
    rows[2]["reward_model"]["ground_truth"] = " "
    with pytest.raises(ConfigError, match=r"row 2: field 'reward_model.ground_truth'"):
        load_dapo_parquet(write(tmp_path, rows))


def test_an_aime24_file_loads_with_answer_or_boxed_solution(tmp_path):
    rows = [{"id": 60, "problem": "Find x.", "solution": "so \\boxed{204}", "url": "u"},
            {"id": 61, "problem": "Find y.", "solution": "\\boxed{\\frac{1}{2}}", "url": "u"}]
    recs = load_aime_parquet(write(tmp_path, rows))
    assert [r["reward_model"]["ground_truth"] for r in recs] == ["204", "\\frac{1}{2}"]
    assert question_of_record(recs[0]) == "Find x."
    h4 = [{"id": 1, "problem": "P", "solution": "long text", "answer": "33", "url": "u",
           "year": "2024"}]
    assert load_aime_parquet(write(tmp_path, h4, "h4.parquet"))[0]["reward_model"][
        "ground_truth"] == "33"


def test_an_aime24_file_without_an_answer_column_or_with_unknown_columns_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"missing column\(s\) \['answer \(or solution\)'\]"):
        load_aime_parquet(write(tmp_path, [{"id": 1, "problem": "P"}]))
    with pytest.raises(ConfigError, match=r"unexpected column\(s\) \['difficulty'\]"):
        load_aime_parquet(write(tmp_path, [{"problem": "P", "answer": "1", "difficulty": 3}]))


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="nope.parquet: no such file"):
        load_dapo_parquet(tmp_path / "nope.parquet")
