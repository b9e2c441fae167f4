"""Engine fixtures: one in-process vLLM engine per test session, on the session's tiny
random Qwen3 (``tiny_model`` and ``engine_config`` are in ``tests/conftest.py``)."""

import pytest
import torch

from pivot.roles.engine.tiny import random_state_dict


@pytest.fixture(scope="session")
def engine(engine_config):
    from pivot.roles.engine.vllm_engine import VllmEngine

    e = VllmEngine(engine_config)
    yield e
    e.shutdown()


@pytest.fixture(scope="session")
def weights(tiny_model):
    """Two different random state dicts (HF names), standing in for two GPS Reads."""
    return random_state_dict(tiny_model, 11), random_state_dict(tiny_model, 12)


class HFReference:
    """transformers' greedy generation and per-token log-probs for a state dict."""

    def __init__(self, model_dir):
        from transformers import Qwen3ForCausalLM

        self.model = Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def load(self, state):
        self.model.load_state_dict(state, strict=False)
        self.model.tie_weights()
        return self

    @torch.no_grad()
    def greedy(self, prompt, n):
        out = self.model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n,
                                  do_sample=False, pad_token_id=0)
        return out[0, len(prompt):].tolist()

    @torch.no_grad()
    def logprobs(self, prompt, tokens):
        ids = torch.tensor([prompt + tokens])
        logp = torch.log_softmax(self.model(ids).logits[0].float(), dim=-1)
        pos = torch.arange(len(prompt) - 1, len(prompt) + len(tokens) - 1)
        return logp[pos, torch.tensor(tokens)].tolist()


@pytest.fixture(scope="session")
def hf(tiny_model):
    return HFReference(tiny_model)


@pytest.fixture(scope="session")
def hf_disk(tiny_model):
    """transformers with the weights on disk (what a freshly started engine serves)."""
    return HFReference(tiny_model)
