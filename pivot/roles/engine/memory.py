"""Releasing an engine's KV cache and weights on a shift down, without sleep mode.

vLLM's sleep mode is not supported on CPU (``CPUWorker.sleep`` logs and frees nothing;
``discard`` raises). Both are released here by shrinking the underlying storages to zero
bytes (``UntypedStorage.resize_(0)``), the trick FSDP uses for unsharded parameters: the
tensor objects (and every view the attention layers and the model runner hold) survive,
so a shift up only resizes the storages back; the KV contents are garbage after that, so
the prefix cache must be reset. On the CPU backend linear weights are repacked into
oneDNN / sgl handles that live inside each layer's ``cpu_linear`` closure; releasing the
weights drops those closures (``reload_weights`` rebuilds them).

Sec. 5.2: KV cache is temporary context (discard / reallocate), weights are parameters
(discard / Read from GPS).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
from torch import nn

from pivot.errors import StateError


def _released_linear(*args, **kwargs):
    raise StateError("generator weights are released (shifted down); load parameters first")


@dataclass
class StorageSet:
    """Storages to release, with their original sizes (deduplicated by storage)."""

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
        """Reallocates every storage at its old size (contents undefined)."""
        if not self.released:
            return
        for s, n in self.storages:
            s.resize_(n)
        self.released = False


def kv_storages(model_runner) -> StorageSet:
    """The KV cache tensors of a vLLM CPU model runner."""
    return StorageSet.of(model_runner.kv_caches)


def weight_storages(model: nn.Module) -> StorageSet:
    """Every parameter storage with data (embedding, norms, unpacked weights)."""
    return StorageSet.of(p for _, p in model.named_parameters())


def drop_packed_linears(model: nn.Module) -> int:
    """Replaces each layer's ``cpu_linear`` closure (it holds the packed weight) with one
    that raises; returns how many were dropped."""
    n = 0
    for m in model.modules():
        if callable(getattr(m, "cpu_linear", None)) and m.cpu_linear is not _released_linear:
            m.cpu_linear = _released_linear
            n += 1
    return n


def repack_released_linears(model: nn.Module) -> int:
    """Rebuilds the packed linear of every layer ``drop_packed_linears`` left released and
    that the last ``reload_weights`` did not process; returns how many.

    Call it after ``drop_packed_linears`` + ``reload_weights``: vLLM's layerwise reload
    repacks a layer only when the checkpoint holds its weights. A
    tied ``lm_head`` (``tie_word_embeddings``: Qwen3 ties the head to ``embed_tokens``,
    and vLLM skips ``lm_head.weight``) gets no weights, so its old closure would stay: the
    released one raises on the first logits call, a live one serves the old head. Its weight is the
    embedding's parameter, which the reload refilled, so repacking it here serves the new
    weights. Sec. 5.2: parameters are Read back on a shift up, all of them.
    """
    n = 0
    for m in model.modules():
        if getattr(m, "cpu_linear", None) is not _released_linear:
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
        if m.cpu_linear is _released_linear:
            raise StateError(f"{type(m).__name__}: repacking left the linear released")
        n += 1
    return n


def tied_head_check(model: nn.Module) -> None:
    """Raises unless a tied ``lm_head`` still shares the embedding's storage."""
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


def process_rss(pid: int | str = "self") -> int:
    """Resident bytes of one process (``/proc/<pid>/statm``)."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def tree_pids(root: int) -> list[int]:
    """``root`` and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def tree_rss(root: int) -> tuple[int, dict[int, int]]:
    """Total resident bytes of ``root`` and its descendants, and the per-pid split."""
    per: dict[int, int] = {}
    for p in tree_pids(root):
        try:
            per[p] = process_rss(p)
        except OSError:
            continue
    return sum(per.values()), per
