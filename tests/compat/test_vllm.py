"""``pivot.compat.vllm`` against the installed vLLM: the version it was written for, every
private name, attribute path and environment knob its shims rely on, and one cheap
functional check per shim (no engine is started)."""

import dataclasses
import importlib.metadata
import inspect
import subprocess
import sys

import pytest
import torch

from pivot.compat import vllm as vc
from pivot.errors import StateError

RECHECK = ("re-check every shim of pivot/compat/vllm.py (set_process_env, llm_engine_class, "
           "in_process_core, driver_worker, served_model, reload_weights, scheduler_load, "
           "StorageSet / kv_storages / weight_storages, drop_packed_linears, "
           "repack_released_linears, tied_head_check) and update WRITTEN_FOR")


def test_installed_vllm_is_the_one_the_shims_were_written_for():
    got = importlib.metadata.version(vc.DIST)
    assert got == vc.VERSION, f"{vc.DIST} {got} installed, shims written for " \
                              f"{vc.WRITTEN_FOR}: {RECHECK}"


def test_importing_the_compat_module_does_not_import_vllm():
    code = "import sys, pivot.compat.vllm; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_environment_knobs_exist_and_mean_what_set_process_env_assumes(monkeypatch, tmp_path):
    from vllm import envs

    missing = [k for k in vc.ENV_KNOBS if k not in envs.environment_variables]
    assert not missing, f"vLLM no longer reads {missing}: re-check set_process_env"
    for k in (*vc.ENV_KNOBS, "TMPDIR", "TORCHINDUCTOR_CACHE_DIR"):
        monkeypatch.delenv(k, raising=False)
    vc.set_process_env(tmp_path, 1)
    read = {k: envs.environment_variables[k]() for k in vc.ENV_KNOBS}
    assert read[vc.ENV_IN_PROCESS] is False, "VLLM_ENABLE_V1_MULTIPROCESSING=0 no longer " \
                                             "means in-process"
    assert read[vc.ENV_KV_SPACE] == 1, "VLLM_CPU_KVCACHE_SPACE is no longer whole GiB"
    assert read[vc.ENV_OMP_BIND] == "1"
    assert read[vc.ENV_CACHE_ROOT] == str(tmp_path / "vllm")


def test_engine_args_take_every_field_the_engine_passes():
    from vllm import EngineArgs

    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    used = {"model", "dtype", "block_size", "max_model_len", "max_num_seqs",
            "num_gpu_blocks_override", "enforce_eager", "enable_prefix_caching",
            "disable_log_stats", "seed", "gpu_memory_utilization"}
    assert used <= fields, f"EngineArgs lost {sorted(used - fields)}: re-check VllmEngine"


def test_in_process_engine_attribute_paths_still_exist():
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core_client import InprocClient
    from vllm.v1.executor.uniproc_executor import UniProcExecutor
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    engine = vc.llm_engine_class()
    for name in ("from_engine_args", "add_request", "abort_request", "step",
                 "has_unfinished_requests", "reset_prefix_cache"):
        assert callable(getattr(engine, name, None)), f"LLMEngine.{name} is gone: {RECHECK}"
    init = inspect.getsource(engine.__init__)
    assert "self.engine_core =" in init and "self.model_executor" in init, \
        "LLMEngine no longer holds engine_core / model_executor: re-check in_process_core, " \
        "driver_worker"
    assert "self.engine_core = EngineCore(" in inspect.getsource(InprocClient.__init__), \
        "InprocClient.engine_core is no longer the EngineCore: re-check in_process_core"
    assert "self.driver_worker = WorkerWrapperBase" in inspect.getsource(UniProcExecutor), \
        "UniProcExecutor.driver_worker changed: re-check driver_worker"
    assert "worker" in inspect.get_annotations(WorkerWrapperBase.__init__) or \
        "self.worker" in inspect.getsource(WorkerWrapperBase), "re-check driver_worker"
    sched = inspect.getsource(Scheduler.__init__)
    for attr in ("self.running", "self.waiting", "self.kv_cache_manager"):
        assert attr in sched, f"Scheduler no longer sets {attr}: re-check scheduler_load"
    assert isinstance(inspect.getattr_static(KVCacheManager, "usage"), property), \
        "KVCacheManager.usage is no longer a property: re-check scheduler_load"


