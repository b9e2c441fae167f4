"""Global Parameter Storage (GPS): CPU copies of every model, Read and Write (sec. 5.1, app. B).

The whole interface the runtime needs::

    gps = GlobalParameterStorage(hosts, models, storage, device_host)   # client.py
    shards = gps.read(model, devices, layout)            # Read(M, G, P)
    # -> {device: {param name: tensor}}: the shard of every parameter that device holds
    #    under layout P (TP chunk along the parameter's split dim, only its PP stage's
    #    parameters); version=None reads the latest, version=v a stored one.
    mine = gps.read(model, devices, layout, only=(d,))   # one device of G: its shard only
    v = gps.write(model, devices, layout, states)        # Write(M, G, P)
    # states = {device: {param name: shard}} in the same form; returns the new version
    # (an int increasing per model). write_async(...) returns a Future instead, so the
    # Write overlaps the next training step. Writing "genrm" is an error: load() it once.
    # A Write is one commit across all hosts (stage + verify, install, publish): a failure
    # before publishing leaves every host on the old version; Reads pin one version.

``devices`` is G (device ids of the pool, rank order DP x PP x TP with TP innermost),
``layout`` is P (:class:`ParallelLayout`, built with ``ParallelLayout.create(meta, dp=,
tp=, pp=)``, default Qwen3 split dims). The storage layout comes from
:func:`plan_storage` (replication first, HSDP-like groups under memory pressure).

Modules: ``layout`` (P and the GPS layout), ``plan`` (refinement, greedy plan, cache),
``storage`` (one host's versioned store), ``transport`` (shm / Monarch / NIXL paths),
``actor`` (the per-host Monarch actor and its handle), ``client`` (Read and Write over the
hosts), ``recovery`` (rebuilding a lost
host from its replicas, peer to peer, or a checkpoint: ``gps.rebuild(host, fresh_store,
checkpoints=)``; a rebuild and a Write exclude each other), ``lease`` (a Write's lease: a
dead writer's half-written version is discarded by the next Write once it expires, or at
once by ``gps.writer_lost(holder)``), ``checkpoint`` (every host loads its own shards of a
HF folder: ``gps.load_checkpoint(model, folder)``), ``hosts`` (one GPSActor per host of a
Monarch job: ``HostJob(kind, hosts).start()``, ``spawn_gps(mesh, storage, models)``).
"""

from pivot.gps.layout import (ModelMeta, ParallelLayout, ParamMeta, StorageLayout,
                              plan_storage, qwen3_model, qwen3_split_dim)
from pivot.gps.manifest import checksum
from pivot.gps.plan import Link, LinkProfile, Plan, Planner
from pivot.gps.recovery import Checkpoint, RebuildReport, lost_hosts, rebuild_host
from pivot.gps.storage import HostStore

__all__ = ["Checkpoint", "GlobalParameterStorage", "GPSActor", "HostStore", "Link",
           "LinkProfile", "ModelMeta", "ParallelLayout", "ParamMeta", "Plan", "Planner",
           "RebuildReport", "StorageLayout", "checksum", "lost_hosts", "plan_storage",
           "qwen3_model", "qwen3_split_dim", "rebuild_host"]


def __getattr__(name: str):
    # The actor and client modules import Monarch; load them only when asked for.
    if name == "GPSActor":
        from pivot.gps import actor
        return actor.GPSActor
    if name == "GlobalParameterStorage":
        from pivot.gps import client
        return client.GlobalParameterStorage
    raise AttributeError(name)
