"""The rollout and reward roles' context in a device slot (sec. 5.2, 6), built once per slot.

- ``EngineCalls``: what the slot's engine endpoints (``pivot.runtime.slot.EngineEndpoints``)
  call on the active rollout or reward context: submit, abort (keeping the produced
  tokens, sec. 6.2), collect, poll, first_tokens, refresh and stats.
- ``SlotGeneratorContext``: the generator context (``pivot.roles.generator``) with those
  calls, and ``refresh`` (GPS Read of the newest policy, loaded without restarting the
  engine); a TP replica's rank Reads its own shard (``read_parameters``).
- ``GeneratorFactory``: builds it in the slot (core binding, a TP rank's torchrun
  variables); ``rendezvous_ports``: the TP blocks' rendezvous ports.

The training role's slot context is ``pivot.roles.trainer_context.SlotTrainerContext``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from pivot.errors import StateError
from pivot.gps.layout import ParallelLayout
from pivot.roles.engine.config import EngineConfig, read_hf_config
from pivot.roles.engine.requests import GenRequest, SeqResult
from pivot.roles.engine.shards import RankShards, ep_expert_owner, vllm_tp_split_dim
from pivot.roles.engine.tp import moe_experts
from pivot.roles.generator import GeneratorContext
from pivot.shifting.params import tensor_bytes
from pivot.types import Role

log = logging.getLogger(__name__)


@runtime_checkable
class EngineCalls(Protocol):
    """The calls a slot's engine endpoints make on its active rollout or reward context
    (``pivot.runtime.slot.EngineEndpoints``; the controller's ``EngineHandle``): what the
    shift-aware scheduler's actions need of a replica (sec. 6.2: dispatch, abort with the
    produced tokens kept, collect) and the policy refresh after a training Write (sec. 5.1).
    ``SlotGeneratorContext`` is the product's; tests' stand-ins
    (``pivot.testing.fleet.FakeEngine``) have the same calls."""

    def submit(self, reqs: list[GenRequest]) -> list[str | None]:
        """Starts ``reqs`` (a request with generated tokens resumes after a re-prefill);
        per request None, or why the engine refused it."""
        ...

    def abort(self, seq_ids: list[int]) -> dict[int, SeqResult]:
        """Stops ``seq_ids``; each one's tokens so far (``finish_reason`` "abort"), or its
        final result if it had finished."""
        ...

    def collect(self) -> dict[int, SeqResult]:
        """The sequences finished since the last ``collect`` or ``poll``."""
        ...

    def poll(self) -> tuple[dict[int, SeqResult], dict[int, int]]:
        """``collect`` and the running sequences' current lengths (one call)."""
        ...

    def first_tokens(self, seq_ids: list[int], timeout_s: float = 60.0) -> float:
        """Waits until every one of ``seq_ids`` has a new token (the re-prefill of resumed
        sequences); returns the seconds it took."""
        ...

    def refresh(self) -> dict[str, float]:
        """Reads the newest version of the role's model from GPS and loads it; phase ->
        seconds."""
        ...

    def stats(self) -> dict[str, Any]:
        """The engine's counters (running sequences, tokens, mean step seconds)."""
        ...