def test_worker_and_model_runner_still_offer_reload_and_kv_caches():
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.cpu_worker import CPUWorker
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    assert callable(getattr(CPUWorker, "reload_weights", None)), "re-check reload_weights"
    params = inspect.signature(GPUModelRunner.reload_weights).parameters
    assert "weights_iterator" in params, "reload_weights(weights_iterator=) is gone: " \
                                         "re-check reload_weights"
    assert issubclass(CPUModelRunner, GPUModelRunner)
    assert callable(getattr(CPUModelRunner, "get_model", None)), "re-check served_model"
    assert "self.kv_caches" in inspect.getsource(GPUModelRunner.__init__), \
        "the model runner has no kv_caches list: re-check kv_storages"


def test_sleep_mode_still_frees_nothing_on_cpu():
    """The storage release exists because CPU sleep is a no-op; if it ever frees memory,
    StorageSet / drop_packed_linears may be replaced by ``llm.sleep``."""
    from vllm.v1.worker.cpu_worker import CPUWorker

    src = inspect.getsource(CPUWorker.sleep)
    assert "not supported" in src, "CPUWorker.sleep changed: vLLM may now support sleep " \
                                   "on CPU; re-check StorageSet and the linear shims"


def test_platform_device_type_is_cpu_and_the_sleep_api_the_gpu_memory_calls_exists():
    """``platform_device_type`` picks the engine's ``EngineMemory``; ``VllmSleepMemory``
    (GPU) calls ``LLMEngine.sleep(level=...)``, ``wake_up(tags=...)`` and takes
    ``EngineArgs(enable_sleep_mode=...)``."""
    from vllm import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    assert vc.platform_device_type() == "cpu"
    assert "level" in inspect.signature(LLMEngine.sleep).parameters
    assert "tags" in inspect.signature(LLMEngine.wake_up).parameters
    assert "enable_sleep_mode" in {f.name for f in dataclasses.fields(EngineArgs)}


def test_storage_set_restore_is_zero_filled_even_from_a_poisoned_heap():
    """A re-allocated KV storage once served stale heap bytes: ``resize_`` hands back
    whatever the heap holds; ``restore`` must clear it (a NaN in a masked KV slot turns
    the logits NaN)."""
    from pivot.testing.engine import poisoned_heap

    t = torch.ones(1 << 16)  # 256 KiB: a heap chunk, below glibc's mmap threshold
    ss = vc.StorageSet.of([t])
    ss.release()
    with poisoned_heap():
        probe = torch.empty(1 << 16)
        assert torch.isnan(probe).all(), "poisoned_heap did not poison: the test is void"
        del probe
        ss.restore()
    assert t.eq(0).all()


def test_storage_set_release_and_restore_keep_tensors_and_views():
    lin = torch.nn.Linear(16, 8)
    view = lin.weight[:2]
    ss = vc.StorageSet.of([lin.weight, lin.bias, view])
    assert len(ss.storages) == 2 and ss.nbytes == (16 * 8 + 8) * 4
    assert ss.release() == ss.nbytes and ss.release() == 0
    assert lin.weight.untyped_storage().nbytes() == 0
    ss.restore()
    assert lin.weight.untyped_storage().nbytes() == 16 * 8 * 4
    with torch.no_grad():
        lin.weight.fill_(2.0)
    assert torch.equal(view, torch.full((2, 16), 2.0))  # the view sees the new storage
    assert len(vc.weight_storages(lin).storages) == 2


def test_kv_storages_reads_the_runner_kv_caches():
    class Runner:
        kv_caches = [torch.zeros(4, 8), torch.zeros(2, 8)]

    assert vc.kv_storages(Runner()).nbytes == 6 * 8 * 4


def _layer(quant_method):
    m = torch.nn.Module()
    m.weight = torch.nn.Parameter(torch.randn(32, 64), requires_grad=False)
    m.quant_method = quant_method
    quant_method.process_weights_after_loading(m)
    return m


