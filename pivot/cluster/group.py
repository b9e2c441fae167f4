"""The model group of the real driver: a policy and a GenRM on N device slots.

By default the tiny models on this CPU's slots; a paper model group on GPUs comes from
``pivot.cluster.model_groups.cluster_group``. Checked before any engine starts: the model
folders, and the slots against the backend (``pivot.runtime.backend``: this machine's cores
and memory on ``cpu``, its GPUs and the replicas' aligned blocks on ``cuda``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import gin

from pivot.config.validation import check_bool, check_range, check_text, default_of, fail
from pivot.errors import ConfigError
from pivot.models import ensure_models
from pivot.models import paths as model_paths
from pivot.models.build import GENRM_MAX_NEW_TOKENS, POLICY_MAX_NEW_TOKENS
from pivot.roles.engine.config import EngineConfig, check_model_dir
from pivot.runtime.backend import Backend
from pivot.types import Role

log = logging.getLogger(__name__)


@gin.configurable
@dataclass(frozen=True)
class ClusterGroup:
    """Attributes:
        name: label of the run folder.
        devices: device slots (Monarch procs); 4 by default.
        policy_dir / genrm_dir: HF folders of the two models (launchers/build_models.py);
            if absent and ``random_if_missing``, random tiny Qwen3s are written instead
            (they cannot learn the task: the run then only exercises the system).
        training_devices: slots of a training replica when the deployment leaves it to the
            group (``Deployment.training_devices = 0``: disaggregated, rr-colocated,
            PivotRL); its trainer runs FSDP2 over gloo across them (sec. 8.1).
            Colocated trains on every slot (``Deployment.training_devices = -1``). One
            GRPO step of 128 x 96 tokens takes 2.05 / 1.31 / 1.08 s on 1 / 2 / 4 slots at
            half a core each (``benchmarks/train_slots.py`` ->
            results/local/train_slots.json); 2 needs a disaggregated split of 1 rollout / 1
            reward. PivotRL training on 2 slots (``gin/deployments/pivotrl_train2.gin``)
            measured 1.13x the best static split (1/1/2) over 6 seeds, against 0.91x for 1
            (results/local/throughput_min0*.json); 1 stays the default until every
            deployment's table is rerun with 2.
        n: responses per prompt (GRPO group).
        max_response_tokens / max_judge_tokens: generation caps. The worked solutions of
            1-10 steps (``pivot.data.chains``) take 16 tokens for one step and about 98 for
            ten; the GenRM copies and checks each step line (about 100 tokens for ten). The
            model build evaluates with the same caps (``pivot.models.build``).
        temperature: rollout sampling temperature (the GenRM judges greedily).
        ignore_eos: every response runs to ``max_response_tokens``, past EOS (load and
            reliability runs: the tiny policy often stops within a few tokens, too soon
            for a shift to land mid-generation); the reward sees the whole text.
        num_blocks: KV blocks of 32 tokens per engine.
        gb_per_slot: resident memory of one slot (engine + trainer), for the fit check.
        memory_budget_gb: what the slots may use together on this shared machine (12: the
            4 slots share a 24 GiB machine).
        backend: what a slot is (``cpu``: a capped proc of this machine; ``cuda``: a GPU).
        policy_replica_devices / genrm_replica_devices: devices of one rollout / reward
            replica (TP x EP); the ``cpu`` engines serve a full copy per slot (1).
        load_format: vLLM's ``load_format`` (``dummy``: random weights of the real shapes,
            for a model group whose checkpoints are not at hand).
        expert_parallel: a replica of several devices of an MoE model divides the
            experts among them (EP, as the paper serves its MoE GenRMs; attention stays
            TP); False slices every expert instead. Dense models ignore it.
        policy_max_model_len / genrm_max_model_len: each model's engine context, tokens
            (the policy's is also the trainer's RoPE length); a paper group's come from
            its length caps (``cluster_group``: prompt + response for the policy, the
            judge prompt holding the cut response + judgement for the GenRM).
        policy_max_num_seqs / genrm_max_num_seqs: each engine's batch cap (vLLM
            ``max_num_seqs``).
        policy_memory_share / genrm_memory_share: each engine's vLLM
            ``gpu_memory_utilization`` on ``cuda``: both engines live on every GPU, each
            asleep when its role is not there (sec. 5.2), so each takes its own share;
            unused on ``cpu`` (the KV cache is ``num_blocks``).
    """

    name: str = "tiny_cpu"
    devices: int = 4
    policy_dir: str = "cache/models/policy"
    genrm_dir: str = "cache/models/genrm"
    random_if_missing: bool = False
    training_devices: int = 1
    n: int = 4
    max_response_tokens: int = POLICY_MAX_NEW_TOKENS
    max_judge_tokens: int = GENRM_MAX_NEW_TOKENS
    temperature: float = 1.0
    ignore_eos: bool = False
    num_blocks: int = 256
    gb_per_slot: float = 2.5
    memory_budget_gb: float = 12.0
    backend: Backend = Backend()
    policy_replica_devices: int = 1
    genrm_replica_devices: int = 1
    load_format: str = "auto"
    expert_parallel: bool = True
    policy_max_model_len: int = default_of(EngineConfig, "max_model_len")
    genrm_max_model_len: int = default_of(EngineConfig, "max_model_len")
    policy_max_num_seqs: int = default_of(EngineConfig, "max_num_seqs")
    genrm_max_num_seqs: int = default_of(EngineConfig, "max_num_seqs")
    policy_memory_share: float = 0.45
    genrm_memory_share: float = 0.45

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Every field, then the slots against this machine (run again by the stack)."""
        for k in ("name", "policy_dir", "genrm_dir"):
            check_text(f"ClusterGroup.{k}", getattr(self, k))
        for k in ("random_if_missing", "ignore_eos", "expert_parallel"):
            check_bool(f"ClusterGroup.{k}", getattr(self, k))
        check_range("ClusterGroup.devices", self.devices, 2, integer=True,
                    why="the cluster driver needs >= 2 device slots (rollout/reward and "
                        "training)")
        check_range("ClusterGroup.training_devices", self.training_devices, 1, self.devices,
                    integer=True, why=f"slots of a training replica, at most "
                                      f"ClusterGroup.devices={self.devices}")
        check_range("ClusterGroup.n", self.n, 2, integer=True,
                    why="GRPO needs >= 2 responses per prompt")
        for k in ("max_response_tokens", "max_judge_tokens"):
            check_range(f"ClusterGroup.{k}", getattr(self, k), 1, integer=True, why="tokens")
        check_range("ClusterGroup.temperature", self.temperature, 0, why="0 is greedy")
        for m in ("policy", "genrm"):
            check_range(f"ClusterGroup.{m}_max_model_len", getattr(self, f"{m}_max_model_len"),
                        2, integer=True, why="tokens of the engine's context")
            check_range(f"ClusterGroup.{m}_max_num_seqs", getattr(self, f"{m}_max_num_seqs"),
                        1, integer=True, why="the engine's batch cap")
            check_range(f"ClusterGroup.{m}_memory_share", getattr(self, f"{m}_memory_share"),
                        0, 1, open_lo=True, why="vLLM's gpu_memory_utilization of the engine")
        check_range("ClusterGroup.policy_memory_share + genrm_memory_share",
                    self.policy_memory_share + self.genrm_memory_share, 0, 1,
                    why="both engines start on every GPU, each with its share")
        block = default_of(EngineConfig, "block_size")
        longest = max(self.policy_max_model_len, self.genrm_max_model_len)
        check_range("ClusterGroup.num_blocks", self.num_blocks, -(-longest // block),
                    integer=True, why=f"KV blocks of {block} tokens: at least one sequence "
                                      f"of max_model_len={longest}")
        for k in ("gb_per_slot", "memory_budget_gb"):
            check_range(f"ClusterGroup.{k}", getattr(self, k), 0, open_lo=True, why="GB")
        if not isinstance(self.backend, Backend):
            raise ConfigError(f"ClusterGroup.backend={self.backend!r}: bind @Backend() "
                              f"(pivot.runtime.backend)")
        check_text("ClusterGroup.load_format", self.load_format)
        self.backend.check(self.devices, {
            "rollout": self.policy_replica_devices, "reward": self.genrm_replica_devices,
            "training": self.training_devices}, where=f"model group {self.name!r}")
        self.backend.check_host_share(self.devices, self.gb_per_slot, self.memory_budget_gb,
                                      where=f"model group {self.name!r}")
        for k in ("policy_replica_devices", "genrm_replica_devices"):
            check_range(f"ClusterGroup.{k}", getattr(self, k), 1, self.devices, integer=True,
                        why="devices of one tensor-parallel replica")
            if getattr(self, k) > 1 and not self.backend.procs_per_role:
                fail(f"ClusterGroup.{k}", getattr(self, k),
                     "a replica of several devices needs a process per role on each slot "
                     "(its engine's parallel group is per process): set "
                     "Backend.proc_per_role = True, or use 1")

    @property
    def replica_devices(self) -> dict[Role, int]:
        """Devices of one replica of each inference role: its model's TP size, fixed when
        its engines start (the driver's shapes, the stack's engines and the controller's
        aligned-block check all read it here)."""
        return {Role.ROLLOUT: self.policy_replica_devices,
                Role.REWARD: self.genrm_replica_devices}

    def model_dirs(self) -> tuple[str, str]:
        """The two model folders, checked (or written at random when allowed)."""
        out = []
        for kind, d, seed in (("policy", self.policy_dir, 0), ("genrm", self.genrm_dir, 1)):
            p = Path(d)
            built = getattr(model_paths(), kind)
            if not p.is_dir() and p.resolve() == built.resolve():
                # The project's own tiny models: build them (tokenizer, SFT) on first use.
                log.info("%s folder %s is missing: building the tiny models "
                         "(launchers/build_models.py: about 6 minutes on two free cores, longer on "
                         "a busy machine)", kind, d)
                ensure_models()
            if not p.is_dir() and self.random_if_missing:
                from pivot.roles.engine.tiny import make_tiny_qwen3
                p = Path("cache/models") / f"random_{kind}"
                if not (p / "config.json").is_file():
                    log.warning("%s folder %s is missing: writing a RANDOM tiny Qwen3 to %s "
                                "(build the real ones with launchers/build_models.py)",
                                kind, d, p)
                    make_tiny_qwen3(p, seed=seed)
                else:
                    log.warning("%s folder %s is missing: using the random model in %s",
                                kind, d, p)
            out.append(str(check_model_dir(p)))
        return out[0], out[1]
