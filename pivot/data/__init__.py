"""Math data for the RL loop: generated arithmetic in the DAPO-Math-17k schema, and loaders
for the real DAPO-Math-17k and AIME24 parquet files.

API used by the RL loop::

    from pivot.data import MathTaskConfig, iterate_prompts, validation_records
    cfg = MathTaskConfig(seed=0)
    for batch in iterate_prompts(cfg, batch_size=32):   # endless; lists of records
        text = render_prompt(rec["prompt"])             # what the policy continues
        truth = rec["reward_model"]["ground_truth"]
        problem = question_of_record(rec)               # what the GenRM is shown
    val = validation_records(cfg)                       # held out; score accuracy@1

    load_dapo_parquet(path) / load_aime_parquet(path)   # validated records, same schema

Records carry ``data_source``, ``prompt`` ([{"role", "content"}]), ``ability``,
``reward_model`` ({"ground_truth", "style"}) and ``extra_info`` ({"index", ...}).
"""

from pivot.data.arithmetic import LEVELS, Problem, sample_problems
from pivot.data.dataset import (MathTaskConfig, iterate_prompts, training_problems,
                                training_records, validation_problems, validation_records)
from pivot.data.loaders import load_aime_parquet, load_dapo_parquet
from pivot.data.records import (DAPO_FIELDS, ground_truth, make_record, question_of_record,
                                validate_record)
from pivot.data.template import (ANSWER_PREFIX, format_response, problem_content,
                                 render_prompt)

__all__ = ["ANSWER_PREFIX", "DAPO_FIELDS", "LEVELS", "MathTaskConfig", "Problem",
           "format_response", "ground_truth", "iterate_prompts", "load_aime_parquet",
           "load_dapo_parquet", "make_record", "problem_content", "question_of_record",
           "render_prompt", "sample_problems", "training_problems", "training_records",
           "validate_record", "validation_problems", "validation_records"]
