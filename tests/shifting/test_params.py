"""The in-memory parameter source: Read copies, Write checks names and shapes."""

import pytest
import torch

from pivot.errors import StateError
from pivot.testing.shifting import InMemoryParameterSource


def test_a_read_returns_copies_per_device_and_a_write_replaces_the_model():
    src = InMemoryParameterSource({"policy": {"w": torch.ones(2, 3)}})
    out = src.read("policy", (0, 3))
    assert set(out) == {0, 3} and torch.equal(out[3]["w"], torch.ones(2, 3))
    out[0]["w"].zero_()
    assert torch.equal(src.read("policy", (1,))[1]["w"], torch.ones(2, 3))
    src.write("policy", (0,), None, {0: {"w": torch.full((2, 3), 2.0)}})
    assert torch.equal(src.read("policy", (0,))[0]["w"], torch.full((2, 3), 2.0))


@pytest.mark.parametrize("call,match", [
    (lambda s: s.read("critic", (0,)), "unknown model 'critic'"),
    (lambda s: s.read("policy", (0,), layout="tp2"), "replicated models only"),
    (lambda s: s.write("policy", (0,), None, {0: {"v": torch.ones(2, 3)}}), "names differ"),
    (lambda s: s.write("policy", (0,), None, {0: {"w": torch.ones(3, 2)}}),
     "w is \\(3, 2\\) torch.float32, stored \\(2, 3\\)"),
])
def test_bad_reads_and_writes_name_the_model_and_the_problem(call, match):
    src = InMemoryParameterSource({"policy": {"w": torch.ones(2, 3)}})
    with pytest.raises(StateError, match=match):
        call(src)
