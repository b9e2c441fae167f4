"""An expert-parallel GenRM replica inside the slot runtime (EP, as the paper
serves its MoE GenRMs): two slots of one process per role whose
reward engines are the two ranks of an ``external_launcher`` replica of a tiny Qwen3-MoE
with ``enable_expert_parallel`` (each rank 2 of the 4 experts of every layer, attention
TP=2). Rank 0 mirrors every engine call; each rank Reads its part from GPS (its own
experts whole, none of the others', the rest in halves: ``ep_expert_owner``,
``vllm_tp_split_dim``). Its greedy tokens equal a TP=1 engine's
on the same weights across sleep/wake cycles, the policy's engines waking in between."""

from pathlib import Path

import pytest
import torch

from pivot.roles.engine.config import EngineConfig, read_hf_config
from pivot.roles.engine.shards import ep_expert_owner, vllm_tp_split_dim
from pivot.testing.replicas import generate as greedy
from pivot.testing.replicas import two_slot_mesh
from pivot.types import Role

pytestmark = [pytest.mark.engine, pytest.mark.monarch, pytest.mark.slow]

CACHE = str(Path(__file__).resolve().parents[2] / "cache")
PROMPTS = [[1, 5 + 7 * i, 17 + i, 42 + 3 * i, 9] for i in range(4)]


@pytest.fixture(scope="module")
def ep_mesh(tiny_moe):
    # the rollout role serves the same weights at TP=1: the reference
    common = dict(cache_dir=CACHE, num_blocks=64, max_num_seqs=8)
    with two_slot_mesh("gps_ep", tiny_moe, {
            Role.ROLLOUT: EngineConfig(tiny_moe, **common),
            Role.REWARD: EngineConfig(tiny_moe, tensor_parallel_size=2, expert_parallel=True,
                                      **common)}) as mesh:
        yield mesh


def generate(ctl, device: int) -> dict[int, list[int]]:
    return greedy(ctl, device, PROMPTS, ignore_eos=True)


def test_an_ep2_genrm_replica_gives_tp1_tokens_across_sleep_wake_cycles(ep_mesh, tiny_moe):
    m, sd = ep_mesh
    sh = m.shifter
    sh.shift_up(Role.ROLLOUT, "ref", (0,))
    want = generate(m, 0)
    sh.shift_down("ref")
    assert all(len(t) == 24 for t in want.values())
    assert len({tuple(t) for t in want.values()}) == 4
    for cycle in range(3):
        sh.shift_up(Role.REWARD, f"ep-{cycle}", (0, 1))
        assert generate(m, 0) == want, f"cycle {cycle}"
        sh.shift_down(f"ep-{cycle}", Role.ROLLOUT)
        sh.shift_up(Role.ROLLOUT, f"between-{cycle}", (1,))   # the other engine wakes
        sh.shift_down(f"between-{cycle}")
    # each rank Read its own 2 experts of 4 whole, none of the other rank's, and half of
    # every other split tensor
    cfg = read_hf_config(tiny_moe)[0]

    def part(rank: int, name: str, v: torch.Tensor) -> int:
        owner = ep_expert_owner(name, experts=4, ep=2)
        if owner is not None:
            return v.numel() * v.element_size() if owner == rank else 0
        d = vllm_tp_split_dim(name, v.shape, tp=2, kv_heads=cfg["num_key_value_heads"],
                              expert_parallel=True)
        return v.numel() * v.element_size() // (1 if d is None else 2)

    full = sum(v.numel() * v.element_size() for v in sd.values())
    experts = sum(v.numel() * v.element_size() for k, v in sd.items() if ".experts." in k)
    for d in (0, 1):
        ctx = m.describe(d)["contexts"]["reward"]
        own = sum(part(d, k, v) for k, v in sd.items())
        assert ctx["tp_rank"] == d and ctx["read_bytes"] == own
        assert own < full - experts / 2 + 1   # half the experts' bytes never crossed
