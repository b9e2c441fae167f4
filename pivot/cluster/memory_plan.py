"""The memory plan of a model group on a described cluster, before any process starts.

``launchers/run.py ... --dry_run`` builds the whole driver for a ``ClusterSpec`` (hosts,
GPUs a host, GPU / host / ``/dev/shm`` memory) and prints this plan: per GPU the processes
it holds on ``cuda`` (a policy engine, a GenRM engine and a trainer rank, a process per
role, sec. 5.2) and their memory, per host the GPS arenas (sec. 5.1, app. B.1), and what
does not fit, each refusal naming the binding and the fix. Pure functions of the group's
bindings and its ``ModelProfile``s (params, ``Architecture``): nothing here imports torch's
devices or starts anything.

Estimates (GB = 1e9 bytes, as ``pivot.spec.profile.H20_MEMORY_BYTES``):

- engine: weights ``2 P / d`` bytes a GPU (bf16, a replica of ``d`` devices, table 1);
  its pool ``share x GPU`` (vLLM's ``gpu_memory_utilization``); KV = pool - weights -
  ``ENGINE_RUNTIME_GB``; tokens = KV x d / ``kv_bytes_per_token``.
- trainer rank (FSDP2 over ``r`` ranks, ``pivot.roles.trainer``: fp32 master weights and
  AdamW state, bf16 compute): params ``4 P / r``, grads ``4 P / r``, AdamW moments
  ``8 P / r``, the gathered bf16 blocks ``2 x 2 P_block`` (the block computed and the one
  prefetched), and activations of the rows a rank runs at once: the trainer runs its
  whole slice of the batch in one forward (no micro-batches, no activation
  checkpointing), ``rows x L x (layers x A + 10 V)`` bytes with ``A = 2 (5 h + 2 q +
  2 kv + 3 I)`` (bf16 tensors saved per token and layer: two norms' in/out, q/k/v, the
  attention output, the residual, gate/up/act; flash attention keeps no L^2 scores) and
  ``10 V`` the logits (bf16, their fp32 copy and log-softmax, ``token_logprobs``).
- host: GPS arenas in ``/dev/shm`` (``pivot.gps.storage``): fp32 copies (the stack reads
  checkpoints into fp32), the layout of ``plan_storage`` for the per-host budget, the
  policy twice (published + the Write's staging arena, ``HostStore.recycle``); plus the
  trainer ranks' offloaded AdamW state and grads (``Trainer.offload``) and
  ``HOST_PROC_GB`` a process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gin

from pivot.config.validation import check_range
from pivot.errors import ConfigError
from pivot.gps.layout import ModelMeta, ParamMeta, StorageLayout, plan_storage
from pivot.runtime.backend import GPS_HOST_FRACTION
from pivot.spec.profile import ModelProfile

GB = 1e9
CUDA_CONTEXT_GB = 0.5
"""A CUDA context a process (assumption; three a GPU on ``cuda``)."""
ENGINE_RUNTIME_GB = 1.0
"""An engine's working memory besides weights and KV (sampler, profile-run peak; eager
mode, no CUDA graphs): an assumption."""
HOST_PROC_GB = 4.0
"""Host memory of one slot process (torch, vLLM, NCCL buffers): an assumption."""
POLICY_GPS_COPIES = 2
"""GPS arenas of the policy a host holds: the published version and a Write's staging."""


@gin.configurable
@dataclass(frozen=True)
class ClusterSpec:
    """A described cluster (``--dry_run``); the defaults are the paper's (sec. 8.1: 16
    hosts x 8 H20 of 96 GB). Host memory and ``/dev/shm`` are not in the paper: 2 TB and
    half of it (Linux's default ``/dev/shm`` size), assumptions of an H20 node.
    """

    hosts: int = 16
    gpus_per_host: int = 8
    gpu_gb: float = 96.0
    host_gb: float = 2048.0
    shm_gb: float = 1024.0
    gpu_name: str = "H20"

    def __post_init__(self) -> None:
        for k in ("hosts", "gpus_per_host"):
            check_range(f"ClusterSpec.{k}", getattr(self, k), 1, integer=True)
        for k in ("gpu_gb", "host_gb", "shm_gb"):
            check_range(f"ClusterSpec.{k}", getattr(self, k), 0, open_lo=True, why="GB")


@dataclass(frozen=True)
class EngineMemory:
    """One engine's part of a GPU (bytes) and its replica's KV tokens."""

    model: str
    devices: int
    share: float
    pool: float
    weights: float
    kv: float
    kv_tokens: int
    max_model_len: int
    max_num_seqs: int


@dataclass(frozen=True)
class TrainerMemory:
    """One FSDP2 rank's GPU memory (bytes) while training."""

    ranks: int
    rows: int
    seq_len: int
    params: float
    grads: float
    optimizer: float
    gathered: float
    activations: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.gathered + self.activations

    @property
    def offload(self) -> float:
        """What ``Trainer.offload`` moves to host memory: AdamW state and grads."""
        return self.grads + self.optimizer