def test_cpu_linear_closures_drop_and_repack_serve_the_new_weights():
    from vllm.model_executor.layers.utils import (cpu_unquantized_gemm,
                                                  dispatch_cpu_unquantized_gemm)
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        UnquantizedEmbeddingMethod)

    params = list(inspect.signature(dispatch_cpu_unquantized_gemm).parameters)
    assert params == ["layer", "remove_weight"], f"{params}: re-check repack_released_linears"
    head = _layer(UnquantizedEmbeddingMethod())  # the tied lm_head's method keeps its weight
    assert callable(head.cpu_linear), "process_weights_after_loading set no cpu_linear: " \
                                      "re-check drop_packed_linears"
    model = torch.nn.Sequential(head)
    x = torch.randn(3, 64)
    assert torch.allclose(cpu_unquantized_gemm(head, x, head.weight), x @ head.weight.T,
                          atol=1e-5)
    assert vc.drop_packed_linears(model) == 1 and vc.drop_packed_linears(model) == 0
    with pytest.raises(StateError):
        cpu_unquantized_gemm(head, x, head.weight)
    with torch.no_grad():
        head.weight.mul_(-1.0)  # the reload refilled the (tied) weight in place
    assert vc.repack_released_linears(model) == 1
    assert torch.allclose(cpu_unquantized_gemm(head, x, head.weight), x @ head.weight.T,
                          atol=1e-5), "the repacked closure serves stale weights"


def test_a_linear_method_packs_its_weight_away():
    """Linear layers (not the head) keep no weight once packed: the closure holds it, which
    is why dropping the closure frees it."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    lin = _layer(UnquantizedLinearMethod())
    assert lin.weight.numel() == 0 and callable(lin.cpu_linear)
    assert vc.drop_packed_linears(lin) == 1
    with pytest.raises(StateError, match="no weight to repack"):
        vc.repack_released_linears(lin)  # a linear the reload skipped cannot be rebuilt


def test_tied_head_check_sees_a_broken_tie():
    class Inner(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = torch.nn.Embedding(8, 4)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Inner()
            self.lm_head = torch.nn.Linear(4, 8, bias=False)
            self.lm_head.weight = self.model.embed_tokens.weight
            self.config = type("C", (), {"tie_word_embeddings": True})()

    m = Model()
    vc.tied_head_check(m)
    m.lm_head.weight = torch.nn.Parameter(torch.zeros(8, 4))
    with pytest.raises(StateError, match="tied lm_head"):
        vc.tied_head_check(m)


def test_kernel_registration_scan_survives_numba():
    """vLLM's kernel rebinding scan trips over llvmlite's ffi.lib once numba is loaded;
    the shim hides it from the scan (the scan itself runs, on a kernel nobody holds)."""
    import llvmlite.binding.ffi as ffi
    import numba  # noqa: F401  (loads llvmlite's library wrapper)
    from vllm.triton_utils import dispatcher

    assert hasattr(ffi.lib, "__dict__"), "llvmlite's ffi.lib changed: re-check the shim"
    with pytest.raises(AttributeError):
        vars(ffi.lib).get("kernel")
    vc.scan_safe_kernel_registration()
    vc.scan_safe_kernel_registration()   # idempotent
    assert dispatcher._rebind_kernels._pivot_scan_safe
    dispatcher._rebind_kernels([(object(), object())])   # scans sys.modules, no error
    assert "llvmlite.binding.ffi" in sys.modules


def test_kernel_registration_scan_survives_flask_context_proxies():
    """torchmonarch imports Flask, whose ``current_app`` proxy raises RuntimeError from
    ``hasattr`` outside an app context: every engine start in a process that had
    imported it failed (CI, 13 errors). The shim hides such modules from the scan."""
    import flask
    from vllm.triton_utils import dispatcher

    with pytest.raises(RuntimeError, match="application context"):
        hasattr(flask.current_app, "__dict__")
    vc.scan_safe_kernel_registration()
    dispatcher._rebind_kernels([(object(), object())])   # scans sys.modules, no error
    assert sys.modules["flask"] is flask


def test_two_tp_replicas_on_one_machine_get_their_own_cpu_shm_segment(monkeypatch):
    """Under ``external_launcher`` vLLM's ident is ``//`` for every replica, so the CPU
    communicator's segment names of two replicas with the same ranks collide
    (tests/roles/test_tp_external_launcher.py ran into it); the shim puts the replica's
    rendezvous port in the ident's place, as a ``tcp://`` init would."""
    from types import SimpleNamespace

    from vllm.distributed.device_communicators.cpu_communicator import _CPUSHMDistributed

    comm = SimpleNamespace(unique_name="tp:0", ranks=[0, 1])
    monkeypatch.setenv("VLLM_DIST_IDENT", "//")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    plain = _CPUSHMDistributed.make_group_name(comm)
    assert plain == "//-tp:0-[0-1]-cpushm"     # vLLM's own rule: no replica in it
    # monkeypatch records vLLM's own method, so the shim's patch is undone afterwards
    monkeypatch.setattr(_CPUSHMDistributed, "make_group_name",
                        _CPUSHMDistributed.__dict__["make_group_name"])
    vc.replica_unique_cpu_shm()
    vc.replica_unique_cpu_shm()                # idempotent
    first = _CPUSHMDistributed.make_group_name(comm)
    monkeypatch.setenv("MASTER_PORT", "29501")
    second = _CPUSHMDistributed.make_group_name(comm)
    assert first == "29500-tp:0-[0-1]-cpushm" and second == "29501-tp:0-[0-1]-cpushm"
    monkeypatch.setenv("VLLM_DIST_IDENT", "12345")   # a tcp:// init: left alone
    assert _CPUSHMDistributed.make_group_name(comm) == "12345-tp:0-[0-1]-cpushm"


