"""One Monarch mesh of 4 device slots, Reading from a real GPS actor, for every runtime
test (session scope)."""

import functools
import logging

import pytest

from pivot.gps.actor import GPSActor
from pivot.gps.layout import ModelMeta, plan_storage
from pivot.runtime.backend import Backend
from pivot.runtime.gps_source import GPSParameterSource
from pivot.runtime.mesh import MeshController
from pivot.runtime.provision import spawn_host_service
from pivot.shifting.role_shift import SlotKind
from pivot.testing.runtime import SlotInferenceContext, SlotTrainingContext
from pivot.testing.shifting import TinyMLP, tiny_mlp_state
from pivot.types import GENRM, POLICY, Role

POLICY_SIZES = (16, 32, 4)
GENRM_SIZES = (16, 24, 2)


@pytest.fixture(scope="session")
def models():
    return {POLICY: tiny_mlp_state(POLICY_SIZES, 0), GENRM: tiny_mlp_state(GENRM_SIZES, 1)}


@pytest.fixture(scope="session")
def source(models):
    """A GPS actor holding both models, and its client for 4 devices on one host."""
    logging.getLogger("pivot").setLevel(logging.INFO)
    metas = {m: ModelMeta.from_state_dict(m, sd) for m, sd in models.items()}
    storage = plan_storage(list(metas.values()), 1, 1 << 30)
    gps = spawn_host_service("gps", GPSActor, 0, storage, metas)
    source = GPSParameterSource([gps], metas, storage, (0,) * 4)
    for m, sd in models.items():
        source.gps.load(m, sd)
    yield source
    source.gps.close()
    gps.close.call_one().get()


@pytest.fixture(scope="session")
def factories():
    return {
        Role.ROLLOUT: functools.partial(SlotInferenceContext, Role.ROLLOUT, 512, 64),
        Role.REWARD: functools.partial(SlotInferenceContext, Role.REWARD, 256, 64),
        Role.TRAINING: functools.partial(SlotTrainingContext, TinyMLP(POLICY_SIZES)),
    }


@pytest.fixture(scope="session")
def mesh(source, factories):
    # the cuda backend's slot environment (one GPU per slot, 2 a host): set in each proc
    # before its contexts are built; harmless where there is no GPU
    env = functools.partial(Backend("cuda").slot_env, per_host=2)
    ctl = MeshController.local(4, source, factories, slot_env=env)
    yield ctl
    ctl.stop()


@pytest.fixture
def idle_mesh(mesh):
    """The shared mesh with every slot idle before and after the test."""
    assert not mesh.device_map.devices_in(SlotKind.LOST), "an earlier test lost a slot"
    yield mesh
    for rid in list(mesh.device_map.replicas()):
        mesh.shifter.shift_down(rid)
