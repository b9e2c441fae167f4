"""``pivot.compat.torch_dist`` against the installed torch: the version, the private names
its shims use, and a group beside a default group of one, used by DTensor and destroyed.
(Two ranks across slots: tests/roles/test_trainer_slots.py.)"""

import inspect

import pytest
import torch
import torch.distributed as dist

from pivot.compat import torch_dist as td

RECHECK = ("re-check gloo_side_group, side_group_mesh and destroy_side_group of "
           "pivot/compat/torch_dist.py and update TORCH_VERSION")


def test_installed_torch_is_the_one_the_shims_were_written_for():
    got = torch.__version__.split("+")[0]
    assert got == td.TORCH_VERSION, f"torch {got} installed: {RECHECK}"


def test_the_private_names_exist():
    from torch._C._distributed_c10d import ProcessGroup
    from torch.distributed import distributed_c10d as c10d
    from torch.distributed.device_mesh import DeviceMesh

    assert hasattr(c10d, "_register_pg_in_world"), RECHECK
    assert {"rank_mapping", "backend_config"} <= set(
        inspect.signature(c10d._register_pg_in_world).parameters), RECHECK
    for name in ("_register_backend", "_set_default_backend", "_set_group_name"):
        assert hasattr(ProcessGroup, name), f"ProcessGroup.{name}: {RECHECK}"
    assert {"_rank", "_init_backend"} <= set(inspect.signature(DeviceMesh).parameters)


@pytest.mark.skipif(dist.is_initialized(), reason="needs a process without a default group")
def test_a_side_group_beside_a_world_of_one_serves_dtensor_and_is_destroyed(tmp_path):
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'w1'}", rank=0,
                            world_size=1)
    try:
        pg = td.side_group("gloo", dist.HashStore(), 0, 1, "side-test")
        mesh = td.side_group_mesh(pg)
        assert mesh.get_local_rank(0) == 0 and mesh.get_group(0) is pg
        x = torch.arange(6.0).reshape(3, 2)
        d = distribute_tensor(x, mesh, [Shard(0)], src_data_rank=None)
        assert torch.equal(d.full_tensor(), x)
        t = torch.ones(3)
        dist.all_reduce(t, group=pg)
        assert torch.equal(t, torch.ones(3))
        td.destroy_side_group(pg)
        assert pg not in dist.distributed_c10d._world.pg_map
    finally:
        dist.destroy_process_group()


def test_a_side_group_names_its_backend_and_nccl_needs_a_cuda_torch():
    from pivot.errors import ConfigError

    with pytest.raises(ConfigError, match="not one of"):
        td.side_group("mpi", dist.HashStore(), 0, 1, "side-bad")
    if not dist.is_nccl_available():
        with pytest.raises(ConfigError, match="has no NCCL"):
            td.side_group("nccl", dist.HashStore(), 0, 1, "side-nccl")
