"""Role shifting on a real Monarch mesh of 4 slots (sec. 5.2)."""

import pytest
import torch

from pivot.errors import StateError
from pivot.roles.engine.requests import GenRequest
from pivot.shifting.role_shift import SlotKind
from pivot.testing.runtime import seed_batch
from pivot.types import GENRM, POLICY, Role

pytestmark = pytest.mark.monarch


def assert_same(a, b):
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_a_slot_shifts_rollout_to_reward_and_back_holding_the_right_weights(idle_mesh, models):
    m = idle_mesh
    first = m.describe(1)
    pid = first["pid"]
    m.shifter.shift_up(Role.ROLLOUT, "ro-0", (1,))
    info = m.describe(1)
    assert (info["role"], info["replica_id"]) == (Role.ROLLOUT, "ro-0")
    assert_same(m.tensors(1, Role.ROLLOUT, "weights"), models[POLICY])
    assert info["contexts"]["rollout"]["kv_capacity"] == 512
    assert info["contexts"]["reward"]["weights_bytes"] == 0

    m.shifter.shift_down("ro-0", Role.REWARD)
    res = m.shifter.shift_up(Role.REWARD, "rm-0", (1,))
    assert res.kv_capacity == 256 and {"gps_read", "load_parameters"} <= set(res.phases)
    info = m.describe(1)
    assert (info["role"], info["replica_id"], info["pid"]) == (Role.REWARD, "rm-0", pid)
    assert_same(m.tensors(1, Role.REWARD, "weights"), models[GENRM])
    assert info["contexts"]["rollout"] == {"weights_bytes": 0, "kv_bytes": 0, "kv_capacity": 0}

    m.shifter.shift_down("rm-0", Role.ROLLOUT)
    m.shifter.shift_up(Role.ROLLOUT, "ro-1", (1,))
    assert_same(m.tensors(1, Role.ROLLOUT, "weights"), models[POLICY])
    last = m.describe(1)
    assert last["pid"] == pid
    assert last["context_ids"] == first["context_ids"]  # contexts (engines) never rebuilt
    assert m.device_map.state(1).kind is SlotKind.ACTIVE


def test_each_slot_proc_runs_in_its_backend_environment(idle_mesh):
    # Backend("cuda").slot_env with 2 slots a host: each slot sees only its own GPU
    seen = [idle_mesh.describe(d)["env"] for d in range(4)]
    assert seen == [{"CUDA_VISIBLE_DEVICES": v} for v in ("0", "1", "0", "1")]


def test_training_optimizer_state_survives_a_shift_bit_identical(idle_mesh):
    m = idle_mesh
    devs = (2, 3)
    m.shifter.shift_up(Role.TRAINING, "tr-0", devs)
    for d in devs:
        for step in range(3):
            m.trainer(d).train_step(seed_batch(step)).get()
    m.write_back(2)
    before = {d: m.tensors(d, Role.TRAINING, "optimizer_state") for d in devs}
    grads = m.tensors(3, Role.TRAINING, "gradients")
    assert len(grads) == 4
    weights = m.tensors(2, Role.TRAINING, "weights")
    assert len(before[2]) == 4 * 3  # exp_avg, exp_avg_sq, step for 4 tensors

    m.shifter.shift_down("tr-0", Role.ROLLOUT)
    info = m.describe(2)["contexts"]["training"]
    assert info["optimizer_bytes"] == 0 and info["weights_bytes"] == 0
    assert info["offloaded_bytes"] > 0
    m.shifter.shift_up(Role.ROLLOUT, "ro-t", devs[:1])
    assert_same(m.tensors(2, Role.ROLLOUT, "weights"), weights)  # rollout Reads the write
    m.shifter.shift_down("ro-t")

    m.shifter.shift_up(Role.TRAINING, "tr-1", devs)
    for d in devs:
        assert_same(m.tensors(d, Role.TRAINING, "optimizer_state"), before[d])
    assert_same(m.tensors(2, Role.TRAINING, "weights"), weights)
    assert_same(m.tensors(3, Role.TRAINING, "gradients"), grads)
    assert m.describe(2)["contexts"]["training"]["offloaded_bytes"] == 0
    assert isinstance(m.trainer(2).train_step(seed_batch(9)).get()["loss"], float)


def test_a_slot_refuses_a_shift_that_disagrees_with_what_it_holds(idle_mesh):
    m = idle_mesh
    m.shifter.shift_up(Role.REWARD, "rm-x", (0,))
    with pytest.raises(Exception, match="holds reward replica rm-x; shift down first"):
        m.actor(0).shift_up.call_one(Role.ROLLOUT, "ro-x").get()
    with pytest.raises(StateError, match="device 0 .* is active in reward replica rm-x"):
        m.shifter.shift_up(Role.ROLLOUT, "ro-x", (0,))
    assert m.describe(0)["role"] is Role.REWARD
    with pytest.raises(Exception, match=r"train_step \(trainer endpoint\) is for a training "
                                        r"replica; the slot holds reward replica rm-x"):
        m.trainer(0).train_step(seed_batch(0)).get()


def test_engine_calls_reach_the_active_engine_and_other_roles_refuse_them(idle_mesh):
    m = idle_mesh
    with pytest.raises(Exception, match="submit: no active role; shift up to rollout or "
                                        "reward first"):
        m.engine(1).submit([GenRequest(0, [1, 2, 3])]).get()
    m.shifter.shift_up(Role.ROLLOUT, "ro-e", (1,))
    calls = [m.engine(1).submit([GenRequest(s, [1, 2, 3], generated=[7] * s)])
             for s in (0, 1)]   # started together, waited for together
    assert [c.get() for c in calls] == [[None], [None]]
    assert m.engine(1).poll().get() == ({}, {0: 3, 1: 4})
    aborted = m.engine(1).abort([1]).get()
    assert (aborted[1].tokens, aborted[1].finish_reason) == ([7], "abort")
    assert m.engine(1).stats().get()["running"] == 1
    m.engine(1).abort([0]).get()
    m.shifter.shift_down("ro-e", Role.TRAINING)
    m.shifter.shift_up(Role.TRAINING, "tr-e", (1,))
    with pytest.raises(Exception, match=r"collect \(engine endpoint\) is for a rollout or "
                                        r"reward replica; the slot holds training replica tr-e"):
        m.engine(1).collect().get()