class SlotGeneratorContext(GeneratorContext):
    """Rollout or reward context over the slot's engine of its model (policy or GenRM);
    its ``EngineCalls`` are the slot's engine endpoints.

    Args:
        role: rollout or reward.
        cfg: the engine of the role's model (its own folder; ``ClusterStack`` builds one per
            model, so a slot holds two engines, one asleep).
        source: the GPS parameter source, for ``refresh``.
        device: this slot's device id.
    """

    def __init__(self, role: Role, cfg: EngineConfig, source: Any = None, device: int = 0):
        super().__init__(role, cfg)
        self.source, self.device = source, device
        self.follower_reads = 0
        self.read_bytes = 0   # of the last Read: a TP rank's own shard, else the model
        self._kv_heads: int | None = None
        self._experts = 0
        self._pin: contextlib.ExitStack | None = None   # rank 0's version, until loaded
        if self.is_follower and source is not None:
            # rank 0's loads name a GPS version; this rank Reads it from its own host
            self.loop.reader = self._read_ref

    def _read_ref(self, ref: tuple[str, int]) -> RankShards:
        model, version = ref
        if model != self.model:
            raise StateError(f"slot {self.device}: rank 0 loaded {model!r} into this "
                             f"{self.model!r} engine")
        state = self._read_rank(version)
        self.follower_reads += 1
        return state

    def _read_rank(self, version: int) -> RankShards:
        """This TP rank's own shard of the model at ``version``:
        the ranges its vLLM loaders read (``vllm_tp_split_dim``; under expert parallelism
        its own experts whole, ``ep_expert_owner``), about 1/k of the bytes."""
        k = self.cfg.tensor_parallel_size
        first = self.device - self.device % k
        meta = self.source.models[self.model]
        if self._kv_heads is None:
            hf = read_hf_config(self.cfg.model)[0]
            self._kv_heads = int(hf.get("num_key_value_heads", hf["num_attention_heads"]))
            self._experts = moe_experts(self.cfg.model)
        ep = self.cfg.expert_parallel
        split = functools.partial(vllm_tp_split_dim, tp=k, kv_heads=self._kv_heads,
                                  expert_parallel=ep)
        owner = functools.partial(ep_expert_owner, experts=self._experts, ep=k) if ep else None
        layout = ParallelLayout.create(meta, tp=k, split_dim=split, owner=owner)
        shards = self.source.read(self.model, tuple(range(first, first + k)), layout,
                                  only=(self.device,), version=version)[self.device]
        state = RankShards(shards, {p.name: tuple(p.shape) for p in meta.params},
                           dict(layout.split_dims), self.device - first, k, version)
        self.read_bytes = state.nbytes
        return state

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "follower_reads": self.follower_reads,
                "read_bytes": self.read_bytes}

    def read_parameters(self) -> Mapping[str, torch.Tensor]:
        """The shift up's GPS Read for this slot (``SlotActor.shift_up``): TP=1 a full
        copy of the latest version (one GPS call); a TP replica's rank 0 its own shard
        of the latest version, pinned, and its load then names that version to the
        other ranks, which Read their own shards of it; they Read nothing here. Rank 0
        holds that version's pin until they have (``load_parameters``)."""
        if self.is_follower:
            return {}
        if self.cfg.tensor_parallel_size == 1:
            state = self.source.read(self.model, (self.device,))[self.device]
            self.read_bytes = tensor_bytes(state.values())
            return state
        self._unpin()
        pin = contextlib.ExitStack()
        try:
            state = self._read_rank(pin.enter_context(self.source.pinned(self.model)))
        except BaseException:
            pin.close()
            raise
        self._pin = pin
        return state

    def _unpin(self) -> None:
        pin, self._pin = self._pin, None
        if pin is not None:
            pin.close()

    def load_parameters(self, state: Mapping[str, torch.Tensor]) -> None:
        if not isinstance(state, RankShards) or self.is_follower:
            return super().load_parameters(state)
        ref = (self.model, state.version)
        try:
            self.timings["load_weights"] = self.loop.call(
                lambda e: e.load_weights_at(state, ref))
        finally:   # every rank has Read the version (or failed to): it may be dropped
            self._unpin()
        self.holds_weights = True

    def submit(self, reqs: list[GenRequest]) -> list[str | None]:
        return self.loop.submit(reqs)

    def abort(self, seq_ids: list[int]) -> dict[int, SeqResult]:
        return self.loop.abort(seq_ids)

    def collect(self) -> dict[int, SeqResult]:
        return self.loop.collect()

    def poll(self) -> tuple[dict[int, SeqResult], dict[int, int]]:
        """Finished sequences and the running ones' current lengths (one call)."""
        return self.loop.poll()

    def first_tokens(self, seq_ids: list[int], timeout_s: float = 60.0) -> float:
        return self.loop.first_tokens(seq_ids, timeout_s)

    def refresh(self) -> dict[str, float]:
        """Reads the newest version of this role's model from GPS and loads it (the
        scheduler aborted this replica's sequences first; the engine refuses otherwise).
        A follower rank of a TP replica gets the weights in rank 0's mirrored load."""
        if self.is_follower:
            return {"gps_read_s": 0.0, "load_s": 0.0}
        t = time.perf_counter()
        state = self.read_parameters()
        t_read = time.perf_counter() - t
        self.load_parameters(state)
        return {"gps_read_s": t_read, "load_s": self.timings["load_weights"]}

    def stats(self) -> dict[str, Any]:
        st = self.loop.call(lambda e: e.stats())
        return {"running": st.running, "num_tokens": st.num_tokens,
                "generated_tokens": st.generated_tokens, "mean_step_s": st.mean_step_s}


@dataclass(frozen=True)
class GeneratorFactory:
    """Builds a slot's generator context; binds the slot's engines (policy and GenRM, one
    awake at a time) to core ``device % cores`` (the slot's device comes from
    ``PIVOT_SLOT_DEVICE``, set by ``SlotActor``), so two slots' engines never share a
    core's OpenMP threads (docs/stack.md).

    With ``cfg.tensor_parallel_size`` k above 1 the slot's engine is rank ``device % k``
    of the replica on the aligned block ``device // k`` (a process per role, so the
    slot's other engine keeps a world of its own): torchrun's variables are set here,
    before the engine starts, with the block's rendezvous at ``tp_ports[block]`` on this
    host (a block never spans hosts; ``rendezvous_ports``). Every rank of a block builds
    its engine at once (the slots are spawned together): the engine start is a collective.
    """

    role: Role
    cfg: EngineConfig
    source: Any
    cores: int
    tp_ports: tuple[int, ...] = ()

    def __call__(self) -> SlotGeneratorContext:
        import dataclasses
        import os

        device = int(os.environ.get("PIVOT_SLOT_DEVICE", "0"))
        cfg = dataclasses.replace(self.cfg, cpu_core=device % self.cores)
        k = cfg.tensor_parallel_size
        if k > 1:
            from pivot.roles.engine.tp import torchrun_env
            os.environ.update(torchrun_env(device % k, k, "127.0.0.1",
                                           self.tp_ports[device // k]))
        return SlotGeneratorContext(self.role, cfg, self.source, device)


def rendezvous_ports(tp: Mapping[str, int], device_host: Sequence[int],
                     free_on_host: Callable[[int, int], Sequence[int]]
                     ) -> dict[str, tuple[int, ...]]:
    """A rendezvous port for every TP block of every model: ``{model: ports[block]}``
    (none at TP 1). A block never spans hosts, so its ranks meet on its own host: each
    host is asked once (``free_on_host(host, n)``, e.g. its GPS actor's ``free_ports``)
    for the ports of all the blocks it holds, so two blocks of one host never share one.

    Args:
        tp: each model's replica size; ``len(device_host)`` must be a multiple of it.
        device_host: each device's host.
    """
    blocks = [(m, b, device_host[b * k]) for m, k in tp.items() if k > 1
              for b in range(len(device_host) // k)]
    hosts = sorted({h for _, _, h in blocks})
    free = {h: list(free_on_host(h, sum(1 for *_, x in blocks if x == h))) for h in hosts}
    out: dict[str, list[int]] = {m: [] for m in tp}
    for m, _, h in blocks:
        out[m].append(free[h].pop(0))
    return {m: tuple(p) for m, p in out.items()}