@dataclass(frozen=True)
class Refusal:
    binding: str
    why: str

    def __str__(self) -> str:
        return f"{self.binding}: {self.why}"


@dataclass(frozen=True)
class MemoryPlan:
    """The plan: per GPU (the same on every GPU: each holds all three roles) and per host."""

    spec: ClusterSpec
    group: str
    devices: int
    hosts: int
    policy: EngineMemory
    genrm: EngineMemory
    trainer: TrainerMemory
    gps_k: int
    gps_host: list[float]
    host_other: float
    refusals: list[Refusal] = field(default_factory=list)

    @property
    def gpu_peak(self) -> float:
        """The busiest GPU: both engines' pools at start, or training (engines asleep)."""
        ctx = 3 * CUDA_CONTEXT_GB * GB
        return ctx + max(self.policy.pool + self.genrm.pool, self.trainer.total)

    def check(self) -> None:
        """Raises ConfigError naming every binding that does not fit, with its fix."""
        if self.refusals:
            raise ConfigError(f"model group {self.group!r} does not fit {self.hosts} hosts x "
                              f"{self.spec.gpus_per_host} {self.spec.gpu_name} "
                              f"{self.spec.gpu_gb:g} GB: "
                              + "; ".join(str(r) for r in self.refusals))


PARAM_BYTES, GRAD_BYTES, ADAMW_BYTES = 4, 4, 8
"""Bytes per parameter of the trainer's state (fp32 master weight, fp32 gradient, AdamW's
two fp32 moments)."""


def activation_bytes_per_token(arch) -> float:
    """Bytes a token keeps for backward in the trainer: ``layers x A + 10 V`` (module
    docstring)."""
    q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    width = arch.intermediate or arch.experts_per_token * arch.moe_intermediate
    per_layer = 2 * (5 * arch.hidden + 2 * q + 2 * kv + 3 * width)
    return arch.layers * per_layer + 10 * arch.vocab


def engine_memory(m: ModelProfile, share: float, gpu_bytes: float, max_model_len: int,
                  max_num_seqs: int) -> EngineMemory:
    """One engine of ``m`` on a GPU at vLLM share ``share`` (bf16 weights, sec. 8.1)."""
    pool = share * gpu_bytes
    weights = 2.0 * m.params_b * 1e9 / m.devices
    kv = max(pool - weights - ENGINE_RUNTIME_GB * GB, 0.0)
    return EngineMemory(m.name, m.devices, share, pool, weights, kv,
                        int(kv * m.devices / m.kv_bytes_per_token), max_model_len,
                        max_num_seqs)


def trainer_memory(m: ModelProfile, ranks: int, rows: int, seq_len: int) -> TrainerMemory:
    """One FSDP2 rank of ``ranks`` training ``m`` on ``rows`` rows of ``seq_len`` tokens
    at once (module docstring; table 4's training devices)."""
    p = m.params_b * 1e9
    if m.arch is None:
        raise ConfigError(f"ModelProfile {m.name}: the trainer's activations need its "
                          f"Architecture (bind ModelProfile.arch)")
    a = m.arch
    block = (p - a.vocab * a.hidden * (1 if a.tied_embeddings else 2)) / a.layers
    return TrainerMemory(ranks, rows, seq_len, PARAM_BYTES * p / ranks,
                         GRAD_BYTES * p / ranks, ADAMW_BYTES * p / ranks,
                         2 * 2 * block, rows * seq_len * activation_bytes_per_token(a))


def gps_meta(m: ModelProfile, pieces: int = 64) -> ModelMeta:
    """``m``'s fp32 parameters as ``pieces`` equal tensors (what ``plan_storage`` needs:
    sizes; big tensors split along rows as the real ones do)."""
    cols = 1024
    rows = max(int(m.params_b * 1e9 / pieces / cols), 1)
    return ModelMeta(m.name, tuple(ParamMeta(f"model.layers.{i}.w", (rows, cols))
                                   for i in range(pieces)))


