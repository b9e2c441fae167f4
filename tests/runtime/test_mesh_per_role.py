"""A slot as one process per role (``Backend.proc_per_role``): the controller routes each
shift and role call to the role's process, and the device stays one device to the
shifter, the device map and fault handling."""

import os
import signal
import time

import pytest
import torch

from pivot.errors import StateError
from pivot.runtime.mesh import MeshController
from pivot.shifting.role_shift import SlotKind
from pivot.testing.runtime import seed_batch
from pivot.types import GENRM, POLICY, Role

pytestmark = pytest.mark.monarch


@pytest.fixture(scope="module")
def role_mesh(source, factories):
    ctl = MeshController.local(2, source, factories, proc_per_role=True)
    yield ctl
    ctl.stop()


def assert_same(a, b):
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_each_role_of_a_slot_has_its_own_process_holding_only_its_context(role_mesh):
    m = role_mesh
    assert m.keys == (Role.ROLLOUT, Role.REWARD, Role.TRAINING)
    pids = [m.describe(d)["pids"] for d in (0, 1)]
    assert all(len(set(p)) == 3 for p in pids) and not set(pids[0]) & set(pids[1])
    for k, role in enumerate(m.keys):
        own = m.slots[0][k].describe.call_one().get()
        assert set(own["contexts"]) == {role.value}
    assert set(m.describe(0)["contexts"]) == {"rollout", "reward", "training"}


def test_shifts_and_calls_go_to_the_active_roles_process(role_mesh, models):
    m = role_mesh
    sh = m.shifter
    m.source.gps.load(POLICY, models[POLICY])   # earlier tests of the session trained it
    sh.shift_up(Role.ROLLOUT, "ro-0", (0,))
    info = m.describe(0)
    assert (info["role"], info["replica_id"]) == (Role.ROLLOUT, "ro-0")
    assert info["pid"] == info["pids"][0]
    assert_same(m.tensors(0, Role.ROLLOUT, "weights"), models[POLICY])
    sh.shift_down("ro-0", Role.REWARD)
    sh.shift_up(Role.REWARD, "rm-0", (0,))
    assert m.describe(0)["pid"] == m.describe(0)["pids"][1]
    assert_same(m.tensors(0, Role.REWARD, "weights"), models[GENRM])
    # the rollout process let its weights go; the reward process holds the GenRM
    assert m.describe(0)["contexts"]["rollout"]["weights_bytes"] == 0
    sh.shift_down("rm-0")

    sh.shift_up(Role.TRAINING, "tr-0", (0, 1))
    steps = [m.trainer(d).train_step(seed_batch(3)) for d in (0, 1)]
    assert all(isinstance(s.get()["loss"], float) for s in steps)
    m.write_back(0)
    # a shift of a Writing replica's devices is refused until the Write returns
    w = m.write_back_replica((0,))
    with pytest.raises(StateError, match=r"Write on \[0\] is in flight"):
        m.start_shift_down(Role.TRAINING, "tr-0", (0, 1))
    w.get()
    trained = m.tensors(0, Role.TRAINING, "weights")
    assert any(not torch.equal(trained[k], models[POLICY][k]) for k in trained)
    sh.shift_down("tr-0")
    with pytest.raises(Exception, match="no active role"):
        m.trainer(0).train_step(seed_batch(1)).get()   # to the training proc, now idle
    sh.shift_up(Role.ROLLOUT, "ro-1", (1,))
    assert_same(m.tensors(1, Role.ROLLOUT, "weights"), trained)  # Reads the Write
    sh.shift_down("ro-1")
    m.source.gps.load(POLICY, models[POLICY])


def test_a_role_the_slots_lack_is_refused_by_name(role_mesh):
    with pytest.raises(StateError, match="no context for None"):
        role_mesh.actor(0)


@pytest.mark.slow
def test_a_dead_role_process_loses_the_device_and_recovery_replaces_only_it(role_mesh):
    m = role_mesh
    before = m.describe(1)["pids"]
    os.kill(before[1], signal.SIGKILL)   # the reward process of device 1
    deadline, lost = time.monotonic() + 60, ()
    while not lost and time.monotonic() < deadline:
        time.sleep(0.5)
        lost = m.poll_faults()
    assert lost == (1,), f"no supervision event within 60 s; failures: {m.failures}"
    assert m.device_map.state(1).kind is SlotKind.LOST
    m.recover((1,))
    after = m.describe(1)["pids"]
    assert after[0] == before[0] and after[2] == before[2] and after[1] != before[1]
    m.shifter.shift_up(Role.REWARD, "rm-r", (1,))
    assert m.describe(1)["replica_id"] == "rm-r"
    m.shifter.shift_down("rm-r")
