"""Fixtures shared across test folders: one tiny random Qwen3 and its engine config per
test session (``tests/roles`` starts one vLLM engine on them, ``tests/reliability`` spawns
generator actors from the config), and one ``ClusterStack`` (``tests/local`` and
``tests/reliability`` run the cluster driver on it).

Session scope: the model is written once and every engine built from it starts once per
session, never per test. Imports are lazy so folders that use none of this collect fast.
"""

import os

import pytest

CACHE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "cache"))
"""The repository's cache folder (vLLM, inductor and temporary files)."""


@pytest.fixture(autouse=True)
def _no_gin_config_after_a_test():
    """Each test leaves an empty, unlocked gin config: gin locks the config it parsed, and
    a binding one test parsed (say ``PivotPlanner.min_replicas`` from gin/tiny_cpu.gin)
    would otherwise reach the configurables another test builds."""
    yield
    import gin

    gin.clear_config()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A random tiny Qwen3 folder (2 layers, hidden 128, head_dim 32, vocab 448)."""
    from pivot.roles.engine.tiny import make_tiny_qwen3

    return str(make_tiny_qwen3(tmp_path_factory.mktemp("models") / "tiny", seed=0))


@pytest.fixture(scope="session")
def tiny_genrm(tmp_path_factory):
    """A second random tiny Qwen3 of another shape (3 layers, hidden 64, 2 heads, 1 KV head,
    context 256): the GenRM of a slot's second engine, so nothing between the two engines
    may rest on a shared shape or length."""
    from pivot.roles.engine.tiny import make_tiny_qwen3

    return str(make_tiny_qwen3(tmp_path_factory.mktemp("models") / "tiny_genrm", seed=1,
                               hidden=64, layers=3, heads=2, kv_heads=1, max_len=256))


@pytest.fixture(scope="session")
def tiny_moe(tmp_path_factory):
    """A random tiny Qwen3-MoE (4 experts, top 2, 2 layers): the MoE GenRM's shape."""
    from pivot.roles.engine.tiny import make_tiny_qwen3_moe

    return str(make_tiny_qwen3_moe(tmp_path_factory.mktemp("models") / "moe", seed=0))


@pytest.fixture(scope="session")
def engine_config(tiny_model):
    """The engine config of one device slot serving ``tiny_model`` (core 0, 256 blocks)."""
    from pivot.roles.engine.config import EngineConfig

    return EngineConfig(tiny_model, cache_dir=CACHE, cpu_core=0, num_blocks=256)


GROUP = dict(n=2, max_response_tokens=16, max_judge_tokens=16)
"""The local group of the shared stack (``ClusterGroup`` overrides): 2 responses per prompt,
16-token responses and judgements, so a few RL steps take seconds."""


@pytest.fixture(scope="session")
def stack():
    """One ``ClusterStack`` (GPS, 4 device slots, one vLLM engine and one trainer context
    each) for the whole session: engines start once (about 50-80 s on 2 cores); each run
    resets the slots to idle and GPS to the initial weights, never restarting an engine."""
    from pivot.config.validation import default_of
    from pivot.cluster.config import OptimizerConfig, RunConfig
    from pivot.cluster.cpu.config import CpuConfig
    from pivot.cluster.group import ClusterGroup
    from pivot.cluster.stack import ClusterStack

    # the settings a ClusterDriver built without them uses, so every test's driver fits it
    s = ClusterStack(ClusterGroup(**GROUP), default_of(RunConfig, "seed"),
                     default_of(OptimizerConfig, "lr"), default_of(CpuConfig, "share")).start()
    yield s
    s.close()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """After the session's fixtures are torn down (the stack's procs stopped), shut
    Monarch's client down with time to finish, instead of in its own 1-second atexit
    call, which timed out after every full run and sometimes aborted the process after
    every test passed (``pivot.compat.monarch.shutdown_client``)."""
    from pivot.compat.monarch import shutdown_client

    shutdown_client()