def plan(spec: ClusterSpec, *, name: str, devices: int, policy: ModelProfile,
         genrm: ModelProfile, engines: dict, train_ranks: int, train_rows: int,
         gps_host_gb: float = 0.0) -> MemoryPlan:
    """The plan of a group of ``devices`` on ``spec``.

    Args:
        engines: ``ClusterGroup``'s engine fields (``policy_max_model_len``, ...).
        train_ranks / train_rows: the training replica's ranks and a step's rows
            (``ModelGroup.prompts_per_step x n``); a rank runs ``ceil(rows / ranks)``.
        gps_host_gb: ``Backend.gps_host_gb`` (0: ``GPS_HOST_FRACTION`` of ``host_gb``).
    """
    gpu = spec.gpu_gb * GB
    per_host = spec.gpus_per_host
    hosts = -(-devices // per_host)
    out: list[Refusal] = []
    eng = {}
    for k, m in (("policy", policy), ("genrm", genrm)):
        e = engine_memory(m, engines[f"{k}_memory_share"], gpu, engines[f"{k}_max_model_len"],
                          engines[f"{k}_max_num_seqs"])
        eng[k] = e
        if e.kv_tokens < e.max_model_len:
            out.append(Refusal(
                f"ClusterGroup.{k}_memory_share", f"{m.name}: {e.weights / GB:.1f} GB of "
                f"weights a GPU leave {e.kv / GB:.1f} GB of its {e.pool / GB:.1f} GB share, "
                f"{e.kv_tokens} KV tokens, fewer than one sequence of {e.max_model_len}; "
                f"raise {k}/ModelProfile.mem_util (cluster_group.engine_share), its "
                f"ModelProfile.devices (TP/EP), or use larger GPUs (ClusterSpec.gpu_gb)"))
    rows = -(-train_rows // train_ranks)
    tr = trainer_memory(policy, train_ranks, rows, engines["policy_max_model_len"])
    ctx = 3 * CUDA_CONTEXT_GB * GB
    if ctx + eng["policy"].pool + eng["genrm"].pool > gpu:
        out.append(Refusal("ClusterGroup.policy_memory_share + genrm_memory_share",
                           "both pools and 3 CUDA contexts exceed a GPU; lower them"))
    if ctx + tr.total > gpu:
        out.append(Refusal(
            "ModelGroup.prompts_per_step", f"a trainer rank needs {tr.total / GB:,.0f} GB "
            f"(states {(tr.total - tr.activations) / GB:.1f} GB + activations of {rows} "
            f"rows x {tr.seq_len} tokens at once, {tr.activations / GB:,.0f} GB) on a "
            f"{spec.gpu_gb:g} GB GPU: pivot.roles.trainer runs a rank's whole slice of the "
            f"batch in one forward, without micro-batches or activation checkpointing; "
            f"lower ModelGroup.prompts_per_step or LengthModel.prompt_cap / response_cap, "
            f"raise TrainingProfile.devices, or add micro-batching to the trainer"))
    budget = gps_host_gb * 2**30 if gps_host_gb else GPS_HOST_FRACTION * spec.host_gb * GB
    metas = {m.name: gps_meta(m) for m in (policy, genrm)}
    try:
        layout = plan_storage(list(metas.values()), hosts, int(budget))
        one = StorageLayout(layout.hosts, layout.k, tuple(
            (m, ps) for m, ps in layout.shards if m == policy.name)).host_bytes(metas)
        both = layout.host_bytes(metas)
        gps = [b + (POLICY_GPS_COPIES - 1) * p for b, p in zip(both, one)]
        k = layout.k
    except ConfigError as e:
        out.append(Refusal("Backend.gps_host_gb", f"{e}"))
        gps, k = [0.0] * hosts, hosts
    ranks_a_host = min(per_host, train_ranks)
    other = ranks_a_host * tr.offload + 3 * per_host * HOST_PROC_GB * GB
    if max(gps) > spec.shm_gb * GB:
        out.append(Refusal("ClusterSpec.shm_gb", f"GPS arenas of {max(gps) / GB:.0f} GB a "
                           f"host exceed /dev/shm of {spec.shm_gb:g} GB; mount a larger "
                           f"/dev/shm or lower Backend.gps_host_gb (models split over hosts)"))
    if max(gps) + other > spec.host_gb * GB:
        out.append(Refusal("Backend.gps_host_gb", f"GPS {max(gps) / GB:.0f} GB + offloaded "
                           f"trainer state and processes {other / GB:.0f} GB exceed a host's "
                           f"{spec.host_gb:g} GB (ClusterSpec.host_gb); lower it"))
    if hosts > spec.hosts:
        out.append(Refusal("ModelGroup.devices", f"{devices} devices need {hosts} hosts of "
                           f"{per_host}, the cluster has {spec.hosts} (ClusterSpec.hosts)"))
    return MemoryPlan(spec, name, devices, hosts, eng["policy"], eng["genrm"], tr, k, gps,
                      other, out)


def plan_of(driver, group, spec: ClusterSpec) -> MemoryPlan:
    """The plan of a built ``ClusterDriver`` of the model group ``group`` (its
    ``ModelGroup``) on ``spec``."""
    g = driver.group
    engines = {f"{k}_{f}": getattr(g, f"{k}_{f}") for k in ("policy", "genrm")
               for f in ("max_model_len", "max_num_seqs", "memory_share")}
    return plan(spec, name=g.name, devices=g.devices, policy=group.policy,
                genrm=group.genrm or group.policy, engines=engines,
                train_ranks=driver.train_needed,
                train_rows=driver.stream.prompts_per_step * g.n,
                gps_host_gb=g.backend.gps_host_gb)
