"""A slot of a multi-device replica Reads only its own TP shard (sec. 5.1, Read(M, G, P)):
real Monarch slots of the shared mesh, the replica's layout from the controller."""

import pytest
import torch

from pivot.errors import ConfigError
from pivot.gps.layout import ModelMeta
from pivot.runtime.gps_source import TensorParallelReplicas
from pivot.types import GENRM, MODEL_OF_ROLE, POLICY, Role

pytestmark = pytest.mark.monarch

SPLIT = {"0.weight": 0, "0.bias": 0, "2.weight": 1, "2.bias": None}
"""TinyMLP: column-parallel first Linear, row-parallel second (its bias replicated)."""


@pytest.fixture
def tp_mesh(idle_mesh, models):
    metas = {m: ModelMeta.from_state_dict(m, sd) for m, sd in models.items()}
    idle_mesh.layouts = TensorParallelReplicas(metas, split_dim=lambda n, s: SPLIT[n])
    yield idle_mesh
    idle_mesh.layouts = None


def stored(mesh, model):
    """The full tensors GPS holds now (an earlier test may have written the policy)."""
    return mesh.source.read(model, (0,))[0]


def expected_shard_bytes(full, k):
    return sum(t.nbytes // (k if SPLIT[n] is not None else 1) for n, t in full.items())


@pytest.mark.parametrize("role,devices", [(Role.ROLLOUT, (0, 1, 2, 3)), (Role.REWARD, (3, 1))])
def test_each_slot_of_a_tp_replica_reads_its_own_shard_and_they_tile_the_model(
        tp_mesh, models, role, devices):
    m, k = tp_mesh, len(devices)
    full = stored(m, MODEL_OF_ROLE[role])
    m.shifter.shift_up(role, "tp-0", devices)
    shards = [m.tensors(d, role, "weights") for d in devices]  # rank order of the layout
    for name, t in full.items():
        d = SPLIT[name]
        if d is None:
            assert all(torch.equal(s[name], t) for s in shards), name
        else:
            assert all(s[name].shape[d] == t.shape[d] // k for s in shards), name
            assert torch.equal(torch.cat([s[name] for s in shards], dim=d), t), name
    model_bytes = sum(t.nbytes for t in full.values())
    for dev in devices:
        got = m.describe(dev)["contexts"][role.value]["weights_bytes"]
        assert got == expected_shard_bytes(full, k)
        assert got <= model_bytes / k * 1.1  # ~1/k: only the tiny replicated bias is whole
    m.shifter.shift_down("tp-0")


def test_one_device_replicas_and_training_still_get_full_copies(tp_mesh, models):
    m = tp_mesh
    full = stored(m, POLICY)
    m.shifter.shift_up(Role.ROLLOUT, "ro-1", (2,))
    w = m.tensors(2, Role.ROLLOUT, "weights")
    assert w.keys() == full.keys() and all(torch.equal(w[n], t) for n, t in full.items())
    m.shifter.shift_down("ro-1")
    m.shifter.shift_up(Role.TRAINING, "tr-1", (0, 1))  # training: DP, full copies
    for d in (0, 1):
        w = m.tensors(d, Role.TRAINING, "weights")
        assert all(torch.equal(w[n], t) for n, t in full.items())


def test_a_replica_size_that_does_not_divide_a_split_dim_is_refused_naming_the_parameter(
        models):
    metas = {m: ModelMeta.from_state_dict(m, sd) for m, sd in models.items()}
    policy = TensorParallelReplicas(metas, split_dim=lambda n, s: SPLIT[n])
    assert policy(Role.REWARD, (0,)) is None and policy(Role.TRAINING, (0, 1)) is None
    assert policy(Role.REWARD, (0, 1)).tp == 2
    with pytest.raises(ConfigError, match=r"genrm: a reward replica of 5 devices needs TP=5, "
                                          r"which does not divide dim 0 \(size 24\) of "
                                          r"parameter 0.weight"):
        policy(Role.REWARD, tuple(range(5)))
    assert GENRM in metas
