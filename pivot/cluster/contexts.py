"""Role contexts of the cluster driver's device slots (sec. 5.2), built once per slot.

- ``SlotGeneratorContext``: the generator context (``pivot.roles.generator``) plus the
  calls the driver makes through ``SlotActor.invoke`` on the active role: submit, abort,
  collect, first_tokens, and ``refresh`` (GPS Read of the newest policy, loaded without
  restarting the engine).
- ``SlotTrainerContext``: the torchtitan ``Trainer`` as a role context: parameters are
  released and Read back from GPS, optimizer state and gradients offloaded and reloaded,
  and ``train_step`` runs forward_backward + optim_step on a ``TrainBatch``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from pivot.errors import StateError
from pivot.gps.layout import ParallelLayout
from pivot.roles.engine.config import EngineConfig, read_hf_config
from pivot.roles.engine.requests import GenRequest, SeqResult
from pivot.roles.engine.shards import RankShards, ep_expert_owner, vllm_tp_split_dim
from pivot.roles.engine.tp import moe_experts
from pivot.roles.generator import GeneratorContext
from pivot.roles.titan.batch import TrainBatch
from pivot.shifting.params import tensor_bytes
from pivot.shifting.role_shift import ContextCategory
from pivot.types import MODEL_OF_ROLE, Role

log = logging.getLogger(__name__)


class SlotGeneratorContext(GeneratorContext):
    """Rollout or reward context over the slot's engine of its model (policy or GenRM).

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


