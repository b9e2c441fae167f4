"""A paper model group (``gin/qwen*.gin``) on the real driver.

A model group's gin file binds ``ModelGroup`` (table 1: the models, their replica sizes,
the devices, the training column of table 4, the batch) for the simulator. Running the
same file on real devices takes one more file, ``gin/backends/cuda.gin`` (or ``cpu.gin``),
which rebinds ``run.driver = @ClusterDriver`` and builds its group with ``cluster_group``
from the very ``ModelGroup`` the simulator would use; nothing is restated:

    python launchers/run.py --gin gin/qwen7b_30b.gin --gin gin/backends/cuda.gin \
        --gin_param "cluster_group.checkpoints = '/data/hf'"

Everything the backend cannot run is refused by ``ClusterGroup.check`` before any process
starts (no GPU, replicas that do not tile a host, slots over a CPU host's memory).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gin

from pivot.config.validation import check_range, check_text, default_of
from pivot.cluster.config import PlannerCosts
from pivot.cluster.group import ClusterGroup
from pivot.cluster.memory_plan import ADAMW_BYTES, GRAD_BYTES, PARAM_BYTES
from pivot.rewards.genrm import judge_prompt_tokens
from pivot.rl.data import PromptStream
from pivot.roles.engine.config import EngineConfig
from pivot.runtime.backend import Backend
from pivot.spec.model_group import ModelGroup



@gin.configurable
def cluster_group(group: ModelGroup = gin.REQUIRED, backend: Backend = gin.REQUIRED,
                  checkpoints: str = "checkpoints", load_format: str = "auto",
                  num_blocks: int = 4096,
                  memory_budget_gb: float = default_of(ClusterGroup, "memory_budget_gb"),
                  engine_share: float = 0.5) -> ClusterGroup:
    """The ``ClusterGroup`` of a model group on ``backend``.

    Args:
        group: the model group (its gin file's ``ModelGroup``).
        backend: the devices (``Backend``); its hosts and devices per host default to
            the group's (``ModelGroup.devices_per_host``, 8 in table 4).
        checkpoints: folder of Hugging Face checkpoints, one sub-folder per model named as
            its ``ModelProfile.name`` (e.g. ``checkpoints/Qwen2.5-7B``); each host reads
            its own copy of this path.
        load_format: vLLM's ``load_format`` (``dummy``: random weights of the real
            shapes, when the checkpoints hold only configs and tokenizers).
        num_blocks: KV blocks per engine (vLLM sizes them from memory when it can).
        memory_budget_gb: what one CPU host's slots may hold together (``cpu`` only).
        engine_share: the part of each model's ``ModelProfile.mem_util`` its engine takes
            as ``gpu_memory_utilization``: the two engines share every GPU (sec. 5.2).

    The engines' lengths come from the group's caps (``LengthModel``, sec. 8.1): the
    policy's context is prompt + response; the GenRM's is its judge prompt (the problem,
    the response as ``build_genrm_prompt`` cuts it, the fixed text) + the judgement. The
    batch caps are the profiles' ``max_num_seqs`` (``EngineConfig``'s where None).
    """
    check_text("cluster_group.checkpoints", checkpoints)
    check_range("cluster_group.engine_share", engine_share, 0, 0.5, open_lo=True,
                why="each of the two engines on a GPU takes this part of its mem_util")
    genrm = group.genrm or group.policy
    root = Path(checkpoints)
    # the fit check on a CPU host: both engines' fp32 weights and the trainer's state
    gb = (PARAM_BYTES * (group.policy.params_b + genrm.params_b)
          + (PARAM_BYTES + GRAD_BYTES + ADAMW_BYTES) * group.policy.params_b)
    per_host = backend.devices_per_host or group.devices_per_host
    backend = dataclasses.replace(backend, devices_per_host=per_host,
                                  hosts=max(backend.hosts, -(-group.devices // per_host)))
    return ClusterGroup(
        name=group.name, devices=group.devices, backend=backend,
        policy_dir=str(root / group.policy.name), genrm_dir=str(root / genrm.name),
        training_devices=group.training.devices, n=group.n,
        max_response_tokens=group.lengths.response_cap,
        max_judge_tokens=group.lengths.judge_cap,
        policy_replica_devices=group.policy.devices,
        genrm_replica_devices=genrm.devices, load_format=load_format,
        num_blocks=num_blocks, gb_per_slot=gb, memory_budget_gb=memory_budget_gb,
        **engine_bindings(group, engine_share))


def engine_bindings(group: ModelGroup, engine_share: float = 0.5) -> dict[str, int | float]:
    """``ClusterGroup``'s engine fields (context, batch cap, memory share of each model)
    from a model group's length caps and profiles."""
    ln, genrm = group.lengths, group.genrm or group.policy
    seqs = default_of(EngineConfig, "max_num_seqs")
    return {
        "policy_max_model_len": ln.prompt_cap + ln.response_cap,
        "genrm_max_model_len": judge_prompt_tokens(ln.prompt_cap, ln.response_cap)
        + ln.judge_cap,
        "policy_max_num_seqs": group.policy.max_num_seqs or seqs,
        "genrm_max_num_seqs": genrm.max_num_seqs or seqs,
        "policy_memory_share": round(group.policy.mem_util * engine_share, 4),
        "genrm_memory_share": round(genrm.mem_util * engine_share, 4)}


@gin.configurable
def cluster_stream(group: ModelGroup = gin.REQUIRED, parquet: str | None = None,
                   seed: int = 0) -> PromptStream:
    """The prompt stream of a model group: its ``prompts_per_step``; ``parquet`` a
    DAPO-Math-17k file (None: the generated task)."""
    return PromptStream(prompts_per_step=group.prompts_per_step, parquet=parquet, seed=seed)


@gin.configurable
def cluster_costs(group: ModelGroup = gin.REQUIRED) -> PlannerCosts:
    """The planner's costs of a model group on real devices: each model's decode latency
    (A, B, C, D) is the one the simulator charges, from its ``ModelProfile`` (its
    ``Architecture`` on the H20 roofline, or its stand-in fit: ``pivot.spec.profile``), the
    GenRM's None where the group has none; the shift times are ``PlannerCosts``'. A fit of
    the group's own engines (``benchmarks/profile_engine.py``) replaces it with
    ``ClusterDriver.costs = @PlannerCosts()`` and ``PlannerCosts.throughput = (...)``."""
    def abcd(m) -> tuple[float, float, float, float]:
        tm = m.decode_model()
        return (tm.A, tm.B, tm.C, tm.D)
    return PlannerCosts(throughput=abcd(group.policy),
                        judge_throughput=abcd(group.genrm) if group.genrm else None)
