"""A tensor-parallel replica inside the slot runtime: two slots of one
process per role, whose rollout engines are the two ranks of a TP=2 ``external_launcher``
replica of the policy. Only the replica's first device is driven; rank 0 mirrors every
engine call, shift steps included, to rank 1 (``pivot.roles.engine.mirror``). Its greedy
tokens equal a TP=1 engine's across sleep/wake cycles and an abort mid-run."""

import time
from pathlib import Path

import pytest
import torch

from pivot.errors import StateError
from pivot.roles.engine.config import EngineConfig, read_hf_config
from pivot.roles.engine.requests import GenRequest
from pivot.roles.engine.shards import vllm_tp_split_dim
from pivot.testing.replicas import generate as greedy
from pivot.testing.replicas import two_slot_mesh
from pivot.types import POLICY, Role

pytestmark = [pytest.mark.engine, pytest.mark.monarch, pytest.mark.slow]

CACHE = str(Path(__file__).resolve().parents[2] / "cache")
PROMPTS = [[1, 5 + 7 * i, 17 + i, 42 + 3 * i, 9] for i in range(4)]


def _cpu_shm() -> set[str]:
    """vLLM's CPU communicator segments on this machine (4 MB a TP rank)."""
    return {p.name for p in Path("/dev/shm").glob("*-cpushm_*")}


@pytest.fixture(scope="module")
def tp_mesh(tiny_model):
    # the reward role serves the same weights at TP=1: the reference
    common = dict(cache_dir=CACHE, num_blocks=64, max_num_seqs=8)
    before = _cpu_shm()
    with two_slot_mesh("gps_tp", tiny_model, {
            Role.ROLLOUT: EngineConfig(tiny_model, tensor_parallel_size=2, **common),
            Role.REWARD: EngineConfig(tiny_model, **common)}) as (ctl, _):
        yield ctl
        assert len(_cpu_shm() - before) == 2, "the TP=2 replica's ranks hold a segment each"
    # the slot procs are stopped, not exited: their segments are removed by port
    assert not _cpu_shm() - before, "TP segments left in /dev/shm after the mesh stopped"


def generate(ctl, device: int, abort_first: bool = False) -> dict[int, list[int]]:
    return greedy(ctl, device, PROMPTS, abort_first=abort_first)


def test_a_tp2_replica_gives_tp1_tokens_across_sleep_wake_cycles(tp_mesh):
    m, sh = tp_mesh, tp_mesh.shifter
    sh.shift_up(Role.REWARD, "ref", (0,))
    want = generate(m, 0)
    sh.shift_down("ref")
    assert all(len(t) == 24 for t in want.values())
    for cycle in range(3):
        res = sh.shift_up(Role.ROLLOUT, f"tp-{cycle}", (0, 1))
        assert res.kv_capacity == 64 * 32
        got = generate(m, 0, abort_first=cycle == 2)
        if cycle == 2:   # the aborted one stopped early; the others are unchanged
            assert got[0] == want[0][:len(got[0])]
            got, ref = {s: t for s, t in got.items() if s}, {s: want[s] for s in (1, 2, 3)}
        else:
            ref = want
        assert got == ref, f"cycle {cycle}"
        sh.shift_down(f"tp-{cycle}", Role.REWARD)
        sh.shift_up(Role.REWARD, f"between-{cycle}", (1,))   # the other model wakes
        sh.shift_down(f"between-{cycle}")
    ranks = [m.describe(d)["contexts"]["rollout"] for d in (0, 1)]
    assert [r["tp_rank"] for r in ranks] == [0, 1]
    deadline = time.monotonic() + 30   # the follower applies what rank 0 sent, in order
    while (m.describe(1)["contexts"]["rollout"]["mirrored_calls"] <
           m.describe(0)["contexts"]["rollout"]["mirrored_calls"]):
        assert time.monotonic() < deadline, "the follower fell behind rank 0's calls"
        time.sleep(0.2)


