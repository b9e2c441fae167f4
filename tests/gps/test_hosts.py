"""GPS on two hosts of a Monarch ``ProcessJob`` (sec. 5.1): one GPSActor per host,
each loading its own shards of a HF checkpoint folder; a Write from a proc on host 0 and
a Read from a proc on host 1 cross hosts through NIXL and return the source exactly."""

import shutil

import pytest
import torch
from safetensors.torch import load_file

from pivot.errors import ConfigError
from pivot.gps.hosts import HostJob


def test_an_unknown_job_kind_or_host_count_is_a_config_error():
    with pytest.raises(ConfigError, match=r"HostJob.kind='mpi': must be one of"):
        HostJob("mpi")
    with pytest.raises(ConfigError, match=r"HostJob.hosts=0"):
        HostJob(hosts=0)


@pytest.mark.skipif(shutil.which("sbatch") is not None, reason="a SLURM machine")
def test_slurm_chosen_in_gin_without_sbatch_says_it_needs_a_cluster():
    import gin

    gin.parse_config("HostJob.kind = 'slurm'\nHostJob.hosts = 4")
    try:
        job = HostJob()
    finally:
        gin.clear_config()
    assert (job.kind, job.hosts) == ("slurm", 4)
    with pytest.raises(ConfigError, match="no sbatch on this machine; a SLURM job needs a "
                                          "cluster"):
        job.start()


def test_kubernetes_without_its_package_says_so():
    try:
        import kubernetes  # noqa: F401
        pytest.skip("the kubernetes package is installed")
    except ImportError:
        pass
    with pytest.raises(ConfigError, match="'kubernetes' Python package is not installed"):
        HostJob("kubernetes").start()


@pytest.mark.monarch
@pytest.mark.slow
def test_two_process_hosts_load_their_shards_and_cross_host_write_and_read_are_exact(
        tmp_path):
    from pivot.gps.client import GlobalParameterStorage
    from pivot.gps.checkpoint import checkpoint_meta, load_checkpoint
    from pivot.gps.layout import plan_storage
    from pivot.gps.recovery import host_shards
    from pivot.roles.engine.tiny import make_tiny_qwen3
    from pivot.testing.gps_writer import GPSUser

    dims = dict(hidden=256, layers=4, heads=4, kv_heads=2, head_dim=64)
    first = make_tiny_qwen3(tmp_path / "v0", seed=0, **dims)
    second = make_tiny_qwen3(tmp_path / "v1", seed=1, **dims)
    meta = checkpoint_meta("policy", first)
    models = {"policy": meta}
    storage = plan_storage([meta], 2, meta.nbytes * 6 // 10, min_split_bytes=0)
    assert storage.k == 2  # each host holds its own half
    device_host = (0, 1)  # device 0 on host 0, device 1 on host 1
    mesh, job = HostJob("process", 2).start()
    gps = None
    try:
        from pivot.gps.hosts import spawn_gps

        _, actors, handles = spawn_gps(mesh, storage, models)
        gps = GlobalParameterStorage(handles, models, storage, device_host)
        v0, read, load_s = load_checkpoint(gps, "policy", first)
        assert v0 == 0
        for h in (0, 1):
            assert read[h] == sum(s.nbytes for s in host_shards(storage, meta, h))
        users = mesh.spawn_procs(per_host={"procs": 1}, name="pivot_gps_users")
        writer = users.slice(hosts=0).spawn("writer", GPSUser, actors, models, storage,
                                            device_host)
        reader = users.slice(hosts=1).spawn("reader", GPSUser, actors, models, storage,
                                            device_host)
        assert writer.where.call_one().get().endswith("@ hosts_0")
        assert reader.where.call_one().get().endswith("@ hosts_1")
        src0 = load_file(str(first / "model.safetensors"))
        got, _, _ = reader.read.call_one("policy", 1).get()
        assert got.keys() == src0.keys() and all(torch.equal(got[k], src0[k]) for k in src0)
        v1, nbytes, write_s, wnames = writer.write_folder.call_one("policy", 0,
                                                                   str(second)).get()
        got, read_s, rnames = reader.read.call_one("policy", 1).get()
        src1 = load_file(str(second / "model.safetensors"))
        assert v1 == 1 and got.keys() == src1.keys()
        assert all(torch.equal(got[k], src1[k]) for k in src1)
        assert wnames["REMOTE"] == rnames["REMOTE"] == "nixl", (wnames, rnames)
        # again, with both clients' NIXL agents started (the first Write started its own)
        v2, _, write2_s, _ = writer.write_folder.call_one("policy", 0, str(first)).get()
        got, read2_s, _ = reader.read.call_one("policy", 1).get()
        assert v2 == 2 and all(torch.equal(got[k], src0[k]) for k in src0)
        v3, _, load2_s = load_checkpoint(gps, "policy", second)  # warm hosts
        got, _, _ = reader.read.call_one("policy", 1).get()
        assert v3 == 3 and all(torch.equal(got[k], src1[k]) for k in src1)
        print(f"\ntwo ProcessJob hosts, {meta.nbytes} B fp32 model, half per host: load "
              f"{load_s:.3f} s first / {load2_s:.3f} s warm (bytes each host read: {read}); "
              f"Write from host 0 of {nbytes} B {write_s:.3f} s (first, NIXL agent start "
              f"included) / {write2_s:.3f} s; Read on host 1 {read_s:.3f} / {read2_s:.3f} s "
              f"(remote links: nixl)")
    finally:
        if gps is not None:
            gps.close()
        job.kill()
