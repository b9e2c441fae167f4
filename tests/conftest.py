"""Fixtures shared across test folders: one tiny random Qwen3 and its engine config per
test session (``tests/roles`` starts one vLLM engine on them, ``tests/reliability`` spawns
generator actors from the config).

Session scope: the model is written once and every engine built from it starts once per
session, never per test. Imports are lazy so folders that use none of this collect fast.
"""

import os

import pytest

CACHE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "cache"))
"""The repository's cache folder (vLLM, inductor and temporary files)."""


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A random tiny Qwen3 folder (2 layers, hidden 128, head_dim 32, vocab 448)."""
    from pivot.roles.engine.tiny import make_tiny_qwen3

    return str(make_tiny_qwen3(tmp_path_factory.mktemp("models") / "tiny", seed=0))


@pytest.fixture(scope="session")
def engine_config(tiny_model):
    """The engine config of one device slot serving ``tiny_model`` (core 0, 256 blocks)."""
    from pivot.roles.engine.config import EngineConfig

    return EngineConfig(tiny_model, cache_dir=CACHE, cpu_core=0, num_blocks=256)
