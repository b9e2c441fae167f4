"""The cluster driver's long-lived parts: GPS with both models, the mesh of device slots
(two in-process vLLM engines, one per model, and one torchtitan trainer context each,
every slot capped to a fixed CPU share) and the tokenizer.

Engines take 45-80 s to start on this CPU (docs/stack.md), so a ``ClusterStack`` is started once
and shared by every run that fits it (tests, the four-deployment throughput measurement):
``reset`` shifts every slot down to idle and writes the initial policy back to GPS (the
GenRM is frozen), so the next run, whatever its deployment, starts from the same state without
restarting an engine (sec. 5.2: the engine definition is preserved context).

    stack = ClusterStack(group, seed, lr, cpu_share)     # a ClusterDriver's settings
    stack.start()
    ClusterDriver(group, deployment, costs=costs, stack=stack).run(); stack.reset(); ...
    stack.close()
"""

from __future__ import annotations

import functools
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Sequence
from typing import Any

from pivot.errors import ConfigError, StateError
from pivot.cluster.closers import run_closers
from pivot.cluster.group import ClusterGroup
from pivot.roles.engine.config import EngineConfig
from pivot.shifting.role_shift import SlotKind
from pivot.types import GENRM, INFERENCE_ROLES, MODEL_OF_ROLE, POLICY, Role

log = logging.getLogger(__name__)