def test_requests_to_a_follower_rank_and_unaligned_replicas_are_refused(tp_mesh):
    m, sh = tp_mesh, tp_mesh.shifter
    with pytest.raises(StateError, match="tensor-parallel blocks of 2 aligned devices"):
        m.start_shift_up(Role.ROLLOUT, "bad", (1,))
    sh.shift_up(Role.ROLLOUT, "tp-f", (0, 1))
    with pytest.raises(Exception, match="follower rank of a tensor-parallel replica"):
        m.engine(1).submit([GenRequest(9, [1, 2, 3])]).get()
    sh.shift_down("tp-f")



def test_each_follower_reads_from_gps_the_version_rank_0_loaded(tp_mesh, tiny_model):
    # the frozen GenRM cannot take a new version, so the TP=1 reference is the policy's
    # base version: a new one decodes differently, the base again decodes as before
    m, sh, source = tp_mesh, tp_mesh.shifter, tp_mesh.source
    base = source.read(POLICY, (0,))[0]
    g = torch.Generator().manual_seed(7)
    new = {k: v + 0.3 * v.std() * torch.randn(v.shape, generator=g) if v.dim() > 1 else v
           for k, v in base.items()}
    reads = m.describe(1)["contexts"]["rollout"]["follower_reads"]
    out = []
    try:
        for state in (new, new, base):
            source.gps.load(POLICY, state)
            sh.shift_up(Role.ROLLOUT, "tp-v", (0, 1))
            out.append(generate(m, 0))
            sh.shift_down("tp-v")
    finally:
        source.gps.load(POLICY, base)
    sh.shift_up(Role.REWARD, "ref", (0,))
    want = generate(m, 0)
    sh.shift_down("ref")
    assert out[0] == out[1] != want and out[2] == want
    # rank 0 held each version it named until the follower had Read it, then let go:
    # GPS keeps the latest only
    latest = source.gps.latest(POLICY)
    assert [h.versions(POLICY) for h in source.gps.hosts] == [[latest]] * len(source.gps.hosts)
    follower = m.describe(1)["contexts"]["rollout"]
    assert follower["follower_reads"] == reads + 3 and follower["follower_failed"] == []
    # each rank Read only what its loaders read: half of every split tensor, the
    # vocabulary whole (vLLM pads its ranges), nowhere near a full copy
    full = sum(v.numel() * v.element_size() for v in base.values())
    cfg = read_hf_config(tiny_model)[0]
    own = sum(v.numel() * v.element_size() // (1 if vllm_tp_split_dim(
        k, v.shape, tp=2, kv_heads=cfg["num_key_value_heads"]) is None else 2)
        for k, v in base.items())
    for d in (0, 1):
        assert m.describe(d)["contexts"]["rollout"]["read_bytes"] == own < 0.6 * full


def test_a_failed_tp_shift_up_is_rolled_back_on_both_ranks_and_serves_after(tp_mesh):
    # rank 0's Read fails after rank 1 came up: rank 0 rolls back (its releases mirrored
    # to rank 1), restore shifts rank 1 down, and the block serves as TP=1 again
    from pivot.shifting.role_shift import SlotKind
    from pivot.shifting.shifter import ShiftError

    m, sh = tp_mesh, tp_mesh.shifter
    sh.shift_up(Role.REWARD, "ref", (0,))
    want = generate(m, 0)
    sh.shift_down("ref")
    m.actor(0, Role.ROLLOUT).inject_fault.call_one(Role.ROLLOUT, 0).get()
    with pytest.raises(ShiftError, match="injected fault in the GPS Read of rollout"):
        sh.shift_up(Role.ROLLOUT, "tp-fails", (0, 1))
    assert [m.device_map.state(d).kind for d in (0, 1)] == [SlotKind.LOST] * 2
    assert m.restore((0, 1)) == (0, 1)
    ranks = [m.describe(d) for d in (0, 1)]
    assert [r["role"] for r in ranks] == [None, None]
    assert ranks[0]["failed_shift"]["clean"]
    sh.shift_up(Role.ROLLOUT, "tp-after", (0, 1))
    try:
        assert generate(m, 0) == want
    finally:
        sh.shift_down("tp-after")