def test_a_dead_replicas_segment_on_a_reused_port_is_removed_before_creation(
        monkeypatch, tmp_path):
    # a killed rank leaves "<port>-tp:0-[0-1]-cpushm_<rank>"; a later replica on the same
    # port failed with "create shm in SHMManager failed. errno: 17"
    from types import SimpleNamespace

    from vllm.distributed.device_communicators.cpu_communicator import _CPUSHMDistributed

    name = "29507-tp:0-[0-1]-cpushm"
    for r in (0, 1):
        (tmp_path / f"{name}_{r}").write_bytes(b"stale")
    assert vc.stale_cpu_shm(name, 1, root=str(tmp_path))
    assert not vc.stale_cpu_shm(name, 1, root=str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{name}_0"]   # rank 0's own
    # the shim calls it for the rank's own segment, and only for a port-named one
    seen = []
    monkeypatch.setattr(_CPUSHMDistributed, "_init_cpu_shm", lambda self: 7)
    monkeypatch.setattr(_CPUSHMDistributed, "make_group_name",
                        _CPUSHMDistributed.__dict__["make_group_name"])
    monkeypatch.setattr(vc, "stale_cpu_shm", lambda n, r, root="/dev/shm": seen.append((n, r)))
    vc.replica_unique_cpu_shm()
    monkeypatch.setenv("MASTER_PORT", "29507")
    shm = object.__new__(_CPUSHMDistributed)
    shm.communicator = SimpleNamespace(rank=1)
    for shm.group_name in (name, "//-tp:0-[0-1]-cpushm"):
        assert shm._init_cpu_shm() == 7
    assert seen == [(name, 1)]


def test_a_stacks_tp_segments_are_removed_by_their_ports_only(tmp_path):
    # what ClusterStack.close removes after its slots stopped: its TP blocks' segments
    # (4 MB a rank each); another stack's, and anything not vLLM's, stay
    mine = ["29507-tp:0-[0-1]-cpushm_0", "29507-tp:0-[0-1]-cpushm_1",
            "29508-tp:0-[0-1]-cpushm_0"]
    others = ["29509-tp:0-[0-1]-cpushm_0", "295070-tp:0-[0-1]-cpushm_0",
              "29507-gps-policy"]
    for n in mine + others:
        (tmp_path / n).write_bytes(b"x")
    assert vc.remove_cpu_shm([29507, 29508], root=str(tmp_path)) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(others)
    assert vc.remove_cpu_shm([], root=str(tmp_path)) == 0
    assert vc.remove_cpu_shm([1], root=str(tmp_path / "missing")) == 0
