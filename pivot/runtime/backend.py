"""The device backend of the real driver: what a device slot is (docs/design.md).

One driver (``pivot.cluster``) runs on two backends, chosen in gin by ``Backend.kind``:

- ``cpu`` (the embedded default): a slot is a Monarch proc with a fixed CPU share (cgroup
  v1 quota, ``pivot.cluster.cpu.cgroups``); vLLM's CPU worker in fp32 (bf16 has no oneDNN kernel
  on this AVX2 machine, docs/stack.md) whose memory is released by
  ``pivot.roles.engine.sleep.CpuStorageMemory``; torch.distributed over gloo.
- ``cuda``: a slot is one GPU of its host (the slot's proc binds ``cuda:<local index>``);
  vLLM's CUDA worker in bf16 with ``enable_sleep_mode`` (``VllmSleepMemory``); NCCL.

Code above the backend reads its fields (``device_type``, ``dist``, ``dtype``) and never
branches on the device type itself. Everything a backend can refuse is refused here, at
construction, before any process or engine starts: a ``cuda`` backend on a machine
without GPUs, a host with fewer GPUs than asked for, and a model group whose replicas
(TP x EP devices) do not fit its hosts as aligned blocks (sec. 5.2: a replica's parallel
groups are fixed when its engine starts, so it lives on one aligned block of one host).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import gin

from pivot.config.validation import check_range, fail

KINDS = ("cpu", "cuda")
_CLUSTER_DOC = "README.md, 'Running on a cluster'"
GPS_HOST_FRACTION = 0.25
"""Share of a host's memory GPS holds by default: the paper keeps parameters in host memory
beside the engines' and trainer's host-side state (sec. 5.1); a quarter leaves the rest to
them and to pinned staging buffers."""


@gin.configurable
@dataclass(frozen=True)
class Backend:
    """Attributes:
        kind: ``cpu`` or ``cuda``.
        hosts: hosts of the job; the devices are spread over them equally (host h holds
            devices ``[h * per_host, (h + 1) * per_host)``).
        devices_per_host: devices a host contributes; 0 means all of the job's devices
            over ``hosts`` (``cpu``) or every GPU the host has (``cuda``).
        job: where several hosts come from, a Monarch job type (``pivot.gps.hosts.
            HostJob``): ``process`` (local subprocesses, what runs here), ``slurm``,
            ``kubernetes``; its options are ``HostJob.options`` in gin.
    """

    kind: str = "cpu"
    hosts: int = 1
    devices_per_host: int = 0
    job: str = "process"
    gps_host_gb: float = 0.0
    """Host memory one GPS actor may hold (app. B.1's per-host budget, which picks the
    storage layout's group size k); 0: ``GPS_HOST_FRACTION`` of this host's physical
    memory (the job's hosts are taken to be alike)."""
    proc_per_role: bool | None = None
    """Whether a slot holds a process per role (policy engine, GenRM engine, trainer)
    instead of one process for all three. vLLM keeps its sleep allocator and parallel
    groups once per process, so ``cuda`` needs it; on ``cpu`` one
    process a slot saves memory (every process carries its own torch and vLLM).
    None: per role on ``cuda``, one a slot on ``cpu``."""

    untested_cuda: bool = False
    """Run on ``cuda`` though no GPU run has checked it. The trainer is written for a
    slot's GPU (bf16, meta-device build, NCCL side groups: ``pivot.roles.trainer``,
    ``pivot.compat.torch_dist.nccl_side_group``) and the engines for vLLM's sleep mode
    (``VllmSleepMemory``), but none of it has run on a GPU (docs/results.md, "The
    cluster backend: what has run"): ``check`` refuses ``cuda`` unless this is True, and
    the console then says so at the start of the run."""

    described_gpus: int = 0
    """GPUs a host has in a described cluster (``launchers/run.py --dry_run``: its
    ``ClusterSpec.gpus_per_host``), used instead of probing this machine; nothing starts
    with it set (``ClusterStack.start`` refuses). 0: probe."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            fail("Backend.kind", self.kind, f"must be one of {KINDS} ('cpu': slots on this "
                                            f"machine's cores; 'cuda': one GPU per slot)")
        check_range("Backend.hosts", self.hosts, 1, integer=True, why="hosts of the job")
        check_range("Backend.devices_per_host", self.devices_per_host, 0, integer=True,
                    why="0: every device of the host")
        check_range("Backend.described_gpus", self.described_gpus, 0, integer=True,
                    why="GPUs a described host has (--dry_run); 0: probe this machine")
        check_range("Backend.gps_host_gb", self.gps_host_gb, 0,
                    why="GiB of host memory for GPS; 0: a share of this host's memory")
        if self.proc_per_role is False and self.kind == "cuda":
            fail("Backend.proc_per_role", self.proc_per_role,
                 "a cuda slot needs a process per role (vLLM's sleep allocator and "
                 "parallel groups are per process); leave it None or set True")
        from pivot.gps.hosts import JOB_KINDS
        if self.job not in JOB_KINDS:
            fail("Backend.job", self.job, f"must be one of {JOB_KINDS} (Monarch job types)")

    @property
    def procs_per_role(self) -> bool:
        """``proc_per_role`` resolved for this kind."""
        return self.kind == "cuda" if self.proc_per_role is None else self.proc_per_role

    @property
    def device_type(self) -> str:
        """torch's device type of a slot."""
        return self.kind

    @property
    def dist(self) -> str:
        """torch.distributed backend of the training replica's process group."""
        return "nccl" if self.kind == "cuda" else "gloo"

    @property
    def dtype(self) -> str:
        """Engine and trainer compute dtype (fp32 on CPU: docs/stack.md)."""
        return "bfloat16" if self.kind == "cuda" else "float32"

    def gps_budget_bytes(self) -> int:
        """Per-host GPS budget in bytes (``gps_host_gb``, or the share of this host)."""
        if self.gps_host_gb:
            return int(self.gps_host_gb * 2**30)
        import os
        return int(GPS_HOST_FRACTION * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))

    @property
    def precision(self) -> str:
        """The trainer's ``Trainer.Config.precision``: bf16 compute with fp32 master
        weights on GPUs, fp32 on the CPU."""
        return "bf16" if self.kind == "cuda" else "fp32"

    @property
    def sleep_mode(self) -> bool:
        """Whether engines start with vLLM's sleep allocator (``enable_sleep_mode``)."""
        return self.kind == "cuda"

    def slot_env(self, device: int, per_host: int) -> dict[str, str]:
        """Environment of ``device``'s slot proc, set before its engines and trainer are
        built: on ``cuda`` the slot sees only its own GPU (its index on the host)."""
        if self.kind == "cuda":
            return {"CUDA_VISIBLE_DEVICES": str(device % per_host)}
        return {}

    def per_host(self, devices: int, gpus: int | None = None) -> int:
        """Devices per host for a job of ``devices``; ``gpus`` is the GPUs one host has
        (None: probed, ``cuda`` only)."""
        if self.devices_per_host:
            return self.devices_per_host
        if self.kind == "cuda":
            return self.gpus_per_host() if gpus is None else gpus
        return -(-devices // self.hosts)

    def gpus_per_host(self) -> int:
        """GPUs of one host: the described cluster's (``described_gpus``), else probed."""
        return self.described_gpus or visible_gpus()

    def check(self, devices: int, replicas: Mapping[str, int], *,
              gpus: int | None = None, where: str = "") -> None:
        """Refuses what this backend cannot run, before any process starts.

        Args:
            devices: the group's devices.
            replicas: role -> devices of one replica of it (TP x EP; training: the
                replica's FSDP ranks).
            gpus: GPUs of one host (None: ``described_gpus``, else probed with
                ``torch.cuda.device_count()``).
            where: the gin file or group the values come from, for the message.

        Raises:
            ConfigError: naming the binding, the value and the fix.
        """
        src = f" (in {where})" if where else ""
        if self.kind == "cuda":
            have = self.gpus_per_host() if gpus is None else gpus
            if have == 0:
                fail("Backend.kind", self.kind,
                     f"this machine has no CUDA device (torch.cuda.device_count() == 0)"
                     f"{src}; run on GPU hosts ({_CLUSTER_DOC}) or use Backend.kind = "
                     f"'cpu' (gin/tiny_cpu.gin)")
            if self.devices_per_host > have:
                fail("Backend.devices_per_host", self.devices_per_host,
                     f"this host has {have} GPUs{src}; lower it to <= {have} or 0 (all)")
        per_host = self.per_host(devices, gpus)
        errors = fit_errors(devices, self.hosts, per_host, replicas)
        if errors:
            fail("Backend", f"{self.kind} x {self.hosts} hosts x {per_host} devices",
                 "; ".join(errors) + f"{src}")
        if self.kind == "cuda" and not self.untested_cuda and not self.described_gpus:
            fail("Backend.kind", self.kind,
                 f"no GPU run has checked the cuda backend yet (the trainer's bf16 / NCCL "
                 f"path and vLLM's sleep mode are written, never run on a GPU: "
                 f"docs/results.md, 'The cluster backend: what has run'){src}; run "
                 f"launchers/gpu_check.py on one GPU first, then bind "
                 f"Backend.untested_cuda = True to run it anyway")

    @property
    def warning(self) -> str | None:
        """The console line a run of this backend starts with, if any."""
        if self.kind == "cuda" and self.untested_cuda:
            return ("warning: Backend.untested_cuda = True: this cuda backend has never run "
                    "on a GPU in this project's checks; report what fails")
        return None

    def check_host_share(self, devices: int, gb_per_slot: float, memory_budget_gb: float,
                         *, where: str = "") -> None:
        """The slots against one host's cores and memory on ``cpu`` (a slot is a capped
        proc of this machine). On ``cuda`` a slot is a GPU: its memory is vLLM's own check
        (``gpu_memory_utilization``) and the host's cores are not split."""
        if self.kind != "cpu":
            return
        import os
        src = f" ({where})" if where else ""
        cores = os.cpu_count() or 1
        per_host = -(-devices // self.hosts)
        if per_host > 4 * cores:
            fail("ClusterGroup.devices", devices,
                 f"{per_host} slots a host do not fit this machine's {cores} cores (at most "
                 f"{4 * cores} a host){src}; lower it")
        need = per_host * gb_per_slot
        if need > memory_budget_gb:
            fail("ClusterGroup.devices", devices,
                 f"{per_host} slots a host x {gb_per_slot:g} GB = {need:.1f} GB exceeds "
                 f"ClusterGroup.memory_budget_gb={memory_budget_gb:g}{src}; lower devices")


def fit_errors(devices: int, hosts: int, per_host: int,
               replicas: Mapping[str, int]) -> list[str]:
    """Why ``devices`` over ``hosts`` hosts of ``per_host`` devices cannot hold the
    replicas (empty: they fit). A replica of k devices must lie on an aligned block of
    one host: k <= per_host and k divides per_host (sec. 5.2)."""
    out = []
    if devices > hosts * per_host:
        out.append(f"{devices} devices do not fit {hosts} hosts x {per_host}: add hosts "
                   f"(Backend.hosts) or lower the group's devices")
    for role, k in replicas.items():
        if k < 1:
            out.append(f"a {role} replica of {k} devices: must be >= 1")
        elif k > per_host:
            out.append(f"a {role} replica of {k} devices (TP x EP) spans more than one host "
                       f"of {per_host}: lower its TP/EP or use hosts with more devices")
        elif per_host % k:
            out.append(f"a {role} replica of {k} devices does not tile a host of {per_host} "
                       f"in aligned blocks: use a TP/EP that divides {per_host}")
        elif k > devices:
            out.append(f"a {role} replica of {k} devices exceeds the group's {devices}")
    return out


def visible_gpus() -> int:
    """GPUs this process can see (0 without CUDA); initialises no CUDA context."""
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