@dataclass
class ClusterStack:
    """Attributes:
        group: the model group (devices, model folders, KV blocks).
        seed: engine and trainer seed (sampling seeds are per run and per sequence).
        lr: the trainer's AdamW learning rate.
        cpu_share: fraction of one core per slot (cgroup v1 quota); 0 disables.
        max_model_len: the trainer's RoPE length, tokens (None: the policy engines'
            context, ``ClusterGroup.policy_max_model_len``).

    ``seed``, ``lr`` and ``cpu_share`` have no default here: they are the
    ``ClusterDriver``'s (gin-bound) ``RunConfig.seed``, ``OptimizerConfig.lr`` and
    ``CpuConfig.share``, passed through (``ClusterDriver._start``; a stack started ahead
    of its runs takes them from a probe driver or ``default_of`` of those configs).
    Each model's engines take their context, batch cap and (on ``cuda``) memory share
    from the group (``ClusterGroup.policy_*`` / ``genrm_*``).
    """

    group: ClusterGroup
    seed: int
    lr: float
    cpu_share: float
    max_model_len: int | None = None
    startup_s: float = 0.0
    runs: int = 0
    _closers: list = field(default_factory=list)
    _tp_ports: list = field(default_factory=list)   # the TP blocks' rendezvous ports

    def key(self) -> tuple:
        """What a run must share with the stack to reuse it (the run's sampling seed and
        generation lengths may differ: they are per request)."""
        g = self.group
        return (g.devices, g.policy_dir, g.genrm_dir, g.num_blocks, self.lr, self.cpu_share,
                g.backend, g.load_format, self.engine_fields(g))

    @staticmethod
    def engine_fields(g: ClusterGroup) -> tuple:
        """The group's engine settings a started stack is fixed to."""
        return tuple(getattr(g, f"{m}_{k}") for m in ("policy", "genrm")
                     for k in ("max_model_len", "max_num_seqs", "memory_share"))

    def fits(self, group: ClusterGroup, lr: float, cpu_share: float) -> None:
        """Raises ConfigError unless a run with these settings can reuse the stack."""
        want = ClusterStack(group, self.seed, lr, cpu_share).key()
        if want != self.key():
            raise ConfigError(f"ClusterStack: a run with (devices, policy, genrm, num_blocks, "
                              f"lr, cpu_share, backend, load_format, engines)={want} cannot reuse "
                              f"the stack started with {self.key()}")

    @property
    def started(self) -> bool:
        return getattr(self, "ctl", None) is not None

    def start(self) -> "ClusterStack":
        import torch
        from transformers import AutoTokenizer

        from pivot.compat.monarch import ensure_client_tmpdir
        from pivot.gps.actor import GPSActor
        from pivot.gps.hosts import spawn_gps
        from pivot.gps.layout import ModelMeta, plan_storage
        from pivot.cluster.cpu.cgroups import SlotCpuShares
        from pivot.roles.engine.slot_context import GeneratorFactory, rendezvous_ports
        from pivot.roles.trainer_context import SlotTrainerContext
        from pivot.models.tokenizer import TextCodec
        from pivot.roles.engine.config import read_hf_config, read_hf_weights
        from pivot.runtime.gps_source import FsdpShardLayouts, GPSParameterSource
        from pivot.runtime.mesh import MeshController
        from pivot.runtime.provision import allocate, spawn_host_service

        t0 = time.perf_counter()
        g = self.group
        g.check()
        if g.backend.described_gpus:
            raise ConfigError(f"Backend.described_gpus={g.backend.described_gpus}: a described "
                              f"cluster is for launchers/run.py --dry_run, which starts "
                              f"nothing; leave it 0 to run")
        if self.max_model_len is None:
            self.max_model_len = g.policy_max_model_len
        self.policy_dir, self.genrm_dir = g.model_dirs()
        from pivot.roles.engine.tp import check_ep_size, check_tp_size, moe_experts
        # a model's replicas of k > 1 devices are TP blocks (an MoE's experts EP), their
        # engines fixed at start
        tp = {MODEL_OF_ROLE[r]: k for r, k in g.replica_devices.items()}
        ep = {}
        for m, d in ((POLICY, self.policy_dir), (GENRM, self.genrm_dir)):
            check_tp_size(d, tp[m])   # before any process starts
            ep[m] = g.expert_parallel and tp[m] > 1 and moe_experts(d) > 0
            if ep[m]:
                check_ep_size(d, tp[m])
        cache = str(Path("cache").resolve())
        ensure_client_tmpdir(Path(cache) / "tmp")  # Monarch's sockets (pivot.compat.monarch)
        # each model its own tokenizer: text crosses from rollout to reward, never ids
        self.tok = AutoTokenizer.from_pretrained(self.policy_dir)
        self.codecs = {POLICY: TextCodec.of(self.tok), GENRM: TextCodec.load(self.genrm_dir)}
        self.initial: dict[str, dict[str, torch.Tensor]] = {}
        for m, d in ((POLICY, self.policy_dir), (GENRM, self.genrm_dir)):
            self.initial[m] = {k: v.to(torch.float32) for k, v in read_hf_weights(d).items()}
        metas = {m: ModelMeta.from_state_dict(m, sd) for m, sd in self.initial.items()}
        # the device procs first: GPS runs one actor on each of their hosts (sec. 5.1)
        # the layout from each host's budget (app. B.1), refused before any process starts
        storage = plan_storage(list(metas.values()), g.backend.hosts,
                               g.backend.gps_budget_bytes())
        per_role = g.backend.procs_per_role
        alloc = allocate(g.devices, g.backend.hosts, g.backend.job,
                         procs_per_device=len(INFERENCE_ROLES) + 1 if per_role else 1)
        if alloc.job is None:
            gps = [spawn_host_service("gps", GPSActor, 0, storage, metas)]
        else:
            _, gps, _ = spawn_gps(alloc.hosts, storage, metas)
        self.source = GPSParameterSource(gps, metas, storage, alloc.device_host)
        self._load_initial()
        # one engine per model per slot, each configured from its own folder (sec. 5.2)
        # (the memory share only on cuda: a cpu engine's KV cache is its block count)
        self.engine_configs = {
            m: EngineConfig(d, max_model_len=getattr(g, f"{k}_max_model_len"),
                            num_blocks=g.num_blocks,
                            max_num_seqs=getattr(g, f"{k}_max_num_seqs"),
                            cache_dir=cache, seed=self.seed, dtype=g.backend.dtype,
                            load_format=g.load_format, tensor_parallel_size=tp[m],
                            expert_parallel=ep[m],
                            gpu_memory_utilization=getattr(g, f"{k}_memory_share")
                            if g.backend.sleep_mode else None)
            for m, k, d in ((POLICY, "policy", self.policy_dir),
                            (GENRM, "genrm", self.genrm_dir))}
        ecfg = {r: self.engine_configs[MODEL_OF_ROLE[r]] for r in INFERENCE_ROLES}
        self.kv_capacities = {r: c.kv_capacity for r, c in ecfg.items()}
        self.kv_capacity = min(self.kv_capacities.values())
        self.max_num_seqs = min(c.max_num_seqs for c in ecfg.values())
        cores = os.cpu_count() or 1
        # each TP block's ranks meet on its host, at a port that host found free
        ports = rendezvous_ports(tp, alloc.device_host,
                                 lambda h, n: gps[h].free_ports.call_one(n).get())
        self._tp_ports = [p for ps in ports.values() for p in ps]
        factories: dict[Role, Any] = {
            r: GeneratorFactory(r, ecfg[r], self.source, cores,
                                tp_ports=ports[MODEL_OF_ROLE[r]])
            for r in INFERENCE_ROLES}
        factories[Role.TRAINING] = functools.partial(
            SlotTrainerContext, self.policy_dir, self.lr, self.max_model_len, self.seed,
            device=g.backend.device_type, precision=g.backend.precision, dist=g.backend.dist)
        t = time.perf_counter()
        # engine start-up under load takes minutes on 2 shared cores: a long call timeout
        per_host = g.backend.per_host(g.devices)
        # a training replica of k slots: each rank Reads only its rows where they line up
        # with its FSDP2 shards (FsdpShardLayouts), else a full copy
        kv = read_hf_config(self.policy_dir)[0].get("num_key_value_heads", 0)
        layouts = FsdpShardLayouts(metas, {POLICY: int(kv)})
        self.ctl = MeshController(alloc, self.source, factories, call_timeout_s=900.0,
                                  layouts=layouts,
                                  slot_env=functools.partial(g.backend.slot_env,
                                                             per_host=per_host),
                                  proc_per_role=per_role,
                                  replica_sizes=g.replica_devices)
        self.slots_up_s = time.perf_counter() - t
        log.info("%d device slots with %d engines up in %.1f s", g.devices,
                 g.devices * len(INFERENCE_ROLES), self.slots_up_s)
        self.shares = SlotCpuShares(self.cpu_share, name=f"pivot{os.getpid()}")
        self._closers.append(self.shares.close)
        self.engine_start_s: dict[int, dict[str, float]] = {}
        for d in range(g.devices):
            info = self.ctl.describe(d)
            for pid in info["pids"]:   # a slot's share covers all of its procs
                self.shares.assign(d, pid)
            self.engine_start_s[d] = {r: c["engine_start_s"] for r, c in
                                      info["contexts"].items() if "engine_start_s" in c}
        self.startup_s = time.perf_counter() - t0
        return self

    def _load_initial(self) -> None:
        for m, sd in self.initial.items():
            self.source.gps.load(m, sd)

    def cap_slots(self, devices: Sequence[int]) -> None:
        """Puts the current processes of ``devices`` under their slots' CPU shares (a
        replaced slot's new processes are not yet)."""
        for d in devices:
            for pid in self.ctl.describe(d)["pids"]:
                self.shares.assign(d, pid)

    def reset(self) -> float:
        """Every replica shifted down to idle, the initial policy back in GPS;
        engines and trainer contexts stay (a slot whose process died is replaced).
        Returns seconds."""
        t = time.perf_counter()
        sh = self.ctl.shifter
        self.ctl.poll_faults()     # slot processes that died and the run did not replace
        for rid in list(self.ctl.device_map.replicas()):
            sh.shift_down(rid)
        self.ctl.disarm_faults()   # a fault a test armed and no shift met
        dead = tuple(sorted(self.ctl.dead))
        if dead:
            self.ctl.recover(dead)
            self.cap_slots(dead)
        lost = self.ctl.device_map.devices_in(SlotKind.LOST)
        still = sorted(set(lost) - set(self.ctl.restore(lost))) if lost else []
        if still:   # the next run would have fewer devices than its group says
            raise StateError(f"ClusterStack.reset: devices {still} stay lost after the last "
                             f"run (their failed shifts were not rolled back); start a new "
                             f"stack")
        # the GenRM is frozen (sec. 5.1: GPS refuses a second install); only the policy
        # changed during the last run
        self.source.gps.load(POLICY, self.initial[POLICY])
        self.runs += 1
        return time.perf_counter() - t

    def close(self) -> None:
        """Removes the cgroups and stops the slots (their engines end with their procs)."""
        run_closers(self._closers)
        if self.started:
            try:
                alloc = self.ctl.alloc
                self.ctl.stop()   # ends a multi-host job, and with it its hosts' procs
                if alloc.job is None:
                    alloc.procs.stop().get()
            except Exception as e:  # noqa: BLE001 - closing goes on past a dead slot
                log.warning("close: stopping the slots: %s", e)
            self.ctl = None
            if self.group.backend.kind == "cpu":   # the TP ranks' CPU shm segments
                from pivot.compat.vllm import remove_cpu_shm
                remove_cpu_shm(self._tp_ports)

