"""The training role's context in a device slot (sec. 5.2, 8.1), built once per slot.

- ``TrainerCalls``: what the slot's trainer endpoints (``pivot.runtime.slot.TrainerEndpoints``)
  call on the active training context: the GRPO step and the AdamW state the driver
  keeps across moves of training (reset, fetch, which one a rank holds, restore).
- ``SlotTrainerContext``: the torchtitan ``Trainer`` (``pivot.roles.trainer``) as a role
  context: parameters are released and Read back from GPS, optimizer state and gradients
  offloaded and reloaded, the replica's process group preserved across shifts, and
  ``train_step`` runs forward_backward + optim_step on a ``TrainBatch``.

The rollout and reward roles' slot context is
``pivot.roles.engine.slot_context.SlotGeneratorContext``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from pivot.rl.batch import TrainBatch
from pivot.shifting.params import tensor_bytes
from pivot.shifting.role_shift import ContextCategory
from pivot.types import MODEL_OF_ROLE, Role


@runtime_checkable
class TrainerCalls(Protocol):
    """The calls a slot's trainer endpoints make on its active training context
    (``pivot.runtime.slot.TrainerEndpoints``; the controller's ``TrainerHandle``). Each is
    made on every slot of the training replica at once (its ranks of one FSDP2 group);
    the collective ones say so. ``SlotTrainerContext`` is the product's; the runtime
    tests' stand-in is ``pivot.testing.runtime.SlotTrainingContext``."""

    def train_step(self, batch: TrainBatch, version: int | None = None) -> dict[str, float]:
        """One GRPO update on ``batch`` at policy version ``version``; its metrics.
        Collective."""
        ...

    def reset_optimizer(self, tag: tuple | None = None) -> None:
        """Fresh AdamW state, standing for ``tag`` (run, version)."""
        ...

    def optimizer_state(self) -> dict:
        """The full AdamW state on rank 0, {} on the others. Collective."""
        ...

    def held_optimizer_tag(self) -> tuple | None:
        """(run, version) of the AdamW state this rank holds; None: none that is valid."""
        ...

    def set_optimizer_state(self, state: dict, tag: tuple | None = None) -> None:
        """Restores ``state`` (``optimizer_state``'s) before the next step, standing for
        ``tag``."""
        ...


@dataclass
class SlotTrainerContext:
    """Training context over the torchtitan trainer: this slot's rank of the training
    replica, FSDP2 over gloo across the replica's slots (sec. 5.2, 8.1); its
    ``TrainerCalls`` are the slot's trainer endpoints.

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

    # ---- TrainerCalls (SlotActor's trainer endpoints, every slot of the replica) --
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
