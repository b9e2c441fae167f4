"""A gloo process group beside the default one, and a device mesh over it (torch 2.13.0,
CPU).

The cluster driver's training slots are processes that also host vLLM engines, and vLLM
initialises ``torch.distributed``'s default group in each of them with world size 1 (its
own tensor-parallel world). The trainer's FSDP2 group across k slots must coexist with
that, and change with the slots training holds (sec. 5.2: PivotRL shifts training as a
whole onto whichever devices the planner frees). ``torch.distributed.new_group`` cannot
build it (it draws ranks from the default group), so this module builds the group the way
``torch.distributed._dist2``'s gloo factory does (a ``ProcessGroup`` with a
``ProcessGroupGloo`` backend over a store) and registers it in c10d's private world state
(``_register_pg_in_world``) so that ``dist.*`` collectives, DTensor and functional
collectives resolve it by name. Its ranks are its own (0..k-1, identity mapping), so the
device mesh is built with this process's rank given explicitly: the default group's rank
(0 in every slot) never enters.

What must not be called on such a group: ``dist.get_rank(group)`` (it translates the
default group's rank; use ``group.rank()``) and collectives with a global ``src`` /
``dst`` (``distribute_tensor`` with ``src_data_rank=0``, broadcast): every rank passes
full tensors instead (``src_data_rank=None``).

``tests/compat/test_torch_dist.py`` checks these internals against the installed torch.
Importing this module imports no torch.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

TORCH_VERSION = "2.13.0"
WRITTEN_FOR = f"torch {TORCH_VERSION} (CPU, gloo)"
"""The torch every shim below was written for and checked against."""


def gloo_side_group(store: Any, rank: int, size: int, name: str,
                    timeout_s: float = 120.0) -> Any:
    """A gloo ``ProcessGroup`` of ``size`` ranks over ``store`` (every rank passes the same
    store contents and ``name``), registered under ``name`` beside the default group.

    Blocks until all ``size`` ranks have connected (gloo's rendezvous through the store).
    """
    import torch.distributed as dist

    backend = dist.ProcessGroupGloo(store, rank, size, timedelta(seconds=timeout_s))
    return _registered(backend, "gloo", "cpu", store, rank, size, name)


def nccl_side_group(store: Any, rank: int, size: int, name: str,
                    timeout_s: float = 120.0) -> Any:
    """The NCCL twin of ``gloo_side_group``, on this process's current CUDA device.

    Written from the same c10d calls as the gloo group (``ProcessGroupNCCL`` registered
    for the ``cuda`` device type); it has not run here: no GPU was at hand (docs/results.md,
    "The cluster backend: what has run"), so ``cuda`` runs need ``Backend.untested_cuda``.
    """
    import torch
    import torch.distributed as dist

    if not dist.is_nccl_available():
        from pivot.errors import ConfigError

        raise ConfigError(f"nccl_side_group: this torch ({torch.__version__}) has no NCCL "
                          f"(a CPU build); use Backend.kind = 'cpu' (gloo) or install CUDA "
                          f"torch (README.md, 'Running on a cluster')")
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timedelta(seconds=timeout_s)
    backend = dist.ProcessGroupNCCL(store, rank, size, opts)
    return _registered(backend, "nccl", "cuda", store, rank, size, name)


def _registered(backend: Any, kind: str, device_type: str, store: Any, rank: int,
                size: int, name: str) -> Any:
    """A ``ProcessGroup`` over ``backend`` (gloo or NCCL) for ``device_type``, registered
    in c10d's world under ``name`` with its own ranks (the way ``torch.distributed._dist2``
    builds one)."""
    import torch
    from torch._C._distributed_c10d import ProcessGroup
    from torch.distributed.distributed_c10d import _register_pg_in_world

    kind_enum = getattr(ProcessGroup.BackendType, kind.upper())
    backend._set_sequence_number_for_group()
    pg = ProcessGroup(store, rank, size)
    pg._set_default_backend(kind_enum)
    pg._register_backend(torch.device(device_type), kind_enum, backend)
    pg._set_group_name(name)
    pg._set_group_desc(name)
    _register_pg_in_world(pg, backend_name=kind, store=store, group_name=name,
                          backend_config=f"{device_type}:{kind}",
                          rank_mapping={r: r for r in range(size)})
    return pg


SIDE_GROUPS = {"gloo": gloo_side_group, "nccl": nccl_side_group}


def side_group(backend: str, store: Any, rank: int, size: int, name: str,
               timeout_s: float = 120.0) -> Any:
    """``gloo_side_group`` or ``nccl_side_group`` by ``Backend.dist``."""
    if backend not in SIDE_GROUPS:
        from pivot.errors import ConfigError

        raise ConfigError(f"side_group: backend {backend!r} is not one of "
                          f"{sorted(SIDE_GROUPS)} (Backend.dist)")
    return SIDE_GROUPS[backend](store, rank, size, name, timeout_s)


def destroy_side_group(pg: Any) -> None:
    """Shuts a group from ``gloo_side_group`` down and removes it from c10d's registry."""
    import torch.distributed as dist

    dist.destroy_process_group(pg)


def side_group_mesh(pg: Any, dim_name: str = "fsdp", device_type: str = "cpu") -> Any:
    """A 1-D ``DeviceMesh`` of ``device_type`` over ``pg`` whose coordinate is ``pg.rank()``.

    ``DeviceMesh.from_group`` would read this process's rank from the default group (vLLM's
    world of 1, rank 0 in every slot); the mesh is built with ``_rank`` given instead and
    the group put in its registry the way ``from_group`` does. The dimension is named
    ``<dim_name>_<group name>``: meshes compare equal by ranks and names, and DTensor's
    sharding-propagation cache, keyed on that equality, would hand a later group of the
    same size the outputs of an earlier (destroyed) group's mesh.
    """
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    mesh = DeviceMesh(device_type, torch.arange(pg.size(), dtype=torch.int),
                      mesh_dim_names=(f"{dim_name}_{pg.group_name}",), _init_backend=False,
                      _rank=pg.rank())
    mesh._dim_group_names = [pg.group_name]
    mesh._pg_registry[pg.group_name] = pg
    return mesh


__all__ = ["TORCH_VERSION", "WRITTEN_FOR", "destroy_side_group", "gloo_side_group",
           "nccl_side_group", "side_group", "side_group_mesh"]
