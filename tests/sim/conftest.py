"""Sim-driver fixtures shared by the tests of this folder."""

import pytest

from pivot.scheduler.throughput import ThroughputModel
from pivot.spec.model_group import ModelGroup
from pivot.spec.lengths import LengthModel
from pivot.spec.profile import ModelProfile, ShiftCost, TrainingProfile

TM = ThroughputModel(A=1e-8, B=0.0, C=4e-4, D=0.007)
TRAINING_FIT = dict(update_mfu=0.5613, update_serial=0.02253, logprob_mfu=0.8748,
                    logprob_serial=0.01501)
"""gin/base.gin's training fit (TrainingProfile has no default for it)."""
SHIFT_COST = ShiftCost(inference_read_gbs=63.0, inference_up_s=0.8, training_read_gbs=63.0,
                       training_up_s=2.0)
"""Round shift costs for these tests (the link's peak, no fit; ShiftCost has no default)."""


def _group(**kw) -> ModelGroup:
    pol = ModelProfile("p", 7.6, 7.6, 57344, 1, throughput=TM)
    rm = ModelProfile("r", 30.5, 3.3, 98304, 4, throughput=TM)
    lengths = LengthModel(response_median=300, judge_median=200, response_cap=2000,
                          judge_cap=2000)
    return ModelGroup("t", 16, pol, rm, TrainingProfile(4, **TRAINING_FIT), lengths=lengths,
                      shift_cost=SHIFT_COST, prompts_per_step=8, n=4, **kw)


@pytest.fixture
def make_group():
    """Builds a small model group: 16 devices, a 1-device policy and a 4-device GenRM
    sharing one throughput model, 8 prompts x 4 responses per step, short lengths;
    keyword arguments go to ``ModelGroup``."""
    return _group
