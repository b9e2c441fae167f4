"""Provisioning over two (local-subprocess) hosts: one replica across both (sec. 5)."""

import functools

import pytest
import torch

from pivot.errors import ConfigError
from pivot.gps.actor import GPSActor
from pivot.gps.layout import ModelMeta, plan_storage
from pivot.runtime.gps_source import GPSParameterSource
from pivot.runtime.mesh import MeshController
from pivot.runtime.provision import allocate
from pivot.testing.runtime import spawn_per_host
from pivot.testing.shifting import InferenceContext
from pivot.types import GENRM, POLICY, Role


@pytest.mark.parametrize("n,hosts,match", [(0, 1, "num_devices must be a positive int"),
                                           (3, 2, "must be a positive int dividing")])
def test_a_bad_allocation_is_refused_before_anything_spawns(n, hosts, match):
    with pytest.raises(ConfigError, match=match):
        allocate(n, hosts)


@pytest.mark.monarch
@pytest.mark.slow
def test_a_replica_across_two_hosts_reads_both_models_from_the_gps_on_each(models):
    alloc = allocate(2, hosts=2)
    metas = {m: ModelMeta.from_state_dict(m, sd) for m, sd in models.items()}
    storage = plan_storage(list(metas.values()), 2, 1 << 30)
    gps = spawn_per_host(alloc, "gps", GPSActor, lambda h: (h, storage, metas))
    source = GPSParameterSource(gps, metas, storage, alloc.device_host)
    for m, sd in models.items():
        source.gps.load(m, sd)
    factories = {r: functools.partial(InferenceContext, r, 64, 8)
                 for r in (Role.ROLLOUT, Role.REWARD)}
    ctl = MeshController(alloc, source, factories)
    try:
        assert ctl.device_map.device_host == (0, 1)
        assert [i["host"] for i in ctl.describe_all()] == [0, 1]
        ctl.shifter.shift_up(Role.ROLLOUT, "ro-x", (0, 1))
        for d in (0, 1):
            w = ctl.tensors(d, Role.ROLLOUT, "weights")
            assert all(torch.equal(w[k], models[POLICY][k]) for k in models[POLICY])
        ctl.shifter.shift_down("ro-x", Role.REWARD)
        ctl.shifter.shift_up(Role.REWARD, "rm-x", (0, 1))
        w = ctl.tensors(1, Role.REWARD, "weights")
        assert all(torch.equal(w[k], models[GENRM][k]) for k in models[GENRM])
    finally:
        source.gps.close()
        for g in gps:
            g.close.call_one().get()
        ctl.stop()


def test_several_hosts_come_from_the_backends_job_type():
    # a SLURM job needs sbatch: refused before Monarch's transport is touched
    import shutil

    from pivot.errors import ConfigError
    from pivot.runtime.provision import allocate
    if shutil.which("sbatch"):
        pytest.skip("this machine has sbatch")
    with pytest.raises(ConfigError, match="HostJob.kind='slurm': no sbatch"):
        allocate(4, 2, "slurm")
    with pytest.raises(ConfigError, match="Backend.job='lsf'"):
        from pivot.runtime.backend import Backend
        Backend(job="lsf")
