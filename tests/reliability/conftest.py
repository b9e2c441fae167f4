"""Engine fixtures for the real-actor fault tests: one tiny random Qwen3 per session."""

import os

import pytest

CACHE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "cache"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    from pivot.roles.engine.tiny import make_tiny_qwen3
    return str(make_tiny_qwen3(tmp_path_factory.mktemp("models") / "tiny", seed=0))


@pytest.fixture(scope="session")
def engine_config(tiny_model):
    from pivot.roles.engine.config import EngineConfig
    return EngineConfig(tiny_model, cache_dir=CACHE, cpu_core=0, num_blocks=256)
