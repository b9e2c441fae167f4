"""Training on several slots of the cluster driver: FSDP2 over gloo across the slots the
training replica holds, beside each slot's own default group (vLLM's world of one), moved
between slots by shift down / shift up as PivotRL moves it (sec. 5.2, 8.1).

One in-process ``Trainer`` is the single-slot reference; every step on the mesh must give
its loss and, after the GPS Write, its weights, whichever slots trained and how many.
"""

import functools
import logging

import pytest
import torch

from pivot.types import POLICY, Role

pytestmark = pytest.mark.monarch

LR = 1e-3
LOSS_RTOL = 1e-5
WEIGHT_ATOL = 0.05 * LR
"""As tests/roles/test_trainer_fsdp.py: the ranks sum the loss in another order (fp32 noise
~1e-7 relative), which Adam's m / sqrt(v) amplifies for elements whose gradient is near 0."""


class _Control:
    """The part of ``ClusterControl`` the trainer port uses: training's devices."""

    def __init__(self, ctl):
        self.ctl, self.publishes = ctl, 0

    def training_devices(self):
        rid = self.ctl.shifter.training_replica()
        return self.ctl.device_map.replica_devices(rid) if rid else ()


@pytest.fixture(scope="module", params=["full_reads", "rank_reads"])
def slots(tiny_model, request):
    """4 slots with only a training context each (built beside a world-of-one default
    group), GPS holding the tiny policy. ``rank_reads``: a 2-slot training replica's ranks
    Read only their rows of each tensor (``FsdpShardLayouts``, as ``ClusterStack`` runs);
    ``full_reads``: every rank Reads a full copy."""
    from safetensors.torch import load_file

    from pivot.gps.actor import GPSActor
    from pivot.gps.layout import ModelMeta, plan_storage
    from pivot.cluster.control import ClusterTrainer
    from pivot.runtime.gps_source import FsdpShardLayouts, GPSParameterSource
    from pivot.runtime.mesh import MeshController
    from pivot.runtime.provision import spawn_host_service
    from pivot.testing.trainer import trainer_beside_world_of_one

    logging.getLogger("pivot").setLevel(logging.INFO)
    sd = {k: v.float() for k, v in load_file(f"{tiny_model}/model.safetensors").items()}
    metas = {POLICY: ModelMeta.from_state_dict(POLICY, sd)}
    storage = plan_storage(list(metas.values()), 1, 1 << 30)
    gps = spawn_host_service("gps", GPSActor, 0, storage, metas)
    source = GPSParameterSource([gps], metas, storage, (0,) * 4)
    source.gps.load(POLICY, sd)
    factory = functools.partial(trainer_beside_world_of_one, tiny_model, LR, 128, 0)
    layouts = (FsdpShardLayouts(metas, {POLICY: 2}) if request.param == "rank_reads"
               else None)   # the tiny policy has 2 KV heads
    ctl = MeshController.local(4, source, {Role.TRAINING: factory}, layouts=layouts)
    port = ClusterTrainer(ctl, None, _Control(ctl), source, 0)
    yield ctl, port, source, sd, request.param
    ctl.stop()
    source.gps.close()
    gps.close.call_one().get()


def _batch(seed: int, vocab: int):
    from pivot.rl.batch import TrainBatch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (12, 40), generator=g)
    mask = torch.zeros(12, 40)
    mask[:, 10:] = 1
    old = -5.0 + 0.3 * torch.randn(12, 40, generator=g)
    return TrainBatch(ids, mask, torch.randn(12, generator=g), old)


def test_two_slots_train_like_one_across_moves_between_slots(slots, tiny_model):
    from pivot.roles.trainer import Trainer

    ctl, port, source, sd, reads = slots
    ref = Trainer(Trainer.Config(model=tiny_model, max_seq_len=128,
                                 optimizer=Trainer.Optimizer(lr=LR)))
    ref.setup()
    ref.load_hf_state_dict(sd)
    vocab = ref.shape.vocab_size
    # (devices, optimizer sent by the driver before the step, group rebuilt at shift up)
    plan = [((2, 3), False, True),    # fresh run on 2 slots
            ((0, 1), True, True),     # moved to 2 other slots: full state sent, resharded
            ((0, 1), False, False),   # the same slots again: group preserved, shards reloaded
            ((3,), True, True),       # 1 slot (from 2): rebuilt unsharded
            ((1, 2), True, True)]     # 2 slots again, one of them new
    worst_w = worst_loss = 0.0
    for version, (devs, sent, rebuilt) in enumerate(plan):
        rid = f"training-{version}"
        up = ctl.shifter.shift_up(Role.TRAINING, rid, devs)
        assert ("rebuild_model" in up.phases) == rebuilt, (devs, up.phases)
        batch = _batch(version, vocab)
        moves = port.optimizer_moves
        m = port.train_batch(batch, version)
        assert port.optimizer_moves - moves == int(sent), (devs, port.optimizer_moves)
        assert m["trainer/world_size"] == len(devs)
        ref.version = version
        want = ref.forward_backward(batch)
        want.update(ref.optim_step())
        rel = abs(m["trainer/fb/loss"] / want["trainer/fb/loss"] - 1)
        worst_loss = max(worst_loss, rel)
        assert rel <= LOSS_RTOL, (devs, m["trainer/fb/loss"], want["trainer/fb/loss"])
        assert m["trainer/optim/grad_norm"] == pytest.approx(
            want["trainer/optim/grad_norm"], rel=LOSS_RTOL)
        # GPS Write: rank reads -> every rank stages its own rows of one Write; full reads
        # -> both ranks gather, rank 0 writes
        v0 = source.gps.latest(POLICY)
        ctl.write_back_replica(devs).get()
        assert source.gps.latest(POLICY) == v0 + 1
        got = source.read(POLICY, (0,))[0]
        expect = ref.state_dict_hf()
        diff = max(float((got[k] - expect[k]).abs().max()) for k in expect)
        worst_w = max(worst_w, diff)
        assert diff <= WEIGHT_ATOL, f"step {version} on {devs}: weights differ by {diff:.2e}"
        info = [ctl.describe(d)["contexts"]["training"]["group"] for d in devs]
        assert [g["rank"] for g in info] == list(range(len(devs)))
        ctxs = [ctl.describe(d)["contexts"]["training"] for d in devs]
        rows = reads == "rank_reads" and len(devs) == 2
        assert [c["last_read"] for c in ctxs] == ["rows" if rows else "full"] * len(devs)
        full_bytes = sum(t.numel() * t.element_size() for t in sd.values())
        assert sum(c["read_bytes"] for c in ctxs) == (full_bytes if rows
                                                      else full_bytes * len(devs))
        ctl.shifter.shift_down(rid)
    logging.getLogger(__name__).warning("worst loss rel diff %.2e, worst weight diff %.2e",
                                        worst_loss, worst_w)
    # the driver's copy of the state equals the reference's AdamW state
    full = port.optimizer["state"]
    want = ref.full_optimizer_state()["state"]
    assert set(full) == set(want)
    for name in want:
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.allclose(full[name][k], want[name][k], atol=1e-6, rtol=1e-3), name
        assert float(full[name]["step"]) == float(want[name]["step"]) == len(plan)
