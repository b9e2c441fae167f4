"""Engine fixtures: one in-process vLLM engine per test session, on the session's tiny
random Qwen3 (``tiny_model`` and ``engine_config`` are in ``tests/conftest.py``); and the
trainer tests' tiny transformers reference, batches and trainers."""

import pytest
import torch

from pivot.testing.engine import random_state_dict


@pytest.fixture(scope="session")
def engine(engine_config):
    from pivot.roles.engine.vllm_engine import VllmEngine

    e = VllmEngine(engine_config)
    yield e
    e.shutdown()


@pytest.fixture(scope="session")
def slot_pair(engine_config, tiny_genrm):
    """One device slot's two generator contexts, started once per session: rollout on the
    tiny policy (its own engine, seed 1, not the ``engine`` fixture's) and reward on
    ``tiny_genrm`` (its own config: 128 blocks, context 256). Both start asleep; each test
    leaves them shifted down."""
    import dataclasses

    from pivot.roles.engine.config import EngineConfig
    from pivot.roles.engine.loop import close_shared_loops
    from pivot.roles.generator import GeneratorContext
    from pivot.types import Role

    ro = GeneratorContext(Role.ROLLOUT, dataclasses.replace(engine_config, seed=1))
    rm = GeneratorContext(Role.REWARD, EngineConfig(tiny_genrm, max_model_len=256,
                                                    num_blocks=128, cpu_core=0,
                                                    cache_dir=engine_config.cache_dir))
    yield ro, rm
    close_shared_loops()


@pytest.fixture(scope="session")
def genrm_weights(tiny_genrm):
    """Two random state dicts of the tiny GenRM's shape."""
    return random_state_dict(tiny_genrm, 21), random_state_dict(tiny_genrm, 22)


@pytest.fixture(scope="session")
def hf_genrm(tiny_genrm):
    return HFReference(tiny_genrm)


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


# ---- the trainer tests (test_trainer.py, test_trainer_fsdp.py) ---------------------------

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, vocab_size=512, max_position_embeddings=128,
            rope_theta=1e6)
"""The transformers ``Qwen3Config`` fields of the trainer tests' tiny model."""


def _hf_model(tie: bool = False, seed: int = 0):
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.Qwen3Config(**TINY, tie_word_embeddings=tie)
    return transformers.Qwen3ForCausalLM(cfg).eval()


def _hf_logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits.float(), -1)
    picked = logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(picked, (1, 0))


def _make_batch(b: int = 8, length: int = 24, prompt: int = 6, seed: int = 0,
                old_noise: float = 0.0, ref_lp: torch.Tensor | None = None):
    from pivot.losses.grpo import group_advantages
    from pivot.rl.batch import TrainBatch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, TINY["vocab_size"], (b, length), generator=g)
    mask = torch.zeros(b, length, dtype=torch.long)
    for i in range(b):
        end = int(torch.randint(prompt + 2, length + 1, (1,), generator=g))
        mask[i, prompt:end] = 1
        ids[i, end:] = 0  # padding
    adv = group_advantages(torch.rand(b, generator=g), group_size=4)
    old = None
    if ref_lp is not None:
        old = ref_lp + old_noise * torch.randn(b, length, generator=g)
    return TrainBatch(ids, mask, adv, old, torch.zeros(b, dtype=torch.long))


def _make_trainer(hf, lr: float = 1e-3, **kw):
    from pivot.roles.trainer import Trainer

    tr = Trainer(Trainer.Config(model=hf.config.to_dict(),
                                optimizer=Trainer.Optimizer(lr=lr), **kw))
    tr.setup()
    tr.load_hf_state_dict(hf.state_dict())
    return tr


@pytest.fixture(scope="session")
def tiny_qwen3():
    """The ``Qwen3Config`` fields of the trainer tests' tiny model (a fresh dict)."""
    return dict(TINY)


@pytest.fixture(scope="session")
def hf_model():
    """``hf_model(tie=False, seed=0)``: a random transformers ``Qwen3ForCausalLM`` of
    ``tiny_qwen3`` in eval mode, the trainer tests' outside reference."""
    return _hf_model


@pytest.fixture(scope="session")
def hf_logprobs():
    """``hf_logprobs(model, ids)``: [B, L] log p(ids[t] | ids[:t]) under a transformers
    model (column 0 = 0)."""
    return _hf_logprobs


@pytest.fixture(scope="session")
def make_batch():
    """``make_batch(b=8, length=24, prompt=6, seed=0, old_noise=0.0, ref_lp=None)``: a GRPO
    ``TrainBatch`` of groups of 4 responses, random lengths, right padded; with ``ref_lp``
    its old log-probs are ``ref_lp`` plus ``old_noise`` Gaussian noise."""
    return _make_batch


@pytest.fixture(scope="session")
def make_trainer():
    """``make_trainer(hf, lr=1e-3, **config)``: a set-up ``Trainer`` holding the weights of
    the transformers model ``hf``."""
    return _make_trainer