@dataclass
class SlotTrainerContext:
    """Training context over the torchtitan trainer: this slot's rank of the training
    replica, FSDP2 over gloo across the replica's slots (sec. 5.2, 8.1).

    Attributes:
        model_dir: the policy's HF folder (architecture; weights come from GPS).
        lr: AdamW learning rate.
        max_seq_len: trainer RoPE length.
        seed: trainer seed (``lr``, ``max_seq_len`` and ``seed`` are the ``ClusterStack``'s,
            passed through: no defaults here).
        warmup_rows / warmup_len: shape of the throwaway GRPO step run at build time (0
            rows: none). A slot's first step otherwise cost 2.5-3x the CPU of later ones
            (1.4-1.7 s against 0.55 s in `local_experiments.py throughput`), paid by
            whichever deployment first trained on that slot.

    Shift up joins the replica's group (``join``, before the GPS Read): the same group as
    last time is preserved context and kept; another set of slots gets a new gloo group,
    and if the sharding changes (another rank or size) the model and AdamW are rebuilt for
    it, so the offloaded optimizer shards no longer apply: the driver then sends the full
    state (``set_optimizer_state``), which each rank cuts to its shard. ``optimizer_tag``
    says which state a rank holds, so the driver sends only when some rank lacks it.
    """

    model_dir: str
    lr: float
    max_seq_len: int
    seed: int
    warmup_rows: int = 128
    warmup_len: int = 96
    device: str = "cpu"
    """``Backend.device_type``: the slot's CPU, or its one visible GPU."""
    precision: str = "fp32"
    """``Backend.precision`` (``Trainer.Config.precision``)."""
    dist: str = "gloo"
    """``Backend.dist``: the training replica's process group backend."""
    timings: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        import os

        from pivot.roles.trainer import Trainer

        self.role = Role.TRAINING
        self.model = MODEL_OF_ROLE[Role.TRAINING]
        self.slot = int(os.environ.get("PIVOT_SLOT_DEVICE", "0"))  # set by SlotActor
        cfg = Trainer.Config(model=self.model_dir, max_seq_len=self.max_seq_len,
                             seed=self.seed, optimizer=Trainer.Optimizer(lr=self.lr),
                             device=self.device, precision=self.precision)
        self.trainer = Trainer(cfg)
        self.trainer.setup()
        if self.warmup_rows > 0:
            self.timings["warmup_s"] = self._warmup()
        self.trainer.release_parameters()
        self.names: tuple[str, ...] | None = None
        self.loaded = False
        self.last_read: str | None = None
        """How the last GPS Read came: ``full`` tensors or this rank's ``rows``."""
        self.read_bytes = 0
        self.group: Any = None
        """``pivot.roles.titan.group.JoinedGroup`` of the current training replica."""
        self.optimizer_tag: tuple | None = None
        """(run, version) of the AdamW state this rank holds: the state after ``version``
        updates of that run; None when it holds none that is valid (rebuilt)."""
        self._pending_opt: tuple[dict, tuple] | None = None

    def _warmup(self) -> float:
        """One GRPO step on random tokens with the build-time random weights, then fresh
        AdamW state and version 0: nothing of it survives but the warm allocator and
        kernels (the weights are released next and Read from GPS on a shift up)."""
        t = time.perf_counter()
        g = torch.Generator().manual_seed(self.seed)
        rows, length = self.warmup_rows, min(self.warmup_len, self.max_seq_len)
        vocab = self.trainer.shape.vocab_size
        mask = torch.zeros(rows, length)
        mask[:, length // 3:] = 1
        batch = TrainBatch(torch.randint(0, vocab, (rows, length), generator=g), mask,
                           torch.randn(rows, generator=g))
        self.trainer.forward_backward(batch)
        self.trainer.optim_step()
        self.trainer.optimizer.state.clear()
        self.trainer.version = 0
        return time.perf_counter() - t

    # ---- the training replica's group (shift up, before the GPS Read) -------------
    def join(self, spec: Any) -> dict[str, float]:
        """Joins the replica's group ``spec`` (``pivot.roles.titan.group.GroupSpec``);
        collective: every slot of ``spec.devices`` calls it at the same time. Returns
        phase -> seconds (``join_group``, and ``rebuild_model`` when the sharding
        changed)."""
        from pivot.roles.titan.group import JoinedGroup

        t = time.perf_counter()
        old = self.group
        if old is not None and old.spec.key == spec.key:
            return {"join_group": 0.0}   # preserved: the same slots as last time
        new = JoinedGroup.join(spec, self.slot, backend=self.dist)
        phases = {"join_group": time.perf_counter() - t}
        if old is not None:
            old.close()
        self.group = new
        if new.pg is not None or self.trainer.world_size > 1:
            t = time.perf_counter()
            self.trainer.setup(new.pg, new.mesh)   # shards for this rank of this group
            self.trainer.release_parameters()      # the GPS Read that follows fills them
            self.loaded, self.optimizer_tag = False, None
            phases["rebuild_model"] = time.perf_counter() - t
        return phases

    # ---- RoleContext -------------------------------------------------------------
    def discard(self, category: ContextCategory) -> None:
        if category is ContextCategory.PARAMETERS:
            self.trainer.release_parameters()
            self.loaded = False

    def offload(self, category: ContextCategory) -> None:
        self.trainer.offload()

    def reload(self, category: ContextCategory) -> None:
        self.trainer.reload()

    def reallocate(self, category: ContextCategory) -> None:
        """Activations are rebuilt by the next forward pass."""

    def load_parameters(self, state: Mapping[str, torch.Tensor]) -> None:
        """Loads a GPS Read: full tensors, or this rank's dim-0 chunk of each (the Read
        under ``FsdpShardLayouts``), whose rows fill the rank's FSDP2 shards."""
        from pivot.roles.titan.hf_shards import ChunkRows, hf_shapes

        self.names = tuple(state)
        full = hf_shapes(self.trainer.model, self.trainer.adapter)
        if all(tuple(t.shape) == full.get(k) for k, t in state.items()):
            self.timings.update(self.trainer.load_hf_state_dict(state))
            self.last_read = "full"
        else:
            rank, world = self.trainer.rank, self.trainer.world_size
            self.timings.update(self.trainer.load_hf_rows(ChunkRows(state, full, rank, world)))
            self.last_read = "rows"
        self.read_bytes = tensor_bytes(state.values())
        self.loaded = True

    @property
    def weights(self) -> dict[str, torch.Tensor]:
        """HF-named tensors under GPS's names (for ``SlotActor.write_back``, the Write
        when the ranks' rows do not line up with ``FsdpShardLayouts``): full tensors on
        rank 0, {} on the other ranks. Collective across the replica's slots."""
        if not self.loaded:
            return {}
        sd = self.trainer.state_dict_hf()
        if self.trainer.rank != 0:
            return {}
        return {k: sd[k] for k in (self.names or sd)}

    def weight_chunk(self) -> dict[str, torch.Tensor]:
        """This rank's dim-0 chunk of every HF tensor, from its own FSDP2 shards (no
        collective): its part of a Write under ``FsdpShardLayouts``."""
        from pivot.roles.titan.hf_shards import chunk_of, hf_shapes

        full = hf_shapes(self.trainer.model, self.trainer.adapter)
        return chunk_of(self.trainer.hf_shards(), full, self.trainer.rank,
                        self.trainer.world_size)

    def describe(self) -> dict[str, Any]:
        g = self.group
        return {"kv_capacity": 0, "loaded": self.loaded,
                "last_read": self.last_read, "read_bytes": self.read_bytes,
                "group": None if g is None else {"key": g.spec.key, "rank": g.rank,
                                                 "devices": list(g.spec.devices)},
                "items": self.trainer.context_items()}

    # ---- training calls (SlotActor.invoke, on every slot of the replica) ----------
    def train_step(self, batch: TrainBatch, version: int | None = None) -> dict[str, float]:
        """One GRPO update: forward_backward on the whole batch (each rank trains on its
        rows), then optim_step. Collective across the replica's slots.

        ``version``: the policy version being trained (the loop's); training moves between
        slots, so a slot's own counter would drift from it."""
        if version is not None:
            self.trainer.version = version
        if self._pending_opt is not None:
            state, tag = self._pending_opt
            self._pending_opt = None
            self.timings.update(self.trainer.load_optimizer_state(state))
            self.optimizer_tag = tag
        t, cpu = time.perf_counter(), time.thread_time()
        out = self.trainer.forward_backward(batch)
        out.update(self.trainer.optim_step())
        # in-slot wall and CPU seconds: wall >> CPU means the slot waited for its quota or
        # for the cores, not for compute
        out["trainer/compute_s"] = time.perf_counter() - t
        out["trainer/thread_cpu_s"] = time.thread_time() - cpu
        out["trainer/world_size"] = float(self.trainer.world_size)
        if self.optimizer_tag is not None:
            self.optimizer_tag = (self.optimizer_tag[0], self.trainer.version)
        return out

    def reset_optimizer(self, tag: tuple | None = None) -> None:
        """Fresh AdamW moments and step counts (a new run on a reused slot); ``tag``:
        (run, version) the fresh state stands for."""
        self._pending_opt = None
        self.trainer.optimizer.state.clear()
        self.optimizer_tag = tag

    def optimizer_state(self) -> dict:
        """AdamW state by parameter name, full tensors (``titan.optim_state``), on rank 0;
        {} on the others. Collective across the replica's slots."""
        state = self.trainer.full_optimizer_state()
        return state if self.trainer.rank == 0 else {}

    def held_optimizer_tag(self) -> tuple | None:
        """``optimizer_tag`` (for the driver: does this rank hold the latest state?)."""
        return self.optimizer_tag

    def set_optimizer_state(self, state: dict, tag: tuple | None = None) -> None:
        """Restores AdamW state (``optimizer_state``'s, from any slots) before the next
        step; this rank keeps its shard. ``tag``: (run, version) of that state."""
        self._pending_opt = (state, tag)


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
